// A GPU job end to end without a GPU: the real coordinator (no embedded
// agent), one real agent and its rank processes, all dgca-worker-emu — the
// worker linked against the CUDA emulator (model/cuda_emu) and its emulated
// NCCL. The agent probes a fixture 8 x H100 NVLink node (tests/fixtures) and
// DGCA_EMU_DEVICES=8 gives the ranks eight emulated devices, so a
// `device: cuda, backend: nccl` job is planned, placed, launched and run
// exactly as on a GPU box: CUDA trainer kernels, NCCL rendezvous through the
// coordinator's key-value store, gradient all-reduce over NCCL, the eval.
// Its per-step losses must match the same job on `device: cpu` over Gloo.
//
// What this cannot show: speed, real NCCL transports, real GPU memory. That
// is bench/gpu/run.sh on a lent GPU (bench/gpu/README.md).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

std::string EmuWorkerBin() { return BuildDir() + "/worker/dgca-worker-emu"; }
std::string FixtureRoot() {
  return Env("DGCA_SOURCE_DIR", ".") + "/tests/fixtures/nvlink-8-h100/root";
}

// A 2-rank tiny job: 4 steps of global batch 8 in micro-batches of 4, eval
// on `eval_file`.
std::string WriteSpec(const std::string& dir, const std::string& name, const std::string& device,
                      const std::string& backend, const std::string& eval_file,
                      const std::string& precision = "fp32", int steps = 4) {
  TinySpecOptions o;
  o.device = device;
  o.backend = backend;
  o.eval_file = eval_file;
  o.precision = precision;
  o.micro_batch = 4;
  return WriteTinySpec(dir, name, steps, o);
}

// "step N/M loss X" lines of a rank log: step -> loss.
std::map<int, double> StepLosses(const std::string& log) {
  std::map<int, double> out;
  static const std::regex re(R"(step (\d+)/\d+ loss ([0-9.eE+-]+))");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    out[std::stoi((*it)[1])] = std::stod((*it)[2]);
  }
  return out;
}

