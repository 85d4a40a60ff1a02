// Metrics through the real programs and the real Debian
// Prometheus server:
//   - a coordinator (port 0) runs a 2-rank CPU job while Prometheus scrapes
//     its /metrics every second (honor_labels, the repository's recording
//     rules evaluated every second); the checks run while it trains (a
//     job's live series leave /metrics when it ends), then it is cancelled
//     and its series must be gone, and a short job runs to its end under
//     `dgca watch`, its final loss a gauge;
//   - `promtool check metrics` accepts /metrics fetched while the job runs;
//   - through Prometheus's HTTP API (/api/v1/query), every PromQL expression
//     of the Grafana dashboard (deploy/grafana/dashboards/dgca.json, $job and
//     $node replaced by ".*") and every recording rule of
//     deploy/prometheus/rules.yml returns at least one series. The GPU panels
//     (make_dashboard.py's GPU_ONLY) are the exception: the job's ranks are
//     CPU ranks, so they must return NO series (GPU metrics are absent, not
//     zero, on CPU) and are reported as skipped with that reason.
// Skips (with the reason) when prometheus/promtool, the programs or the
// shared data are missing; tools/install-deps.sh installs Prometheus.
#include <gtest/gtest.h>

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_replace.h"
#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

// Absolute (Prometheus resolves relative rule paths against its config's
// directory, which is a temporary one here).
std::string SourceDir() {
  std::string dir = Env("DGCA_SOURCE_DIR", ".");
  char buf[PATH_MAX];
  return realpath(dir.c_str(), buf) ? std::string(buf) : dir;
}

// Absolute path of `name` on PATH, or "".
std::string FindProgram(const std::string& name) {
  std::string path = Env("PATH", "/usr/bin:/bin");
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    if (!dir.empty()) {
      std::string p = dir + "/" + name;
      if (access(p.c_str(), X_OK) == 0) return p;
    }
    start = end + 1;
  }
  return "";
}

// A TCP port that was free a moment ago on 127.0.0.1.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

std::string UrlEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t p = s->find(from); p != std::string::npos; p = s->find(from, p + to.size())) {
    s->replace(p, from.size(), to);
  }
}

struct PanelExpr {
  std::string title;
  std::string expr;  // $job/$node already replaced
};

// Every (panel title, expr) of the dashboard JSON.
std::vector<PanelExpr> DashboardExpressions(const std::string& path, std::string* error) {
  auto doc = ParseJson(ReadFile(path), path);
  if (!doc.ok()) {
    *error = doc.status().ToString();
    return {};
  }
  std::vector<PanelExpr> out;
  const JsonValue* panels = doc->Find("panels");
  if (panels == nullptr || !panels->is_array()) {
    *error = path + ": no \"panels\" array";
    return {};
  }
  for (const JsonValue& p : panels->array) {
    const JsonValue* targets = p.Find("targets");
    if (targets == nullptr || !targets->is_array()) continue;
    for (const JsonValue& t : targets->array) {
      std::string e = JsonStr(t.Find("expr"));
      if (e.empty()) continue;
      ReplaceAll(&e, "$job", ".*");
      ReplaceAll(&e, "$node", ".*");
      out.push_back({JsonStr(p.Find("title")), e});
    }
  }
  return out;
}

// The titles in make_dashboard.py's `GPU_ONLY = {"...", ...}` (the source of
// truth for which panels may be empty without a GPU; Python is not run here).
std::set<std::string> GpuOnlyTitles(const std::string& py) {
  std::set<std::string> out;
  std::string text = ReadFile(py);
  size_t p = text.find("\nGPU_ONLY = {");
  if (p == std::string::npos) return out;
  size_t end = text.find('}', p);
  std::string body = text.substr(p, end - p);
  for (size_t q = body.find('"'); q != std::string::npos; q = body.find('"', q)) {
    size_t close = body.find('"', q + 1);
    if (close == std::string::npos) break;
    out.insert(body.substr(q + 1, close - q - 1));
    q = close + 1;
  }
  return out;
}

// The `record:` names of a Prometheus rules file.
std::vector<std::string> RecordNames(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    size_t p = line.find("- record:");
    if (p == std::string::npos || line.find('#') < p) continue;
    std::string name = line.substr(p + 9);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t\r") + 1);
    if (!name.empty()) out.push_back(name);
  }
  return out;
}

