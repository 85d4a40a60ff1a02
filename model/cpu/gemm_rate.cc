// The CPU's GEMM rate (gemm_rate.h).
#include "model/cpu/gemm_rate.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "model/cpu/ops.h"
#include "model/cpu/thread_pool.h"

namespace dgca {
namespace cpu {

double MeasureGemmFlops(int threads, double seconds) {
  SetBlasThreads();
  const int n = kGemmRateSize;
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 7) * 0.125f;
    b[i] = static_cast<float>(i % 5) * 0.25f;
  }
  std::unique_ptr<ThreadPool> pool;
  Context ctx;
  if (threads > 1) {
    pool = std::make_unique<ThreadPool>(threads);
    ctx.pool = pool.get();
  }
  using Clock = std::chrono::steady_clock;
  const double flops = 2.0 * n * n * n;
  double best = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (int rep = 0; rep < 3 || Clock::now() < end; ++rep) {
    const auto t0 = Clock::now();
    // As LinearForward multiplies: out = inp w^T.
    Gemm(ctx, false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, flops / s);
    if (rep > 10000) break;
  }
  return best;
}

}  // namespace cpu
}  // namespace dgca
