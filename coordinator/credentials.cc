#include "coordinator/credentials.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <utility>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace {

constexpr absl::string_view kRankPrefix = "dgca-rank:";

bool SameSecret(absl::string_view a, absl::string_view b) {
  // Lengths are not secret (every token of a kind has the same length);
  // the bytes are compared in constant time.
  return !a.empty() && a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

const char* RoleName(Role r) {
  switch (r) {
    case Role::kUser: return "the user token";
    case Role::kAgent: return "an agent token";
    case Role::kRank: return "a rank token";
    case Role::kNone: break;
  }
  return "no token of this coordinator";
}

// What a call of each role takes, and where an operator finds it.
const char* WhatRoleTakes(Role r) {
  switch (r) {
    case Role::kUser:
      return "the user token (the coordinator's STATE_DIR/token, as `dgca --token-file` reads it)";
    case Role::kAgent:
      return "the agent token (the coordinator's STATE_DIR/agent-token, as `dgca-worker agent "
             "--token-file` reads it)";
    case Role::kRank:
      return "a rank token (the coordinator mints one per job attempt and the agent hands it to "
             "the rank it launches)";
    case Role::kNone: break;
  }
  return "a token";
}

}  // namespace

std::string Caller::Describe() const {
  if (role == Role::kRank) return absl::StrCat("the rank token of job ", job_id, " attempt ", attempt);
  return RoleName(role);
}

Credentials::Credentials(std::string user_token, std::string agent_token, std::string rank_key)
    : user_token_(std::move(user_token)),
      agent_token_(std::move(agent_token)),
      rank_key_(std::move(rank_key)) {}

absl::StatusOr<Credentials> Credentials::Load(const std::string& state_dir) {
  // Each secret: made when missing; one of the files too short to be a
  // secret (cut short by hand, or by a full disk before 2026-11-29) is
  // refused rather than trusted.
  auto load = [&](const char* name) -> absl::StatusOr<std::string> {
    const std::string path = absl::StrCat(state_dir, "/", name);
    auto secret = LoadOrCreateTokenFile(path);
    if (secret.ok() && secret->size() < kMinSecretChars) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " holds ", secret->size(), " characters; a token needs at least ",
          kMinSecretChars, " (remove it and start again to have a new one made: copies of it, "
          "with dgca users or agents, then need the new one)"));
    }
    return secret;
  };
  auto user = load(kUserTokenFile);
  if (!user.ok()) return user.status();
  auto agent = load(kAgentTokenFile);
  if (!agent.ok()) return agent.status();
  auto key = load(kRankKeyFile);
  if (!key.ok()) return key.status();
  if (*user == *agent) {
    // Copied over one another by hand: the roles would be one again.
    return absl::FailedPreconditionError(absl::StrCat(
        state_dir, "/", kUserTokenFile, " and ", state_dir, "/", kAgentTokenFile,
        " hold the same token, so an agent could act as the user; remove ", state_dir, "/",
        kAgentTokenFile, " (a new one is made at start) and copy it to the agents' nodes"));
  }
  return Credentials(std::move(*user), std::move(*agent), std::move(*key));
}

std::string Credentials::Mac(absl::string_view job_id, int32_t attempt) const {
  const std::string msg = absl::StrCat(job_id, "\n", attempt);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), rank_key_.data(), static_cast<int>(rank_key_.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[mac[i] >> 4];
    out += kHex[mac[i] & 15];
  }
  return out;
}

std::string Credentials::RankToken(absl::string_view job_id, int32_t attempt) const {
  return absl::StrCat(kRankPrefix, job_id, ":", attempt, ":", Mac(job_id, attempt));
}

Caller Credentials::Identify(absl::string_view token) const {
  Caller c;
  if (SameSecret(token, user_token_)) {
    c.role = Role::kUser;
    return c;
  }
  if (SameSecret(token, agent_token_)) {
    c.role = Role::kAgent;
    return c;
  }
  if (rank_key_.empty() || !absl::StartsWith(token, kRankPrefix)) return c;
  // JOB:ATTEMPT:MAC; job ids hold no ':' (CheckJobId).
  std::vector<absl::string_view> parts =
      absl::StrSplit(token.substr(kRankPrefix.size()), absl::MaxSplits(':', 2));
  if (parts.size() != 3 || !CheckJobId(std::string(parts[0])).ok()) return c;
  int32_t attempt = 0;
  if (!absl::SimpleAtoi(parts[1], &attempt) || attempt < 0 ||
      absl::StrCat(attempt) != parts[1]) {
    return c;
  }
  if (!SameSecret(parts[2], Mac(parts[0], attempt))) return c;
  c.role = Role::kRank;
  c.job_id = std::string(parts[0]);
  c.attempt = attempt;
  return c;
}

absl::Status RequireRole(const Caller& caller, Role want) {
  if (caller.role == Role::kNone) {
    return absl::UnauthenticatedError(
        "missing or wrong bearer token (see --token-file / DGCA_TOKEN_FILE)");
  }
  if (caller.role == want) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("this call takes ", WhatRoleTakes(want),
                                                  "; it was given ", caller.Describe()));
}

absl::Status RequireRankOf(const Caller& caller, absl::string_view job_id, int32_t attempt) {
  if (absl::Status st = RequireRole(caller, Role::kRank); !st.ok()) return st;
  if (caller.job_id == job_id && caller.attempt == attempt) return absl::OkStatus();
  // The request's job id is echoed only when it can name a job (an
  // overlong one would overflow the client's metadata limit).
  const std::string asked = CheckJobId(std::string(job_id)).ok()
                                ? absl::StrCat("job ", job_id, " attempt ", attempt)
                                : std::string("a job id that cannot name a job");
  return absl::PermissionDeniedError(absl::StrCat(
      caller.Describe(), " speaks only for that job and attempt, not for ", asked));
}

}  // namespace dgca