// Every metric name a rules file mentions (dgca_*, and job:dgca_* of its
// recording rules), in first-seen order.
std::vector<std::string> MetricNames(const std::string& path) {
  std::vector<std::string> out;
  const std::string text = ReadFile(path);
  for (size_t i = text.find("dgca_"); i != std::string::npos; i = text.find("dgca_", i + 1)) {
    if (i > 0 && (std::isalnum(static_cast<unsigned char>(text[i - 1])) || text[i - 1] == '_')) continue;
    size_t b = i >= 4 && text.compare(i - 4, 4, "job:") == 0 ? i - 4 : i;
    size_t e = i;
    while (e < text.size() && (std::isalnum(static_cast<unsigned char>(text[e])) || text[e] == '_' || text[e] == ':')) ++e;
    std::string name = text.substr(b, e - b);
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

// A Prometheus server process on 127.0.0.1.
class PrometheusProcess {
 public:
  ~PrometheusProcess() { Stop(); }
  bool Start(const std::string& bin, const std::string& config, const std::string& dir) {
    log_ = dir + "/prometheus.log";
    for (int attempt = 0; attempt < 3; ++attempt) {
      address_ = "127.0.0.1:" + std::to_string(FreePort());
      std::vector<std::string> argv = {bin, "--config.file=" + config,
                                       "--storage.tsdb.path=" + dir + "/tsdb",
                                       "--web.listen-address=" + address_};
      pid_ = SpawnLogged(argv, log_);
      if (WaitUntil([&] { return !ProcessAlive(pid_) ||
                                 HttpGet(address_, "/-/ready").find("Ready") != std::string::npos; },
                    15s) &&
          ProcessAlive(pid_)) {
        return true;
      }
      Stop();  // port taken in between, or it failed: try another port
    }
    return false;
  }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    auto end = Clock::now() + 10s;
    int status;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > end) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    pid_ = -1;
  }
  // Number of series an instant query returns; -1 with `error` on failure.
  int Query(const std::string& promql, std::string* error = nullptr) const {
    std::string body = HttpGet(address_, "/api/v1/query?query=" + UrlEncode(promql));
    auto j = ParseJson(body, "prometheus response");
    std::string why;
    if (!j.ok()) {
      why = "no JSON answer: " + body.substr(0, 200);
    } else if (JsonStr(j->Find("status")) != "success") {
      why = JsonStr(j->Find("error"));
    } else if (const JsonValue* d = j->Find("data"); d && d->Find("result") &&
                                                   d->Find("result")->is_array()) {
      return static_cast<int>(d->Find("result")->array.size());
    } else {
      why = "no data.result in " + body.substr(0, 200);
    }
    if (error) *error = why;
    return -1;
  }
  // The first value of an instant query's first series, or NaN.
  double Scalar(const std::string& promql) const {
    auto j = ParseJson(HttpGet(address_, "/api/v1/query?query=" + UrlEncode(promql)), "answer");
    if (!j.ok()) return std::nan("");
    const JsonValue* d = j->Find("data");
    const JsonValue* r = d ? d->Find("result") : nullptr;
    if (!r || !r->is_array() || r->array.empty()) return std::nan("");
    const JsonValue* v = r->array[0].Find("value");
    if (!v || !v->is_array() || v->array.size() != 2) return std::nan("");
    return std::atof(JsonStr(&v->array[1]).c_str());
  }
  std::string Log() const { return ReadFile(log_); }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::string address_, log_;
};

