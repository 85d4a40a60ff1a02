#include "proto/rpc/rpc_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace dgca {

absl::Status ToAbsl(const Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.code())), s.message());
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())),
                      std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())),
                      s.error_message());
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(ss.str()));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir) {
  const std::string path = state_dir + "/token";
  if (access(path.c_str(), F_OK) == 0) return ReadTokenFile(path);
  std::random_device rd;
  static const char* kHex = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 32; ++i) {
    unsigned v = rd() & 0xff;
    token += kHex[v >> 4];
    token += kHex[v & 15];
  }
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot create token file ", path));
  std::string line = token + "\n";
  bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  fchmod(fd, 0600);
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("cannot write token file ", path));
  return token;
}

bool IsAuthorized(const grpc::ServerContextBase& ctx, const std::string& token) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return false;
  const std::string want = "Bearer " + token;
  const std::string got(it->second.data(), it->second.size());
  if (got.size() != want.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff |= static_cast<unsigned char>(got[i] ^ want[i]);
  return diff == 0;
}

void AddAuth(grpc::ClientContext* ctx, const std::string& token) {
  ctx->AddMetadata("authorization", "Bearer " + token);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const std::string& tls_ca_file) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // gRPC's default reconnect backoff grows to 120 s: ranks would go on
  // training unheard for many seconds after a restarted coordinator is
  // back. A control plane with a handful of clients can afford a retry
  // every 2 s at most.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!tls_ca_file.empty()) {
    grpc::SslCredentialsOptions opts;
    std::ifstream in(tls_ca_file);
    std::stringstream ss;
    ss << in.rdbuf();
    opts.pem_root_certs = ss.str();
    creds = grpc::SslCredentials(opts);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

}  // namespace dgca
