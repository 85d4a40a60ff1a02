// Rank environment variables that are refused although their prefix
// (NCCL_, CUDA_, OMP_) is allowed: each makes the rank load code, or write a
// file where the value says, on the node it runs on. A job spec is anyone's
// with the token; the node and its files are the operator's. The spec parser
// (comm.env, spec/spec.cc) and the node agent (IsAllowedRankEnv,
// worker/agent/agent.h, for a LaunchRank from any coordinator) both refuse
// them, from this one list.
//
// The list comes from the NCCL user guide's environment variables (2.32),
// NCCL's plugin loader and debug dumps, the CUDA programming guide's
// environment variables and CUPTI's injection, and OpenMP 5.1's tool
// interface. Deliberately not on it:
//  - NCCL_TOPO_FILE, NCCL_GRAPH_FILE: they only read an XML file; a spec
//    can already make its ranks read any file their user may read (its data
//    paths), and on VMs the topology file is the documented fix.
//  - OMP_TOOL: enables or disables a tool the program already holds; loads
//    nothing by itself (OMP_TOOL_LIBRARIES, refused, names what to load).
// An operator who needs one of these (a network plugin such as
// aws-ofi-nccl, say) sets it in the agent's own environment, which the
// ranks inherit: those are not filtered.
//
// Thread-safety: pure functions over constant data.
#ifndef DGCA_SPEC_RANK_ENV_H_
#define DGCA_SPEC_RANK_ENV_H_

#include <string>
#include <string_view>
#include <vector>

namespace dgca {

struct RefusedRankEnv {
  std::string_view name;
  // Why, as a phrase after the name: "loads a library into the rank (...)".
  std::string_view why;
};

// Every refused name with its reason, in a fixed order (docs and tests).
const std::vector<RefusedRankEnv>& RefusedRankEnvs();

// Why `name` may not be set for a rank, or "" when it is not on the list.
// Exact, case-sensitive names (the runtimes read them that way), and any
// other NCCL_*_PLUGIN, NCCL_*_DUMP_FILE or NCCL_*_DUMP_DIR: NCCL's naming
// for plugins and dumps it may add later.
std::string RankEnvRefusal(std::string_view name);

}  // namespace dgca

#endif  // DGCA_SPEC_RANK_ENV_H_
