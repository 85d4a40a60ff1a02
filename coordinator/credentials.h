// Credentials: who a bearer token speaks for, and what it may touch.
//
// Three roles, three kinds of token, each refused outside its role:
//  - user:  STATE_DIR/token. The Coordinator service (the `dgca` CLI):
//           submit, cancel, list, logs, nodes.
//  - agent: STATE_DIR/agent-token. AgentService: a node agent's stream
//           (register, heartbeats, rank exits). Operators copy this file,
//           not the user token, to the nodes that run agents.
//  - rank:  minted per (job, attempt) and handed to the agent inside each
//           LaunchRank; the agent writes it to a 0600 file the rank reads.
//           RankService only, and only for that job and that attempt: its
//           rendezvous store, heartbeats and metrics. Whoever reads a
//           rank's token file cannot touch another job, nor open rendezvous
//           namespaces of other attempts of its own. The token is the
//           attempt's, not one rank's: it can speak for any rank of it.
//           Ranks run as their agent's user and are not told where the
//           agent's token is; keeping them from the state dir's files
//           altogether takes another uid.
//
// A rank token is "dgca-rank:JOB:ATTEMPT:MAC" where MAC is the hex
// HMAC-SHA256 of "JOB\nATTEMPT" under STATE_DIR/rank-key (32 random bytes
// written as 64 hex characters, 0600, made at first start; an empty key
// verifies no rank token). Nothing per job is stored: a coordinator
// restarted on the same state dir accepts the tokens of ranks it adopts,
// and a job's tokens need no clean-up when it ends (the scheduler refuses
// calls for jobs that are not running).
//
// Every file is created once (written whole, then linked into place, 0600)
// and read as it is afterwards; one shorter than kMinSecretChars is refused.
//
// Thread-safety: immutable after Load; all methods are const and safe to
// call from any thread.
#ifndef DGCA_COORDINATOR_CREDENTIALS_H_
#define DGCA_COORDINATOR_CREDENTIALS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dgca {

enum class Role { kNone, kUser, kAgent, kRank };

// What Credentials::Identify found a bearer token to be. job_id and
// attempt are set for kRank only.
struct Caller {
  Role role = Role::kNone;
  std::string job_id;
  int32_t attempt = -1;
  // "the user token", "an agent token", "the rank token of job J attempt
  // N": for messages that say why a call was refused.
  std::string Describe() const;
};

class Credentials {
 public:
  // Reads STATE_DIR/token, STATE_DIR/agent-token and STATE_DIR/rank-key,
  // creating each that is missing. Errors name the file (unreadable, empty,
  // a directory, cannot be created).
  static absl::StatusOr<Credentials> Load(const std::string& state_dir);
  // From given secrets (tests).
  Credentials(std::string user_token, std::string agent_token, std::string rank_key);

  const std::string& user_token() const { return user_token_; }
  const std::string& agent_token() const { return agent_token_; }

  // The token a rank of `job_id`'s attempt `attempt` presents.
  std::string RankToken(absl::string_view job_id, int32_t attempt) const;

  // The caller a raw token (without "Bearer ") speaks for; kNone when it
  // is none of ours. Comparisons take constant time in the secret.
  Caller Identify(absl::string_view token) const;

 private:
  std::string Mac(absl::string_view job_id, int32_t attempt) const;

  std::string user_token_;
  std::string agent_token_;
  std::string rank_key_;
};

// The shortest secret Load accepts in any of its files (it makes 64).
inline constexpr size_t kMinSecretChars = 16;

// The files Credentials::Load keeps in a state dir.
inline constexpr char kUserTokenFile[] = "token";
inline constexpr char kAgentTokenFile[] = "agent-token";
inline constexpr char kRankKeyFile[] = "rank-key";

// Refusals at the edge, as absl statuses the services convert:
//  - a token none of ours (or none at all): UNAUTHENTICATED;
//  - one of ours in the wrong role: PERMISSION_DENIED naming the role the
//    call takes and the file that holds it;
//  - a rank token for another job or attempt than the request names:
//    PERMISSION_DENIED naming both.
absl::Status RequireRole(const Caller& caller, Role want);
absl::Status RequireRankOf(const Caller& caller, absl::string_view job_id, int32_t attempt);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_CREDENTIALS_H_
