// Commands on jobs that have ended: `dgca resubmit JOB [--wait]`, the job's
// spec again as a new job (the YAML the coordinator stored for JOB, with the
// file name and base directory it was submitted with, so relative paths and
// messages read as they did); `dgca delete JOB...`, the job's record and
// files gone.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/command_util.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace cli {

int CmdResubmit(const GlobalOptions& g, Io io, const std::string& job_id, bool wait) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  absl::StatusOr<v1::GetJobResponse> got = (*client)->GetJob(job_id);
  if (!got.ok()) return ReportError(io.err, g, got.status());
  const v1::GetJobResponse& old = *got;
  if (old.job().spec_yaml().empty()) {
    return ReportError(io.err, g,
                       absl::FailedPreconditionError(absl::StrCat(
                           "job ", job_id, " has no stored spec to submit again (submit its file)")));
  }
  const v1::JobSpec& spec = old.job().spec();
  const std::string spec_path =
      spec.source_path().empty() ? absl::StrCat("spec of job ", job_id) : spec.source_path();
  v1::SubmitJobRequest req;
  req.set_spec_yaml(old.job().spec_yaml());
  req.set_spec_path(spec_path);
  req.set_base_dir(spec.base_dir());
  // The coordinator may refuse what it once took (a data file gone since,
  // a field a newer version checks): said as a submit says it.
  return SendSubmit(g, io, client->get(), req, spec_path, wait,
                    absl::StrCat(": job ", job_id, "'s spec again"));
}

int CmdDelete(const GlobalOptions& g, Io io, const std::vector<std::string>& job_ids) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  // Each job on its own: one that cannot be deleted (active, unknown) is
  // said, and the others are still deleted; the exit code is the last
  // failure's.
  int rc = kExitOk;
  for (const std::string& id : job_ids) {
    v1::DeleteJobRequest req;
    req.set_job_id(id);
    v1::DeleteJobResponse resp;
    auto ctx = (*client)->Context(std::chrono::seconds(60));
    grpc::Status s = (*client)->stub()->DeleteJob(ctx.get(), req, &resp);
    if (!s.ok()) {
      rc = ReportError(io.err, g, FromGrpc(s));
      continue;
    }
    io.out << "deleted job " << id << " (" << StateName(resp.job().state()) << "): its record and "
           << "events"
           << (resp.removed_dir().empty()
                   ? std::string("; no files of it on the coordinator's node")
                   : absl::StrFormat(", and %s (%.1f MiB)", resp.removed_dir(),
                                     resp.removed_bytes() / double(1 << 20)))
           << "\n";
  }
  return rc;
}

}  // namespace cli
}  // namespace dgca
