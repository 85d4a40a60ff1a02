// gloo-exposed: exposed communication share of data-parallel training over
// Gloo, per bucket size. For each bucket size, forks N ranks (loopback TCP,
// FileStore rendezvous) that run the real trainer (model/train/trainer.h)
// for a few steps, and prints per-step means from rank 0:
//   allreduce share = sum of bucket all-reduce durations / step time
//   exposed share   = time the step blocked waiting for them / step time
// The first `--skip` steps (warm-up) are left out of the means.
//
// Usage: gloo-exposed --train FILE [--vocab FILE] [--preset small]
//        [--buckets 1,4,25,100] [--steps 8] [--skip 2] [--micro-batch 8]
//        [--seq-len 128] [--ranks 2] [--threads 1] [--no-overlap]
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gloo/rendezvous/file_store.h"
#include "model/comm/gloo_communicator.h"
#include "model/train/trainer.h"

namespace {

struct Args {
  std::string train, vocab, preset = "small";
  std::vector<double> buckets = {1, 4, 25, 100};
  int steps = 8, skip = 2, micro_batch = 8, seq_len = 128, ranks = 2, threads = 1;
  bool overlap = true;
};

class Collect : public dgca::TrainObserver {
 public:
  void OnStep(const dgca::StepReport& r) override { reports.push_back(r); }
  std::vector<dgca::StepReport> reports;
};

int RunRank(const Args& a, double bucket_mb, const std::string& dir, int rank,
            const std::string& out) {
  auto store = std::make_shared<gloo::rendezvous::FileStore>(dir);
  auto comm = dgca::MakeGlooCommunicator(store, rank, a.ranks);
  if (!comm.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 1;
  }
  dgca::TrainConfig c;
  auto m = dgca::ApplyPreset(a.preset, c.model);
  if (!m.ok()) {
    fprintf(stderr, "%s\n", m.status().ToString().c_str());
    return 1;
  }
  c.model = *m;
  c.train_path = a.train;
  c.vocab_path = a.vocab;
  c.confusion_path = "";
  c.model.candidate = false;  // no Unihan dependency; the heads barely change comm
  c.model.fusion = dgca::FusionKind::kNone;
  c.max_seq_len = a.seq_len;
  c.micro_batch = a.micro_batch;
  c.steps = a.steps;
  c.threads = a.threads;
  c.bucket_mb = bucket_mb;
  c.overlap = a.overlap;
  c.lr = 1e-4f;
  Collect col;
  auto r = dgca::Train(c, comm->get(), &col);
  if (!r.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, r.status().ToString().c_str());
    return 2;
  }
  if (rank == 0) {
    double step = 0, ar = 0, ex = 0, bw = 0;
    int n = 0, buckets = 0;
    for (size_t i = a.skip; i < col.reports.size(); ++i) {
      const auto& s = col.reports[i];
      step += s.step_seconds;
      ar += s.allreduce_seconds;
      ex += s.exposed_comm_seconds;
      bw += s.bus_bandwidth_bytes_per_second;
      buckets = s.buckets;
      ++n;
    }
    FILE* f = fopen(out.c_str(), "w");
    if (n > 0) {
      fprintf(f, "%8.1f %8d %10.4f %12.4f %10.4f %8.3f %8.3f %10.3f\n", bucket_mb, buckets,
              step / n, ar / n, ex / n, ar / step, ex / step, bw / n / 1e9);
    }
    fclose(f);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", f.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (f == "--train") a.train = next();
    else if (f == "--vocab") a.vocab = next();
    else if (f == "--preset") a.preset = next();
    else if (f == "--steps") a.steps = atoi(next().c_str());
    else if (f == "--skip") a.skip = atoi(next().c_str());
    else if (f == "--micro-batch") a.micro_batch = atoi(next().c_str());
    else if (f == "--seq-len") a.seq_len = atoi(next().c_str());
    else if (f == "--ranks") a.ranks = atoi(next().c_str());
    else if (f == "--threads") a.threads = atoi(next().c_str());
    else if (f == "--no-overlap") a.overlap = false;
    else if (f == "--buckets") {
      a.buckets.clear();
      std::stringstream ss(next());
      std::string tok;
      while (std::getline(ss, tok, ',')) a.buckets.push_back(atof(tok.c_str()));
    } else {
      fprintf(stderr, "unknown flag %s (see the comment at the top of exposed_share.cc)\n",
              f.c_str());
      return 2;
    }
  }
  if (a.train.empty() || a.ranks < 2 || a.steps <= a.skip) {
    fprintf(stderr, "usage: gloo-exposed --train FILE [--vocab FILE] [--buckets 1,4,25,100] "
                    "[--steps N > --skip K] [--ranks >= 2]\n");
    return 2;
  }
  printf("# preset %s, %d ranks x micro-batch %d, seq %d, %d threads/rank, overlap %s; "
         "means over steps %d..%d\n",
         a.preset.c_str(), a.ranks, a.micro_batch, a.seq_len, a.threads, a.overlap ? "on" : "off",
         a.skip + 1, a.steps);
  printf("%8s %8s %10s %12s %10s %8s %8s %10s\n", "bucketMB", "buckets", "step_s", "allreduce_s",
         "exposed_s", "ar_share", "exp_share", "busbw_GB/s");
  int rc = 0;
  for (double mb : a.buckets) {
    char tmpl[] = "/tmp/gloo_exposed_XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    const std::string dir = tmpl, out = dir + "/result.txt";
    std::vector<pid_t> pids;
    for (int r = 0; r < a.ranks; ++r) {
      pid_t pid = fork();
      if (pid == 0) _exit(RunRank(a, mb, dir, r, out));
      pids.push_back(pid);
    }
    for (pid_t p : pids) {
      int st = 0;
      waitpid(p, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
    }
    FILE* f = fopen(out.c_str(), "r");
    char line[512];
    if (f && fgets(line, sizeof(line), f)) fputs(line, stdout);
    if (f) fclose(f);
    fflush(stdout);
  }
  return rc;
}
