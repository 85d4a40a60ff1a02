// The CLI's connection to the coordinator: channel, bearer token, deadlines,
// and the mapping from RPC failures to the exit codes of
// model/core/exit_codes.h (0 ok, 1 job failed/cancelled, 2 bad usage or invalid spec,
// 3 cannot reach or authenticate).
//
// Thread-safety: Client is thread-safe after Connect (stubs are).
#ifndef DGCA_CLI_CLIENT_H_
#define DGCA_CLI_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dgca/v1/coordinator.grpc.pb.h"
#include "model/core/exit_codes.h"

namespace dgca {
namespace cli {

struct GlobalOptions {
  std::string coordinator;    // host:port
  std::string token_file;
  std::string tls_ca_file;    // "" = plaintext
};

// The exit code for a failed RPC: UNAVAILABLE, DEADLINE_EXCEEDED,
// UNAUTHENTICATED and PERMISSION_DENIED (a token of another role; and a
// missing token file) -> 3; INVALID_ARGUMENT,
// NOT_FOUND, FAILED_PRECONDITION, ALREADY_EXISTS -> 2; anything else -> 1.
int ExitCodeFor(const absl::Status& s);

// Prints "error: ..." with a hint for the common cases and returns
// ExitCodeFor(s).
int ReportError(std::ostream& err, const GlobalOptions& g, const absl::Status& s);

class Client {
 public:
  // Checks g.coordinator (HOST:PORT with PORT 1..65535, or unix:PATH) and
  // reads the token file. A bad address, or a token file that is a
  // directory or larger than kMaxTokenFileBytes: INVALID_ARGUMENT (exit 2);
  // other token file errors are UNAUTHENTICATED (so they map to exit 3).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const GlobalOptions& g);

  v1::Coordinator::Stub* stub() { return stub_.get(); }
  // A context with the token and, when > 0, a deadline.
  std::unique_ptr<grpc::ClientContext> Context(
      std::chrono::milliseconds deadline = std::chrono::seconds(15)) const;
  // GetJob of `job_id` (15 s deadline); a failed call's status as absl's.
  absl::StatusOr<v1::GetJobResponse> GetJob(const std::string& job_id);

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::string token_;
};

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_CLIENT_H_