TEST(GpuJobEmuTest, CudaNcclJobOnAnEmulatedH100NodeMatchesTheCpuGlooJob) {
  if (!HavePrograms() || !Exists(EmuWorkerBin())) {
    GTEST_SKIP() << "needs " << EmuWorkerBin()
                 << " (built when DGCA_CUDA_EMULATOR is on and NCCL's header is found)";
  }
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  if (!Exists(FixtureRoot())) GTEST_SKIP() << "no fixture " << FixtureRoot() << " (set DGCA_SOURCE_DIR)";
  setenv("DGCA_EMU_DEVICES", "8", 1);  // inherited by the agent and its ranks

  std::string dir = MakeTempDir("gpu-emu");
  mkdir((dir + "/state").c_str(), 0755);
  // A short eval set: the emulated eval of all 500 test sentences takes ~15 s.
  std::string eval_file = dir + "/eval.txt";
  {
    std::ifstream in(SharedData() + "/ecspell/test_law.txt");
    std::ofstream out(eval_file);
    std::string line;
    for (int i = 0; i < 24 && std::getline(in, line); ++i) out << line << "\n";
  }
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--no-local-agent"}));
  std::string agent_dir = dir + "/agent";
  AgentProcess agent;
  ASSERT_TRUE(agent.Start(coord, "emu-gpu-node", agent_dir, EmuWorkerBin(),
                          {"--worker-binary", EmuWorkerBin(), "--topology-root", FixtureRoot()}));

  Result nodes;
  ASSERT_TRUE(WaitUntil(
      [&] {
        nodes = Dgca(coord, {"nodes", "--json"});
        return nodes.out.find("emu-gpu-node") != std::string::npos;
      },
      30s))
      << nodes.out << nodes.err << agent.Log();
  // The fixture's eight H100s are what the node reports.
  EXPECT_NE(nodes.out.find("H100"), std::string::npos) << nodes.out;

  // Returns the job id.
  auto run = [&](const std::string& name, const std::string& device, const std::string& backend,
                 std::string* rank0_log, const std::string& precision = "fp32", int steps = 4) {
    auto t0 = Clock::now();
    Result sub = Dgca(
        coord, {"submit", WriteSpec(dir, name, device, backend, eval_file, precision, steps), "--wait"},
        240s);
    std::fprintf(stderr, "%s (%s, %s): %.1f s\n", name.c_str(), device.c_str(), backend.c_str(),
                 std::chrono::duration<double>(Clock::now() - t0).count());
    std::string job = sub.out.substr(0, sub.out.find('\n'));
    *rank0_log = ReadFile(agent_dir + "/jobs/" + job + "/rank-0.log");
    EXPECT_EQ(sub.code, 0) << sub.out << sub.err << "\nrank 0:\n" << *rank0_log
                           << "\nrank 1:\n" << ReadFile(agent_dir + "/jobs/" + job + "/rank-1.log")
                           << "\nagent:\n" << agent.Log();
    return job;
  };
  std::string gpu_log, cpu_log, bf16_log;
  const std::string gpu_job = run("emu-cuda", "cuda", "nccl", &gpu_log);
  run("emu-cpu", "cpu", "gloo", &cpu_log);
  run("emu-cuda-bf16", "cuda", "nccl", &bf16_log, "bf16");

  // The GPU job really ran the CUDA trainer and NCCL.
  EXPECT_NE(gpu_log.find("CUDA trainer on dgca CUDA emulator"), std::string::npos) << gpu_log;
  EXPECT_NE(gpu_log.find("nccl backend"), std::string::npos) << gpu_log;
  EXPECT_NE(gpu_log.find("rendezvous done"), std::string::npos) << gpu_log;
  EXPECT_NE(cpu_log.find("gloo backend"), std::string::npos) << cpu_log;

  // Same data order, same init, same global batch: the losses agree to
  // float32 summation-order noise (CUDA kernels and NCCL's ring sum in a
  // different order than the CPU trainer and Gloo).
  std::map<int, double> gpu = StepLosses(gpu_log), cpu = StepLosses(cpu_log);
  ASSERT_EQ(gpu.size(), 4u) << gpu_log;
  ASSERT_EQ(cpu.size(), 4u) << cpu_log;
  for (const auto& [step, loss] : cpu) {
    double rel = std::fabs(gpu[step] - loss) / std::fabs(loss);
    std::fprintf(stderr, "step %d: cuda/nccl %.4f  cpu/gloo %.4f  rel %.1e\n", step, gpu[step],
                 loss, rel);
    EXPECT_LT(rel, 1e-4) << "step " << step;
  }
  // The final loss is printed with four decimals.
  static const std::regex final_re(R"(final loss ([0-9.]+))");
  std::smatch gm, cm;
  ASSERT_TRUE(std::regex_search(gpu_log, gm, final_re)) << gpu_log;
  ASSERT_TRUE(std::regex_search(cpu_log, cm, final_re)) << cpu_log;
  double gf = std::stod(gm[1]), cf = std::stod(cm[1]);
  std::fprintf(stderr, "final loss: cuda/nccl %.6f  cpu/gloo %.6f\n", gf, cf);
  EXPECT_LT(std::fabs(gf - cf) / cf, 1e-4);
  // One final loss for the job: the CUDA trainer all-reduces it over NCCL
  // (through device memory), so rank 1 says rank 0's figure.
  const std::string gpu_rank1 = ReadFile(agent_dir + "/jobs/" + gpu_job + "/rank-1.log");
  std::smatch g1;
  ASSERT_TRUE(std::regex_search(gpu_rank1, g1, final_re)) << gpu_rank1;
  EXPECT_EQ(g1[1], gm[1]) << gpu_rank1;
  EXPECT_NE(gpu_log.find("(mean of the last 4 steps over 2 ranks)"), std::string::npos) << gpu_log;
  // bf16 weights and activations (fp32 master weights): the spec's
  // precision reaches the CUDA trainer, and its losses stay within bf16's
  // rounding (8 bits of mantissa: ~4e-3 per rounding) of fp32's.
  EXPECT_NE(bf16_log.find("bf16"), std::string::npos) << bf16_log;
  // train.attention auto, planned "auto" (bert-tiny's probabilities fit the
  // H100's budget): each rank timed both attention versions at startup and
  // says which it kept.
  static const std::regex auto_re(R"(attention auto: (fused kept|GEMM chosen) \(fused [0-9.]+ ms vs GEMM)");
  EXPECT_TRUE(std::regex_search(bf16_log, auto_re)) << bf16_log;
  std::map<int, double> bf16 = StepLosses(bf16_log);
  ASSERT_EQ(bf16.size(), 4u) << bf16_log;
  for (const auto& [step, loss] : cpu) {
    double rel = std::fabs(bf16[step] - loss) / std::fabs(loss);
    std::fprintf(stderr, "step %d: cuda/nccl bf16 %.4f  cpu/gloo fp32 %.4f  rel %.1e\n", step,
                 bf16[step], loss, rel);
    EXPECT_LT(rel, 1e-2) << "step " << step;
  }
  // The losses move (a trainer stuck at its first loss would pass the above).
  EXPECT_GT(std::fabs(cpu[4] - cpu[1]), 1e-3);
  // GPU memory went from the ranks (the CUDA runtime's reading: no NVML on
  // the emulator) to the coordinator, which stored the job's peak for the
  // next plan under the attention kernels the ranks reported keeping (a
  // plan check needs more steady-state steps than 2 ranks x 4 steps give).
  std::string mem_log;
  const std::string mem_job = run("emu-cuda-memory", "cuda", "nccl", &mem_log, "bf16", 6);
  Result st = Dgca(coord, {"status", mem_job}, 20s);
  static const std::regex peak_re(
      R"(and peak memory [0-9.]+ [KMG]iB at micro-batch [0-9]+ \((fused|gemm) attention, which the ranks kept\))");
  EXPECT_TRUE(std::regex_search(st.out, peak_re)) << st.out;

  agent.Stop();
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
