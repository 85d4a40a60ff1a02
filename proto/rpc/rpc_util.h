// Glue shared by every gRPC endpoint: status conversion at the edge, bearer
// token authentication, channel creation.
//
// Thread-safety: all functions are thread-safe.
#ifndef DGCA_PROTO_RPC_RPC_UTIL_H_
#define DGCA_PROTO_RPC_RPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/core/status.h"

namespace dgca {

// Largest request or response message, both directions (4 MiB).
inline constexpr int kMaxMessageBytes = 4 << 20;

// Status conversions. The numeric codes are shared by all three.
absl::Status ToAbsl(const Status& s);
grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

// Reads at most max_bytes + 1 bytes of `path` (never more: /dev/zero or a
// huge file is not read into memory). `kind` says what happened; on
// kCannotOpen / kReadError `error` holds strerror's text. `data` holds what
// was read (max_bytes + 1 bytes when kTooBig).
struct BoundedRead {
  enum Kind { kOk, kCannotOpen, kDirectory, kTooBig, kReadError } kind = kOk;
  std::string data;
  std::string error;
};
BoundedRead ReadFileAtMost(const std::string& path, size_t max_bytes);

// Reads the bearer token from `path` (surrounding whitespace stripped).
// Reads at most kMaxTokenFileBytes + 1 bytes. Errors: NOT_FOUND when it
// cannot be opened; FAILED_PRECONDITION when it is a directory or larger
// than kMaxTokenFileBytes; INVALID_ARGUMENT when it holds only whitespace.
inline constexpr size_t kMaxTokenFileBytes = 4096;
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);
// Reads the PEM root CA of --tls-ca (at most kMaxTlsCaBytes). Said before
// connecting: a path that cannot be read used to surface as a TLS
// handshake failure. INVALID_ARGUMENT "cannot read --tls-ca PATH: No such
// file or directory" (strerror's text), or naming a directory, a file over
// the limit, or one that holds no "-----BEGIN CERTIFICATE-----".
inline constexpr size_t kMaxTlsCaBytes = 1 << 20;
absl::StatusOr<std::string> ReadTlsCaFile(const std::string& path);
// Reads the token file at `path`, or creates it (32 random bytes as hex,
// mode 0600, never overwriting one another process made meanwhile).
absl::StatusOr<std::string> LoadOrCreateTokenFile(const std::string& path);

// Server side: the token of the call's "authorization: Bearer TOKEN"
// metadata; "" when there is none or it is not of that form.
std::string BearerToken(const grpc::ServerContextBase& ctx);
// Server side: true when the call's "authorization" metadata is
// "Bearer <token>". Compares in constant time.
bool IsAuthorized(const grpc::ServerContextBase& ctx, const std::string& token);
inline grpc::Status Unauthenticated() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or wrong bearer token (see --token-file / DGCA_TOKEN_FILE)");
}

// Client side: adds "authorization: Bearer <token>" to `ctx`.
void AddAuth(grpc::ClientContext* ctx, const std::string& token);

// Checks a "HOST:PORT" address: PORT all digits in [min_port, 65535]
// (min_port 0 for a listen address, where 0 = any free port; 1 to
// connect), HOST a name, an IPv4 address or a bracketed IPv6 address
// ("[::1]:7600"); an empty HOST only with allow_empty_host. INVALID_ARGUMENT
// saying what is wrong and the valid form. With allow_unix, "unix:PATH" and
// "unix-abstract:NAME" targets are accepted as they are.
absl::Status CheckHostPort(const std::string& address, int min_port, bool allow_empty_host = false,
                           bool allow_unix = false);

// Job ids: the coordinator names jobs "j-NNNNNN-hhhh". Anything that is not
// 1..kMaxJobIdBytes characters of [A-Za-z0-9._-] cannot name a job;
// INVALID_ARGUMENT saying so (without echoing an overlong id).
inline constexpr size_t kMaxJobIdBytes = 128;
absl::Status CheckJobId(const std::string& id);

// Channel to `address` ("host:port") with the message size limit. When
// `tls_ca_file` is non-empty, TLS with that root CA; else insecure.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const std::string& tls_ca_file = "");

}  // namespace dgca

#endif  // DGCA_PROTO_RPC_RPC_UTIL_H_
