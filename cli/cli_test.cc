#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/app.h"
#include "cli/cli_test_util.h"
#include "cli/client.h"
#include "cli/format.h"
#include "model/core/json.h"

namespace dgca {
namespace cli {
namespace {

std::string TempFile(const std::string& content) {
  char tmpl[] = "/tmp/cli_test.XXXXXX";
  int fd = mkstemp(tmpl);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(tmpl) << content;
  return tmpl;
}

TEST(CliFormatTest, DurationAndProgressLine) {
  EXPECT_EQ(FormatDuration(45), "45s");
  EXPECT_EQ(FormatDuration(187), "3m07s");
  EXPECT_EQ(FormatDuration(7500), "2h05m");
  EXPECT_EQ(FormatDuration(-1), "?");
  Progress p;
  p.state = v1::RUNNING;
  p.step = 5;
  p.total_steps = 20;
  p.samples_per_second = 12.5;
  p.loss = 3.25;
  p.has_loss = true;
  p.eta_seconds = 30;
  std::string line = ProgressLine(p, 4);
  EXPECT_EQ(line, "RUNNING  step 5/20 [#...]  25%  12.5 samples/s  last-step loss 3.2500  ETA 30s");
  // An ended job's final loss wins over its last step's.
  v1::Job job;
  job.set_state(v1::SUCCEEDED);
  job.set_step(20);
  job.set_total_steps(20);
  job.set_loss(3.5);
  job.set_final_loss(3.125);
  job.set_final_loss_steps(10);
  job.set_final_loss_ranks(2);
  EXPECT_EQ(ProgressLine(ComputeProgress(job, {}), 0),
            "SUCCEEDED  step 20/20 100%  final loss 3.1250 (last 10 steps)");
}

TEST(CliFormatTest, ProgressFromRankSamples) {
  v1::Job job;
  job.set_state(v1::RUNNING);
  job.mutable_spec()->mutable_train()->set_steps(100);
  std::map<int, v1::StepMetrics> ranks;
  ranks[0].set_step(10);
  ranks[0].set_total_steps(100);
  ranks[0].set_samples_per_second(5);
  ranks[0].set_loss(2.0);
  ranks[0].set_step_seconds(1.0);
  ranks[1].set_step(9);
  ranks[1].set_total_steps(100);
  ranks[1].set_samples_per_second(7);
  ranks[1].set_loss(4.0);
  ranks[1].set_step_seconds(3.0);
  Progress p = ComputeProgress(job, ranks);
  EXPECT_EQ(p.step, 9);
  EXPECT_EQ(p.total_steps, 100);
  EXPECT_DOUBLE_EQ(p.samples_per_second, 12);
  EXPECT_DOUBLE_EQ(p.loss, 3.0);
  EXPECT_DOUBLE_EQ(p.eta_seconds, 91 * 2.0);
}

TEST(CliFormatTest, LossPlotDrawsTheCurve) {
  v1::Job job;
  EXPECT_EQ(LossPlot(job), "");  // no points, no plot
  for (int s = 1; s <= 100; ++s) {
    v1::LossPoint* p = job.add_loss_curve();
    p->set_step(s * 10);
    p->set_loss(s <= 50 ? 8.0 - 0.1 * s : 3.0);  // falls, then flat
  }
  const std::string plot = LossPlot(job, 40, 8);
  std::vector<std::string> lines;
  for (size_t b = 0, e; b < plot.size(); b = e + 1) lines.push_back(plot.substr(b, (e = plot.find('\n', b)) - b));
  ASSERT_EQ(lines.size(), 8u + 3u) << plot;
  // The first column (steps 10-30: mean 7.8) at the top-left.
  EXPECT_EQ(lines[0].substr(0, 6), "7.8 |*") << plot;
  EXPECT_EQ(lines[7].substr(0, 4), "  3 ") << plot;      // the axis bottom is the lowest loss
  EXPECT_EQ(lines[7].back(), '*') << plot;               // the flat tail along the bottom
  for (int r = 1; r < 7; ++r) EXPECT_NE(lines[r].find('*'), std::string::npos) << "row " << r << "\n" << plot;
  // Each column has one point, and the curve never rises.
  int last_row = 0;
  for (size_t c = 5; c < lines[0].size(); ++c) {
    int row = -1;
    for (int r = 0; r < 8; ++r)
      if (c < lines[r].size() && lines[r][c] == '*') row = r;
    ASSERT_GE(row, 0) << "column " << c << "\n" << plot;
    EXPECT_GE(row, last_row) << "column " << c << "\n" << plot;
    last_row = row;
  }
  EXPECT_NE(lines[9].find("step 10"), std::string::npos) << plot;
  EXPECT_NE(lines[9].find("1000"), std::string::npos) << plot;
  EXPECT_EQ(lines[10], "first 7.9000 (step 10), lowest 3.0000 (step 500), last 3.0000 (step 1000); 100 points");
}

TEST(CliFormatTest, JsonUsesProtoNamesAndEnumNames) {
  v1::Job job;
  job.set_id("j1");
  job.set_state(v1::SUCCEEDED);
  job.set_total_steps(7);
  std::string j = ToJson(job);
  EXPECT_NE(j.find("\"state\": \"SUCCEEDED\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"total_steps\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"restarts\": 0"), std::string::npos) << j;
}

// 64-bit integers are JSON numbers wherever they are (proto3 JSON prints
// them as strings); everything else as protobuf prints it.
TEST(CliFormatTest, JsonPrints64BitIntegersAsNumbers) {
  v1::Job job;
  job.set_id("j1");
  job.set_step(12);
  job.set_total_steps(40);
  job.set_created_unix_ms(1'795'876'000'123);
  job.set_restarts(1);
  job.set_loss(4.0367125);
  job.set_message("quote \" and\nnewline");
  job.mutable_spec()->mutable_train()->set_seed(18'446'744'073'709'551'615ull);  // uint64 max
  job.mutable_spec()->mutable_probe()->add_sizes_bytes(1024);
  job.mutable_spec()->mutable_probe()->add_sizes_bytes(1 << 20);
  (*job.mutable_eval())["sentence_correction_f1"] = 0.5;
  job.add_loss_curve()->set_step(7);
  job.mutable_plan_check()->set_samples(-3);
  const std::string j = ToJson(job);
  for (const char* want : {"\"step\": 12", "\"total_steps\": 40", "\"created_unix_ms\": 1795876000123",
                           "\"restarts\": 1", "\"seed\": 18446744073709551615", "\"samples\": -3",
                           "\"state\": \"JOB_STATE_UNSPECIFIED\"", "\"loss\": 4.0367125",
                           "\"sentence_correction_f1\": 0.5"}) {
    EXPECT_NE(j.find(want), std::string::npos) << want << "\n" << j;
  }
  EXPECT_EQ(j.find("\"12\""), std::string::npos) << j;
  auto parsed = ParseJson(j, "ToJson");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << j;
  EXPECT_EQ(parsed->Find("message")->string, "quote \" and\nnewline");
  const JsonValue* sizes = parsed->Find("spec")->Find("probe")->Find("sizes_bytes");
  ASSERT_TRUE(sizes && sizes->is_array() && sizes->array.size() == 2) << j;
  EXPECT_TRUE(sizes->array[1].is_number());
  EXPECT_EQ(sizes->array[1].integer, 1 << 20);
  const JsonValue* curve = parsed->Find("loss_curve");
  ASSERT_TRUE(curve && curve->is_array() && curve->array.size() == 1) << j;
  EXPECT_TRUE(curve->array[0].Find("step")->is_number()) << j;
  EXPECT_TRUE(parsed->Find("ranks")->is_array());
}

TEST(CliExitCodeTest, Mapping) {
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("x")), 3);
  EXPECT_EQ(ExitCodeFor(absl::UnauthenticatedError("x")), 3);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("x")), 3);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("x")), 2);
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("x")), 2);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("x")), 1);
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), 0);
}

