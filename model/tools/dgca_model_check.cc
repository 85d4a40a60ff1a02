// dgca-model-check: every CUDA op of the trainer against its CPU reference
// (model/cuda/op_check.h) on one GPU, as a table:
//   op | dtype | max rel err | tolerance | PASS/FAIL
// Random inputs are drawn fresh each run (the seed is printed; --seed
// repeats a run), GPU outputs are poisoned with NaN before each call.
//
// Exit status: 0 all pass, 1 any failure (numeric or a CUDA error),
// 2 no usable GPU (the clean FAILED_PRECONDITION message is printed),
// 3 bad command line.
//
// Usage: dgca-model-check [--device N] [--seed S] [--only SUBSTRING]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/cuda/bert_check.h"
#include "model/cuda/heads_check.h"
#include "model/cuda/model_check.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/gemm.h"
#include "model/cuda/op_check.h"

namespace {

int Usage(const char* msg) {
  std::fprintf(stderr, "dgca-model-check: %s\nusage: dgca-model-check [--device N] [--seed S] [--only SUBSTRING]\n", msg);
  return 3;
}

bool ParseInt(const char* s, long long* out) {
  char* end = nullptr;
  *out = std::strtoll(s, &end, 10);
  return end != s && *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dgca::cuda;
  int device = 0;
  uint64_t seed = std::random_device{}();
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--device" || a == "--seed" || a == "--only") && i + 1 >= argc) return Usage(("missing value after " + a).c_str());
    long long v = 0;
    if (a == "--device") {
      if (!ParseInt(argv[++i], &v) || v < 0) return Usage("--device takes a device index >= 0");
      device = static_cast<int>(v);
    } else if (a == "--seed") {
      if (!ParseInt(argv[++i], &v)) return Usage("--seed takes an integer");
      seed = static_cast<uint64_t>(v);
    } else if (a == "--only") {
      only = argv[++i];
    } else if (a == "-h" || a == "--help") {
      Usage("help");
      return 0;
    } else {
      return Usage(("unknown argument '" + a + "'").c_str());
    }
  }
  auto ctx = CudaContext::Create(device);
  if (!ctx.ok()) {
    std::fprintf(stderr, "dgca-model-check: %s\n", ctx.status().ToString().c_str());
    return 2;
  }
  std::printf("device %d: %s\nseed %llu\n\n", device, (*ctx)->description().c_str(),
              static_cast<unsigned long long>(seed));
  GemmRunner gemm(ctx->get());
  std::mt19937_64 rng(seed);
  std::printf("%-48s %-6s %12s %10s  %s\n", "op", "dtype", "max rel err", "tolerance", "result");
  int failures = 0, rows_total = 0;
  std::vector<OpCheck> checks = AllOpChecks();
  for (const OpCheck& c : BertChecks()) checks.push_back(c);  // CudaBert vs dgca::Bert
  for (const OpCheck& c : HeadsChecks()) checks.push_back(c);  // CudaHeads, CudaPromptEncoder vs CPU
  for (const OpCheck& c : ModelChecks()) checks.push_back(c);  // whole step: CudaDgcaModel vs DgcaModel
  for (const OpCheck& check : checks) {
    if (!only.empty() && check.name.find(only) == std::string::npos) continue;
    std::vector<CheckRow> rows;
    dgca::Status s = check.run(**ctx, &gemm, &rng, &rows);
    for (const CheckRow& r : rows) {
      ++rows_total;
      if (!r.pass()) ++failures;
      std::printf("%-48s %-6s %12.3e %10.1e  %s\n", r.op.c_str(), r.dtype.c_str(), r.max_rel_err, r.tolerance,
                  r.pass() ? "PASS" : "FAIL");
    }
    if (!s.ok()) {
      ++failures;
      std::printf("%-48s %-6s %12s %10s  ERROR %s\n", check.name.c_str(), "", "-", "-", s.ToString().c_str());
    }
  }
  std::printf("\n%d rows, %d failures\n", rows_total, failures);
  return failures == 0 ? 0 : 1;
}
