#include "cli/client.h"

#include "absl/strings/str_cat.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace cli {

int ExitCodeFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:  // a token of another role
      return kExitUnreachable;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

int ReportError(std::ostream& err, const GlobalOptions& g, const absl::Status& s) {
  err << "error: " << s.message() << "\n";
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      err << "hint: is dgca-coordinator running at " << g.coordinator
          << "? (--coordinator / DGCA_COORDINATOR)\n";
      break;
    case absl::StatusCode::kUnauthenticated:
      err << "hint: the token must match the coordinator's STATE_DIR/token (--token-file / "
             "DGCA_TOKEN_FILE; now "
          << g.token_file << ")\n";
      break;
    case absl::StatusCode::kPermissionDenied:
      err << "hint: dgca takes the user token, the coordinator's STATE_DIR/token, not its "
             "agent-token or a rank's (--token-file / DGCA_TOKEN_FILE; now "
          << g.token_file << ")\n";
      break;
    default:
      break;
  }
  return ExitCodeFor(s);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const GlobalOptions& g) {
  // A malformed address is a usage error; unchecked, a port out of range
  // wraps (99999 -> 34463) and a missing one becomes port 0.
  if (absl::Status st = CheckHostPort(g.coordinator, 1, /*allow_empty_host=*/false,
                                      /*allow_unix=*/true);
      !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator (or DGCA_COORDINATOR) ", st.message()));
  }
  // An unreadable CA is said now (exit 2), not as a handshake failure later.
  if (!g.tls_ca_file.empty()) {
    if (auto ca = ReadTlsCaFile(g.tls_ca_file); !ca.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(ca.status().message(), " (--tls-ca / DGCA_TLS_CA)"));
    }
  }
  auto token = ReadTokenFile(g.token_file);
  // A directory or an oversized file is bad input (exit 2), not a missing
  // or wrong token.
  if (!token.ok() && token.status().code() == absl::StatusCode::kFailedPrecondition) {
    return absl::InvalidArgumentError(
        absl::StrCat(token.status().message(), " (--token-file / DGCA_TOKEN_FILE)"));
  }
  if (!token.ok()) {
    return absl::UnauthenticatedError(absl::StrCat(token.status().message(),
                                                   " (the coordinator writes it to "
                                                   "STATE_DIR/token at its first start)"));
  }
  auto c = std::unique_ptr<Client>(new Client());
  c->channel_ = MakeChannel(g.coordinator, g.tls_ca_file);
  c->stub_ = v1::Coordinator::NewStub(c->channel_);
  c->token_ = *token;
  return c;
}

std::unique_ptr<grpc::ClientContext> Client::Context(std::chrono::milliseconds deadline) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  AddAuth(ctx.get(), token_);
  if (deadline.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + deadline);
  return ctx;
}

absl::StatusOr<v1::GetJobResponse> Client::GetJob(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  auto ctx = Context();
  grpc::Status s = stub_->GetJob(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpc(s);
  return resp;
}

}  // namespace cli
}  // namespace dgca
