#include "proto/rpc/rpc_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"

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

BoundedRead ReadFileAtMost(const std::string& path, size_t max_bytes) {
  BoundedRead r;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r.kind = BoundedRead::kCannotOpen;
    r.error = strerror(errno);
    return r;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    r.kind = BoundedRead::kDirectory;
    return r;
  }
  r.data.assign(max_bytes + 1, '\0');
  size_t got = 0;
  while (got < r.data.size()) {
    ssize_t n = read(fd, r.data.data() + got, r.data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.kind = BoundedRead::kReadError;
      r.error = strerror(errno);
      r.data.clear();
      close(fd);
      return r;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  r.data.resize(got);
  if (got > max_bytes) r.kind = BoundedRead::kTooBig;
  return r;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  const BoundedRead r = ReadFileAtMost(path, kMaxTokenFileBytes);
  switch (r.kind) {
    case BoundedRead::kOk:
      break;
    case BoundedRead::kCannotOpen:
    case BoundedRead::kReadError:
      return absl::NotFoundError(absl::StrCat("cannot read token file ", path, ": ", r.error));
    case BoundedRead::kDirectory:
      return absl::FailedPreconditionError(
          absl::StrCat("token file ", path, " is a directory; give the token file in it (STATE_DIR/token)"));
    case BoundedRead::kTooBig:
      return absl::FailedPreconditionError(absl::StrCat("token file ", path, " is larger than ",
                                                        kMaxTokenFileBytes / 1024,
                                                        " KiB; a token file holds one line"));
  }
  const std::string& data = r.data;
  std::string token(absl::StripAsciiWhitespace(data));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

absl::StatusOr<std::string> ReadTlsCaFile(const std::string& path) {
  const BoundedRead r = ReadFileAtMost(path, kMaxTlsCaBytes);
  switch (r.kind) {
    case BoundedRead::kOk:
      break;
    case BoundedRead::kCannotOpen:
    case BoundedRead::kReadError:
      return absl::InvalidArgumentError(absl::StrCat("cannot read --tls-ca ", path, ": ", r.error));
    case BoundedRead::kDirectory:
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot read --tls-ca ", path, ": it is a directory; give the CA's PEM file"));
    case BoundedRead::kTooBig:
      return absl::InvalidArgumentError(absl::StrCat("--tls-ca ", path, " is larger than ",
                                                     kMaxTlsCaBytes >> 20,
                                                     " MiB; give the CA's PEM file"));
  }
  if (r.data.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-ca ", path, " holds no PEM certificate (-----BEGIN CERTIFICATE-----); give the "
        "CA certificate that signed the coordinator's --tls-cert"));
  }
  return r.data;
}

absl::StatusOr<std::string> LoadOrCreateTokenFile(const std::string& path) {
  if (access(path.c_str(), F_OK) == 0) return ReadTokenFile(path);
  std::random_device rd;
  static const char* kHex = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 32; ++i) {
    unsigned v = rd() & 0xff;
    token += kHex[v >> 4];
    token += kHex[v & 15];
  }
  // Written whole to a temporary file, synced, then linked into place: a
  // full disk or a crash leaves no short token behind, and a file another
  // process linked meanwhile wins (link does not replace).
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  unlink(tmp.c_str());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create token file ", path, ": ", strerror(errno)));
  }
  const std::string line = token + "\n";
  bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ok = fsync(fd) == 0 && ok;
  ok = close(fd) == 0 && ok;
  int err = ok ? 0 : errno;
  if (ok && link(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ok = false;
  }
  unlink(tmp.c_str());
  if (!ok && err == EEXIST) return ReadTokenFile(path);  // made meanwhile by another
  if (!ok) {
    return absl::InternalError(
        absl::StrCat("cannot write token file ", path, ": ", strerror(err)));
  }
  return token;
}

std::string BearerToken(const grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return "";
  const absl::string_view got(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(got, kBearer)) return "";
  return std::string(got.substr(kBearer.size()));
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

absl::Status CheckHostPort(const std::string& address, int min_port, bool allow_empty_host,
                           bool allow_unix) {
  if (allow_unix && (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:"))) {
    return absl::OkStatus();
  }
  const std::string form = absl::StrCat("expected HOST:PORT (e.g. 127.0.0.1:7600 or [::1]:7600) with PORT ",
                                        min_port, "..65535", min_port == 0 ? " (0 = any free port)" : "");
  const std::string shown = address.size() > 100 ? address.substr(0, 100) + "..." : address;
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", shown, "' has no port; ", form));
  }
  std::string host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    if (host.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("'", shown, "' has an empty IPv6 host; ", form));
    }
  } else if (host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", shown, "': an IPv6 host goes in brackets ([::1]:7600); ", form));
  } else if (host.empty() && !allow_empty_host) {
    return absl::InvalidArgumentError(absl::StrCat("'", shown, "' has no host; ", form));
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", shown, "': the port must be a number ", min_port, "..65535; ", form));
  }
  int p = std::stoi(port);
  if (p < min_port || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", shown, "': port ", p, " is out of range ",
                                                   min_port, "..65535; ", form));
  }
  return absl::OkStatus();
}

absl::Status CheckJobId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("the job id is empty (see dgca list)");
  if (id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the job id is ", id.size(),
                                                   " bytes long; job ids are at most ",
                                                   kMaxJobIdBytes, " characters (see dgca list)"));
  }
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", absl::CHexEscape(id), "' is not a job id: job ids are letters, digits, '-', '_' "
          "and '.' (like j-000001-ab12; see dgca list)"));
    }
  }
  return absl::OkStatus();
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