TEST(CliTest, ValidateReportsEveryProblemWithLineAndColumn) {
  std::string path = TempFile(
      "name: bad\n"
      "model:\n"
      "  preset: tiny\n"
      "  colour: blue\n"
      "train:\n"
      "  steps: -5\n"
      "  global_batch: lots\n");
  CliRun r = Cli({"validate", path});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(path + ":4:3: model.colour"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(path + ":6:10: train.steps"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(path + ":7:17: train.global_batch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("3 problems"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

TEST(CliTest, ValidateAcceptsGoodSpec) {
  std::string path = TempFile("name: ok\nmodel: {preset: tiny}\ntrain: {steps: 10}\n");
  CliRun r = Cli({"validate", path});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("valid"), std::string::npos);
  std::remove(path.c_str());
}

TEST(CliTest, MissingSpecFileIsUsageError) {
  CliRun r = Cli({"validate", "/nonexistent/spec.yaml"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent/spec.yaml"), std::string::npos);
}

TEST(CliTest, UnknownCommandIsUsageError) {
  EXPECT_EQ(Cli({"frobnicate"}).code, 2);
  EXPECT_EQ(Cli({}).code, 2);
  EXPECT_EQ(Cli({"--help"}).code, 0);
}

// The spec and token files are read only up to their limits: a 3 GiB file
// or /dev/zero was read whole into memory (std::bad_alloc, abort). Run with
// 1 GiB of address space to show nothing near that size is allocated.
TEST(CliTest, HugeSpecAndTokenFilesAreRefusedWithoutReadingThem) {
  std::string big = TempFile("");
  ASSERT_EQ(truncate(big.c_str(), 3ll << 30), 0);
  std::string token = TempFile("abc\n");
  auto limited = [](std::vector<std::string> args) {
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DGCA_CLI_TEST_ASAN 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(DGCA_CLI_TEST_ASAN)
    struct rlimit lim = {1ull << 30, 1ull << 30};
    setrlimit(RLIMIT_AS, &lim);
#endif
    CliRun r = Cli(args);
    std::fprintf(stderr, "%s", r.err.c_str());
    std::exit(r.code);
  };
  // (The "fast" death test style: the child forks from here and uses the
  // files made above; the paths touch no gRPC.)
  EXPECT_EXIT(limited({"validate", big}), ::testing::ExitedWithCode(2),
              "error: " + big + ": larger than 1 MiB");
  EXPECT_EXIT(limited({"validate", "/dev/zero"}), ::testing::ExitedWithCode(2),
              "error: /dev/zero: larger than 1 MiB");
  EXPECT_EXIT(limited({"--coordinator", "127.0.0.1:1", "--token-file", "/dev/zero", "list"}),
              ::testing::ExitedWithCode(2), "token file /dev/zero is larger than 4 KiB");
  // Just over the limit: the same message (not the parser's).
  std::string over = TempFile(std::string((1 << 20) + 1, '#'));
  CliRun r = Cli({"validate", over});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(over + ": larger than 1 MiB"), std::string::npos) << r.err;
  std::remove(over.c_str());
  std::remove(big.c_str());
  std::remove(token.c_str());
}

TEST(CliTest, DirectoriesAsSpecOrTokenFileAreNamedAsSuch) {
  CliRun spec = Cli({"validate", "/tmp"});
  EXPECT_EQ(spec.code, 2) << spec.err;
  EXPECT_NE(spec.err.find("/tmp: is a directory"), std::string::npos) << spec.err;
  EXPECT_EQ(spec.err.find("empty"), std::string::npos) << spec.err;
  CliRun tok = Cli({"--coordinator", "127.0.0.1:1", "--token-file", "/tmp", "list"});
  EXPECT_EQ(tok.code, 2) << tok.err;
  EXPECT_NE(tok.err.find("token file /tmp is a directory"), std::string::npos) << tok.err;
}

// A --tls-ca that cannot be read is said as such, before connecting (it
// used to surface as a TLS handshake failure); one that holds no
// certificate likewise.
TEST(CliTest, UnreadableTlsCaIsNamedBeforeConnecting) {
  const std::string token = TempFile("t0k3n\n");
  CliRun r = Cli({"--coordinator", "127.0.0.1:1", "--token-file", token, "--tls-ca",
                  "/nonexistent-dgca/ca.pem", "list"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("cannot read --tls-ca /nonexistent-dgca/ca.pem: No such file or directory"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("handshake"), std::string::npos) << r.err;
  const std::string not_pem = TempFile("hello\n");
  CliRun p = Cli({"--coordinator", "127.0.0.1:1", "--token-file", token, "--tls-ca", not_pem, "list"});
  EXPECT_EQ(p.code, 2) << p.err;
  EXPECT_NE(p.err.find("--tls-ca " + not_pem + " holds no PEM certificate"), std::string::npos)
      << p.err;
  std::remove(token.c_str());
  std::remove(not_pem.c_str());
}

TEST(CliTest, UnknownCommandIsNamedWithTheValidOnes) {
  CliRun r = Cli({"frobnicate"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the commands are: submit, resubmit, delete, validate, plan, list, status"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("A subcommand is required"), std::string::npos) << r.err;
  // After global options too.
  CliRun g = Cli({"--coordinator", "127.0.0.1:1", "frobnicate", "x"});
  EXPECT_EQ(g.code, 2);
  EXPECT_NE(g.err.find("unknown command 'frobnicate'"), std::string::npos) << g.err;
  // No command at all still says one is required.
  CliRun none = Cli({});
  EXPECT_EQ(none.code, 2);
  EXPECT_EQ(none.err.find("unknown command"), std::string::npos) << none.err;
}

// Ports out of 1..65535 wrapped silently (99999 -> 34463), no port was 0.
TEST(CliTest, CoordinatorAddressIsChecked) {
  std::string token = TempFile("abc\n");
  for (const std::string& bad : {"127.0.0.1:99999", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:7x",
                                 ":7600", "::1:7600"}) {
    CliRun r = Cli({"--coordinator", bad, "--token-file", token, "list"});
    EXPECT_EQ(r.code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--coordinator"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("HOST:PORT"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("1..65535"), std::string::npos) << r.err;
  }
  // Valid forms get as far as connecting (nothing listens: exit 3).
  for (const std::string& good : {"127.0.0.1:1", "[::1]:1", "localhost:1"}) {
    CliRun r = Cli({"--coordinator", good, "--token-file", token, "list"});
    EXPECT_EQ(r.code, 3) << good << ": " << r.err;
  }
  std::remove(token.c_str());
}

// A 9 KB job id failed in gRPC's metadata limit and exited 1 ("the job
// failed"); ids are checked before any connection.
TEST(CliTest, JobIdsAreCheckedBeforeConnecting) {
  std::string token = TempFile("abc\n");
  const std::string long_id(9000, 'a');
  for (const std::string& cmd : {"status", "watch", "logs", "cancel", "diagnose"}) {
    CliRun r = Cli({"--coordinator", "127.0.0.1:1", "--token-file", token, cmd, long_id});
    EXPECT_EQ(r.code, 2) << cmd << ": " << r.err.substr(0, 300);
    EXPECT_NE(r.err.find("at most 128"), std::string::npos) << r.err.substr(0, 300);
    EXPECT_LT(r.err.size(), 500u) << cmd;
  }
  CliRun odd = Cli({"--coordinator", "127.0.0.1:1", "--token-file", token, "status", "a b"});
  EXPECT_EQ(odd.code, 2) << odd.err;
  EXPECT_NE(odd.err.find("is not a job id"), std::string::npos) << odd.err;
  // A well-formed id goes to the coordinator (unreachable here: exit 3).
  EXPECT_EQ(Cli({"--coordinator", "127.0.0.1:1", "--token-file", token, "status", "j-000001-ab12"})
                .code,
            3);
  std::remove(token.c_str());
}

TEST(CliTest, NoTokenFileExits3) {
  CliRun r = Cli({"--token-file", "/nonexistent/token", "list"});
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.err.find("/nonexistent/token"), std::string::npos) << r.err;
}

TEST(CliTest, UnreachableCoordinatorExits3) {
  std::string token = TempFile("abc\n");
  // Port 1 on loopback: nothing listens there.
  CliRun r = Cli({"--coordinator", "127.0.0.1:1", "--token-file", token, "status", "j1"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("is dgca-coordinator running"), std::string::npos) << r.err;
  // Global options after the command work too.
  EXPECT_EQ(Cli({"list", "--coordinator", "127.0.0.1:1", "--token-file", token}).code, 3);
  std::remove(token.c_str());
}

TEST(CliTest, EnvironmentVariablesActAsFlags) {
  std::string token = TempFile("abc\n");
  setenv("DGCA_COORDINATOR", "127.0.0.1:1", 1);
  setenv("DGCA_TOKEN_FILE", token.c_str(), 1);
  CliRun r = Cli({"nodes"});
  unsetenv("DGCA_COORDINATOR");
  unsetenv("DGCA_TOKEN_FILE");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << r.err;
  std::remove(token.c_str());
}

// Without a job, `dgca diagnose` says what its two forms do (and contacts
// no coordinator); `comm` is its subcommand, not a job id.
TEST(CliTest, DiagnoseWithoutAJobNamesItsForms) {
  CliRun r = Cli({"diagnose"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("dgca diagnose JOB [--json]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dgca diagnose comm"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("not implemented"), std::string::npos) << r.out;
  CliRun bad = Cli({"diagnose", "comm", "--ranks", "0"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--ranks must be between 1 and 1024"), std::string::npos) << bad.err;
}

TEST(CliTest, TopoOnFixtureRootAndJson) {
  CliRun bad = Cli({"topo", "--root", "/nonexistent/root"});
  EXPECT_EQ(bad.code, 2);
  const char* src = std::getenv("DGCA_SOURCE_DIR");
  std::string fixture = std::string(src ? src : ".") + "/tests/fixtures/a100-4x-pcie/root";
  if (access(fixture.c_str(), F_OK) == 0) {
    CliRun f = Cli({"topo", "--root", fixture});
    EXPECT_EQ(f.code, 0) << f.err;
    EXPECT_NE(f.out.find("GPU3"), std::string::npos) << f.out;
    EXPECT_NE(f.out.find("PIX"), std::string::npos) << f.out;
  }
  CliRun r = Cli({"topo", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"cpu_count\""), std::string::npos) << r.out;
}

}  // namespace
}  // namespace cli
}  // namespace dgca
