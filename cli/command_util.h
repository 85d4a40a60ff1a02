// Helpers the `dgca` commands share (cli/commands.cc, cli/follow.cc,
// cli/diagnose_commands.cc). Private to cli/.
#ifndef DGCA_CLI_COMMAND_UTIL_H_
#define DGCA_CLI_COMMAND_UTIL_H_

#include <map>
#include <string>

#include "cli/client.h"
#include "cli/commands.h"
#include "dgca/v1/job.pb.h"

namespace dgca {
namespace cli {

// Prints every spec problem (file:line:column: field: message) and a count;
// returns kExitUsage.
int PrintProblems(Io io, const std::string& spec_path,
                  const google::protobuf::RepeatedPtrField<v1::SpecProblem>& problems);

// Sends a SubmitJobRequest (built from `spec_path`, or from a stored job's
// spec by resubmit) and reports it as `dgca submit` does: problems with
// their places (exit 2), else the job id on stdout and "submitted job J
// (NAME)" + `note` on stderr, then, with `wait`, follows the job.
int SendSubmit(const GlobalOptions& g, Io io, Client* client, const v1::SubmitJobRequest& req,
               const std::string& spec_path, bool wait, const std::string& note);

// "[HH:MM:SS] STATE  kind: message".
std::string EventLine(const v1::JobEvent& e);

// The job's evaluation metrics, sorted by name.
std::map<std::string, double> EvalOf(const v1::Job& j);

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_COMMAND_UTIL_H_
