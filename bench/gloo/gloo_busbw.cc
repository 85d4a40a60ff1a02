// gloo-busbw: all-reduce bus-bandwidth sweep between processes on one
// machine (loopback TCP), like nccl-tests' all_reduce_perf, side by side:
//   dgca   — our GlooCommunicator (queue + background thread + Status layer)
//   direct — a minimal loop straight on gloo::allreduce with its own context
// busbw = algbw * 2(n-1)/n, algbw = bytes / time.
//
// Usage: gloo-busbw [--ranks N] [--min-bytes B] [--max-bytes B] [--iters K] [--spin-us U]
// (defaults: 2 ranks, 4 KiB .. 256 MiB by x4, K chosen per size).
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "model/comm/gloo_communicator.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int ranks = 2;
  size_t min_bytes = 4096;
  size_t max_bytes = 256u << 20;
  int iters = 0;
  int spin_us = 200;
};

int ItersFor(size_t bytes, int forced) {
  if (forced > 0) return forced;
  if (bytes <= (1u << 20)) return 200;
  if (bytes <= (16u << 20)) return 30;
  return 8;
}

// Rank body: prints rows on rank 0.
int RunRank(const Args& a, const std::string& dir, int rank) {
  auto base = std::make_shared<gloo::rendezvous::FileStore>(dir);
  // Our communicator.
  auto ours_store = std::make_shared<gloo::rendezvous::PrefixStore>("dgca", *base);
  dgca::GlooOptions go;
  go.spin_us = a.spin_us;
  auto ours = dgca::MakeGlooCommunicator(ours_store, rank, a.ranks, go);
  if (!ours.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, ours.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<dgca::Communicator> comm = std::move(ours).value();
  // Direct Gloo context, same transport settings.
  gloo::rendezvous::PrefixStore direct_store("direct", *base);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, a.ranks);
  ctx->setTimeout(std::chrono::seconds(60));
  ctx->connectFullMesh(direct_store, dev);

  if (rank == 0) {
    printf("# %d ranks, loopback TCP, float32 sum; busbw = algbw*2(n-1)/n\n", a.ranks);
    printf("%12s %6s %12s %10s %10s %12s %10s %10s %7s\n", "bytes", "iters", "dgca_us",
           "algbw_GB/s", "busbw_GB/s", "direct_us", "algbw_GB/s", "busbw_GB/s", "ratio");
  }
  const double factor = 2.0 * (a.ranks - 1) / a.ranks;
  uint32_t tag = 1000;
  for (size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
    const size_t n = bytes / sizeof(float);
    std::vector<float> buf(n, 1.0f);
    const int iters = ItersFor(bytes, a.iters);
    double t_ours = 0, t_direct = 0;
    // Interleave rounds so background noise hits both alike.
    for (int round = 0; round < 2; ++round) {
      // ours
      {
        if (!comm->AllReduce(buf.data(), n, dgca::ReduceOp::kSum).ok()) return 2;  // warm-up
        if (!comm->Barrier().ok()) return 2;
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) {
          if (!comm->AllReduce(buf.data(), n, dgca::ReduceOp::kSum).ok()) return 2;
        }
        t_ours += std::chrono::duration<double>(Clock::now() - t0).count();
      }
      // direct
      {
        auto run = [&] {
          gloo::AllreduceOptions opts(ctx);
          opts.setOutput(buf.data(), n);
          opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
              &gloo::sum<float>));
          opts.setTag(tag++);
          gloo::allreduce(opts);
        };
        run();
        gloo::BarrierOptions bo(ctx);
        bo.setTag(tag++);
        gloo::barrier(bo);
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) run();
        t_direct += std::chrono::duration<double>(Clock::now() - t0).count();
      }
      std::fill(buf.begin(), buf.end(), 1.0f);  // keep values finite
    }
    const double us_ours = t_ours / (2 * iters) * 1e6, us_direct = t_direct / (2 * iters) * 1e6;
    if (rank == 0) {
      const double alg_o = bytes / (us_ours * 1e-6) / 1e9, alg_d = bytes / (us_direct * 1e-6) / 1e9;
      printf("%12zu %6d %12.1f %10.3f %10.3f %12.1f %10.3f %10.3f %7.3f\n", bytes, iters, us_ours,
             alg_o, alg_o * factor, us_direct, alg_d, alg_d * factor, us_direct / us_ours);
      fflush(stdout);
    }
  }
  gloo::BarrierOptions bo(ctx);
  bo.setTag(tag++);
  gloo::barrier(bo);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", f.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (f == "--ranks") {
      a.ranks = atoi(next());
    } else if (f == "--min-bytes") {
      a.min_bytes = strtoull(next(), nullptr, 10);
    } else if (f == "--max-bytes") {
      a.max_bytes = strtoull(next(), nullptr, 10);
    } else if (f == "--spin-us") {
      a.spin_us = atoi(next());
    } else if (f == "--iters") {
      a.iters = atoi(next());
    } else {
      fprintf(stderr,
              "usage: gloo-busbw [--ranks N] [--min-bytes B] [--max-bytes B] [--iters K] [--spin-us U]\n");
      return 2;
    }
  }
  if (a.ranks < 2 || a.min_bytes < 4 || a.max_bytes < a.min_bytes) {
    fprintf(stderr, "gloo-busbw: need --ranks >= 2 and 4 <= min-bytes <= max-bytes\n");
    return 2;
  }
  char tmpl[] = "/tmp/gloo_busbw_XXXXXX";
  if (!mkdtemp(tmpl)) {
    perror("mkdtemp");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < a.ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunRank(a, tmpl, r));
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