TEST(PrometheusTest, EveryDashboardExpressionAndRecordingRuleHasSeries) {
  const std::string prometheus = FindProgram("prometheus");
  const std::string promtool = FindProgram("promtool");
  if (prometheus.empty() || promtool.empty()) {
    GTEST_SKIP() << "prometheus/promtool not on PATH (tools/install-deps.sh installs the "
                    "Debian 'prometheus' package)";
  }
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();

  const std::string dashboard = SourceDir() + "/deploy/grafana/dashboards/dgca.json";
  const std::string rules = SourceDir() + "/deploy/prometheus/rules.yml";
  std::string error;
  std::vector<PanelExpr> exprs = DashboardExpressions(dashboard, &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_GE(exprs.size(), 10u) << "too few expressions in " << dashboard;
  std::set<std::string> gpu_only = GpuOnlyTitles(SourceDir() + "/deploy/grafana/make_dashboard.py");
  ASSERT_FALSE(gpu_only.empty()) << "no GPU_ONLY set in make_dashboard.py";
  std::set<std::string> titles;
  for (const auto& e : exprs) titles.insert(e.title);
  for (const auto& t : gpu_only) {
    EXPECT_TRUE(titles.count(t)) << "GPU_ONLY names \"" << t << "\", not a panel of " << dashboard
                                 << " (regenerate it: python3 deploy/grafana/make_dashboard.py)";
  }
  std::vector<std::string> records = RecordNames(rules);
  ASSERT_FALSE(records.empty()) << "no recording rules in " << rules;

  std::string dir = MakeTempDir("prometheus-test");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());
  ASSERT_FALSE(coord.metrics().empty()) << "coordinator serves no /metrics";

  // Prometheus: 1 s scrape and rule evaluation, our own `job` label kept.
  const std::string config = dir + "/prometheus.yml";
  WriteFile(config,
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            "rule_files:\n"
            "  - " + rules + "\n"
            "scrape_configs:\n"
            "  - job_name: dgca-coordinator\n"
            "    honor_labels: true\n"
            "    static_configs:\n"
            "      - targets: [\"" + coord.metrics() + "\"]\n");
  Result check = Exec({promtool, "check", "config", config}, 30s);
  ASSERT_EQ(check.code, 0) << check.out << check.err;
  EXPECT_NE((check.out + check.err).find("1 rule files found"), std::string::npos)
      << check.out << check.err;
  PrometheusProcess prom;
  ASSERT_TRUE(prom.Start(prometheus, config, dir)) << prom.Log();
  // Wait for the first scrape, so the whole job is scraped.
  ASSERT_TRUE(WaitUntil([&] { return prom.Scalar("up{job=\"dgca-coordinator\"}") == 1; }, 20s))
      << "Prometheus never scraped the coordinator at " << coord.metrics() << "\n" << prom.Log();

  // A job's series are live series: they leave /metrics when it ends
  // (docs/metrics.md). So the dashboard and the rules are checked against a
  // job that trains all along (far more steps than the checks take), which
  // is cancelled after; a short job then runs to its end under `dgca watch`.
  const int kSteps = 100000;
  // It evaluates every 20 steps (on a few sentences), for the eval panels.
  TinySpecOptions o;
  o.eval_file = dir + "/eval.txt";
  {
    std::ifstream in(SharedData() + "/ecspell/test_law.txt");
    std::ofstream out(o.eval_file);
    std::string line;
    for (int i = 0; i < 16 && std::getline(in, line); ++i) out << line << "\n";
  }
  const std::string spec = WriteTinySpec(dir, "prom", kSteps, o);
  WriteFile(spec, absl::StrReplaceAll(ReadFile(spec), {{"eval_every: 0", "eval_every: 20"}}));
  Result sub = Dgca(coord, {"submit", spec});
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err;
  std::string job = Trim(sub.out);

  // promtool accepts /metrics while the job runs.
  std::string metrics;
  bool running = WaitUntil(
      [&] {
        JobView v = Status(coord, job);
        if (v.state != "RUNNING" || v.rank_steps.size() != 2 || v.rank_steps[0] < 1 ||
            v.rank_steps[1] < 1)
          return false;
        metrics = HttpGet(coord.metrics(), "/metrics");
        return metrics.find("dgca_train_step{job=\"" + job + "\"") != std::string::npos;
      },
      60s);
  ASSERT_TRUE(running) << "job never ran with both ranks reporting steps: "
                       << Status(coord, job).raw << coord.Log();
  WriteFile(dir + "/metrics.txt", metrics);
  Result lint = Exec({"/bin/sh", "-c", promtool + " check metrics < " + dir + "/metrics.txt"}, 30s);
  EXPECT_EQ(lint.code, 0) << "promtool check metrics rejected /metrics:\n"
                          << lint.out << lint.err << "\n" << metrics.substr(0, 3000);

  // Every dashboard expression and recording rule: at least one series
  // (rate() over [1m] needs two scrapes; rules need an evaluation after).
  std::map<std::string, int> counts;
  std::map<std::string, std::string> errors;
  auto missing = [&] {
    std::vector<std::string> m;
    for (const auto& e : exprs) {
      if (gpu_only.count(e.title)) continue;
      std::string err;
      int n = prom.Query(e.expr, &err);
      counts[e.expr] = n;
      if (n < 0) errors[e.expr] = err;
      if (n < 1) m.push_back(e.title + ": " + e.expr + (n < 0 ? " (" + err + ")" : ""));
    }
    for (const auto& r : records) {
      std::string err;
      int n = prom.Query(r, &err);
      counts[r] = n;
      if (n < 0) errors[r] = err;
      if (n < 1) m.push_back("rule " + r + (n < 0 ? " (" + err + ")" : ""));
    }
    return m;
  };
  std::vector<std::string> left;
  auto deadline = Clock::now() + 40s;
  while (true) {
    left = missing();
    if (left.empty() || Clock::now() > deadline) break;
    std::this_thread::sleep_for(1s);
  }
  int checked = 0;
  for (const auto& e : exprs) {
    if (gpu_only.count(e.title)) {
      // Absent, not zero: CPU ranks export no GPU series at all.
      std::string err;
      int n = prom.Query(e.expr, &err);
      EXPECT_EQ(n, 0) << "GPU panel \"" << e.title << "\" has series on a CPU-only job: "
                      << e.expr << " " << err;
      std::fprintf(stderr, "  SKIP  %-34s %s  (2-rank CPU job: no GPU, so no dgca_gpu_* series; "
                           "checked it returns 0 series: %d)\n",
                   e.title.c_str(), e.expr.c_str(), n);
      continue;
    }
    ++checked;
    std::fprintf(stderr, "  %4d  %-34s %s\n", counts[e.expr], e.title.c_str(), e.expr.c_str());
  }
  for (const auto& r : records) {
    ++checked;
    std::fprintf(stderr, "  %4d  %-34s %s\n", counts[r], "recording rule", r.c_str());
  }
  std::fprintf(stderr, "%d expressions/rules checked, %zu GPU-only skipped\n", checked,
               static_cast<size_t>(std::count_if(exprs.begin(), exprs.end(), [&](const PanelExpr& e) {
                 return gpu_only.count(e.title) > 0;
               })));
  std::string why;
  for (const auto& m : left) why += "  " + m + "\n";
  EXPECT_TRUE(left.empty()) << "no series after 40 s for:\n" << why << "Prometheus log:\n"
                            << prom.Log();
  for (const auto& [expr, err] : errors) ADD_FAILURE() << "query failed: " << expr << ": " << err;
  ASSERT_EQ(Status(coord, job).state, "RUNNING") << "the checks above need a job that trains";

  // Prometheus scraped the job while it trained (a step below the last one).
  double first = prom.Scalar("min(min_over_time(dgca_train_step{job=\"" + job + "\"}[5m]))");
  EXPECT_LT(first, kSteps) << "Prometheus saw no sample of the job before its last step";
  // Our `job` label survived (honor_labels) and the template variables work.
  EXPECT_EQ(prom.Query("dgca_train_step{job=\"" + job + "\"}"), 2);
  EXPECT_GE(prom.Query("dgca_worker_heartbeat_age_seconds"), 1);
  EXPECT_EQ(prom.Scalar("max(dgca_train_target_steps{job=\"" + job + "\"})"), kSteps);
  // The job's state series says RUNNING while it trains (the alerts watch
  // only RUNNING jobs through it).
  EXPECT_NE(metrics.find("dgca_job_state{job=\"" + job + "\",state=\"RUNNING\"} 1"), std::string::npos)
      << metrics.substr(0, 3000);
  // Every alerting rule of rules.yml was evaluated against the real series
  // without an error, and none fires for this healthy job. (Pending is
  // possible: this tiny 2-rank CPU model can expose more than 25% of its
  // step to communication, and the alert would fire after 10 minutes. The
  // alerts' firing cases are promtool unit tests: tests/deploy/rules_test.yml.)
  {
    auto rules = ParseJson(HttpGet(prom.address(), "/api/v1/rules?type=alert"), "prometheus /api/v1/rules");
    ASSERT_TRUE(rules.ok()) << rules.status().ToString();
    int alerting = 0;
    const JsonValue* data = rules->Find("data");
    const JsonValue* groups = data ? data->Find("groups") : nullptr;
    ASSERT_TRUE(groups && groups->is_array());
    for (const JsonValue& g : groups->array) {
      const JsonValue* rs = g.Find("rules");
      if (!rs || !rs->is_array()) continue;
      for (const JsonValue& r : rs->array) {
        ++alerting;
        EXPECT_EQ(JsonStr(r.Find("health")), "ok")
            << JsonStr(r.Find("name")) << ": " << JsonStr(r.Find("lastError"));
        EXPECT_NE(JsonStr(r.Find("state")), "firing") << JsonStr(r.Find("name"));
      }
    }
    EXPECT_GE(alerting, 6) << "the alerting rules of rules.yml were not loaded";
  }
  // A misspelled metric in an alert evaluates to nothing without an error:
  // every metric rules.yml names must have a series (the job still trains).
  for (const std::string& name : MetricNames(rules)) {
    std::string err;
    EXPECT_GE(prom.Query(name, &err), 1) << "rules.yml names " << name << ", which has no series " << err;
  }

  // Cancelled, the job's live series go from /metrics, so from Prometheus
  // too (a stale marker at the next scrape); its state series says so.
  Result cancel = Dgca(coord, {"cancel", job}, 60s);
  ASSERT_EQ(cancel.code, 0) << cancel.out << cancel.err;
  ASSERT_TRUE(WaitUntil([&] { return Status(coord, job).state == "CANCELLED"; }, 30s))
      << Status(coord, job).raw;
  metrics = HttpGet(coord.metrics(), "/metrics");
  EXPECT_EQ(metrics.find("dgca_train_step{job=\"" + job + "\""), std::string::npos) << metrics.substr(0, 3000);
  EXPECT_EQ(metrics.find("dgca_train_samples_per_second{job=\"" + job + "\""), std::string::npos);
  EXPECT_EQ(metrics.find("dgca_job_samples_per_second{job=\"" + job + "\""), std::string::npos);
  EXPECT_NE(metrics.find("dgca_job_state{job=\"" + job + "\",state=\"CANCELLED\"} 1"), std::string::npos);
  EXPECT_TRUE(WaitUntil([&] { return prom.Query("dgca_train_samples_per_second{job=\"" + job + "\"}") == 0; }, 10s))
      << "Prometheus still has the cancelled job's samples/s";
  EXPECT_TRUE(WaitUntil(
      [&] { return prom.Query("job:dgca_train_samples_per_second:sum{job=\"" + job + "\"}") == 0; }, 10s))
      << "the job-throughput rule still sums the cancelled job";

  // A short job followed to its end with `dgca watch` (not a TTY: plain
  // periodic lines).
  const int kShort = 60;
  Result sub2 = Dgca(coord, {"submit", WriteTinySpec(dir, "prom-short", kShort)});
  ASSERT_EQ(sub2.code, 0) << sub2.out << sub2.err;
  const std::string done = Trim(sub2.out);
  Result watch = Dgca(coord, {"watch", done}, 120s);
  ASSERT_EQ(watch.code, 0) << watch.out << watch.err << coord.Log();
  EXPECT_NE(watch.out.find("SUCCEEDED"), std::string::npos) << watch.out;
  // The final screen: full bar, the final loss and the loss sparkline, comm
  // share, rank rows.
  EXPECT_NE(watch.err.find("100%  step " + std::to_string(kShort) + "/" + std::to_string(kShort)),
            std::string::npos) << watch.err;
  EXPECT_NE(watch.err.find("loss      final "), std::string::npos) << watch.err;
  EXPECT_NE(watch.err.find("(last 30 steps)"), std::string::npos) << watch.err;
  EXPECT_NE(watch.err.find("comm      exposed"), std::string::npos) << watch.err;
  EXPECT_NE(watch.err.find("exit 0"), std::string::npos) << watch.err;
  std::fprintf(stderr, "dgca watch (stderr, not a TTY):\n%s\n", watch.err.c_str());
  // (watch returns at the SUCCEEDED event; Prometheus sees it at its next scrape.)
  EXPECT_TRUE(WaitUntil(
      [&] { return prom.Query("dgca_job_state{job=\"" + done + "\",state=\"SUCCEEDED\"} == 1") >= 1; }, 10s))
      << "dgca_job_state never said SUCCEEDED";
  // Its final loss is a gauge of the ended job, the figure `dgca status` says.
  EXPECT_TRUE(WaitUntil([&] { return prom.Query("dgca_job_final_loss{job=\"" + done + "\"}") == 1; }, 10s));
  auto st = Json(Dgca(coord, {"status", "--json", done}).out);
  ASSERT_TRUE(st.ok());
  const JsonValue* fl = st->Find("job") ? st->Find("job")->Find("final_loss") : nullptr;
  ASSERT_NE(fl, nullptr);
  EXPECT_NEAR(prom.Scalar("dgca_job_final_loss{job=\"" + done + "\"}"), fl->number, 1e-9);

  prom.Stop();
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
