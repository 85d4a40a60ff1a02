#include "spec/rank_env.h"

namespace dgca {

const std::vector<RefusedRankEnv>& RefusedRankEnvs() {
  // The reason's first words are the kind ("loads a library into the rank",
  // "writes a file on the node"); the parenthesis says whose.
  static const std::vector<RefusedRankEnv> kList = {
      // NCCL's plugin loader (dlopen of the value, or libnccl-KIND-VALUE.so).
      {"NCCL_NET_PLUGIN", "loads a library into the rank (NCCL's network plugin)"},
      {"NCCL_GIN_PLUGIN", "loads a library into the rank (NCCL's GPU-initiated networking plugin)"},
      {"NCCL_RMA_PLUGIN", "loads a library into the rank (NCCL's one-sided communication plugin)"},
      {"NCCL_TUNER_PLUGIN", "loads a library into the rank (NCCL's tuner plugin)"},
      {"NCCL_PROFILER_PLUGIN", "loads a library into the rank (NCCL's profiler plugin)"},
      {"NCCL_ENV_PLUGIN", "loads a library into the rank (NCCL's environment plugin)"},
      // Settings read from a file are settings this list never sees.
      {"NCCL_CONF_FILE",
       "reads NCCL settings from a file on the node, which may load a plugin library into the rank"},
      {"CUDA_INJECTION64_PATH", "loads a library into the rank (a CUDA injection library)"},
      {"CUDA_INJECTION32_PATH", "loads a library into the rank (a CUDA injection library)"},
      {"OMP_TOOL_LIBRARIES", "loads a library into the rank (an OpenMP tool)"},
      {"CUDA_CACHE_PATH",
       "loads compiled GPU code into the rank from a directory on the node, and writes files "
       "there (CUDA's JIT cache)"},
      // Files written where the value says.
      {"NCCL_DEBUG_FILE",
       "writes a file on the node (NCCL's debug log; without it, NCCL_DEBUG output goes to the "
       "rank's log)"},
      {"NCCL_TOPO_DUMP_FILE", "writes a file on the node (NCCL's topology dump)"},
      {"NCCL_GRAPH_DUMP_FILE", "writes a file on the node (NCCL's graph dump)"},
      {"NCCL_PROXY_PROFILE", "writes a file on the node (NCCL's proxy profile)"},
      {"NCCL_PROFILE_DUMP_FILE", "writes a file on the node (the NCCL profiler plugin's trace)"},
      {"NCCL_INSPECTOR_DUMP_DIR", "writes files on the node (the NCCL inspector's dumps)"},
      {"CUDA_LOG_FILE", "writes a file on the node (CUDA's error log)"},
      {"CUDA_COREDUMP_FILE", "writes a file on the node (a GPU core dump)"},
      {"CUDA_COREDUMP_PIPE", "writes a file on the node (the pipe that triggers a GPU core dump)"},
      {"CUDA_ENABLE_COREDUMP_ON_EXCEPTION",
       "writes a file on the node (a GPU core dump, up to the GPU's memory in size)"},
      {"CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION",
       "writes a file on the node (a CPU core dump beside the GPU one)"},
      {"CUDA_ENABLE_USER_TRIGGERED_COREDUMP",
       "writes files on the node (a pipe, and a GPU core dump when it is written to)"},
      {"OMP_TOOL_VERBOSE_INIT",
       "writes a file on the node (the OpenMP tool loader's log, unless stdout or stderr)"},
  };
  return kList;
}

std::string RankEnvRefusal(std::string_view name) {
  for (const RefusedRankEnv& r : RefusedRankEnvs()) {
    if (r.name == name) return std::string(r.why);
  }
  // NCCL names each plugin kind NCCL_KIND_PLUGIN and each dump
  // NCCL_KIND_DUMP_FILE: the kinds a later NCCL adds are refused too.
  auto ends = [&](std::string_view suffix) {
    return name.size() > 5 + suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (name.substr(0, 5) == "NCCL_") {
    if (ends("_PLUGIN")) return "loads a library into the rank (an NCCL plugin)";
    if (ends("_DUMP_FILE") || ends("_DUMP_DIR")) return "writes a file on the node (an NCCL dump)";
  }
  return "";
}

}  // namespace dgca
