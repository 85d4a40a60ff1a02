// The scheduler's lifecycle without gRPC and without sleeping: the test is
// the node agent (an AgentConnection that records the commands it is sent)
// and the ranks (it calls RankExited, RankHeartbeat, IngestSample), and it
// moves a FakeClock and calls Tick() where the tick thread would run.
#include "coordinator/scheduler.h"

#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/clock.h"
#include "coordinator/metrics_hub.h"
#include "gtest/gtest.h"
#include "model/core/exit_codes.h"
#include "spec/spec.h"

namespace dgca {
namespace {

std::string Spec(int max_restarts = 0, int ranks = 2) {
  return absl::StrCat("name: t\ntrain: {steps: 10, max_restarts: ", max_restarts,
                      "}\nresources: {ranks: ", ranks, ", device: cpu}\n");
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dgca-scheduler-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Open();
  }
  void TearDown() override {
    sched_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Open() {
    SchedulerOptions o;
    o.state_dir = dir_;
    o.clock = &clock_;
    o.heartbeat_timeout_s = 30;
    o.stop_grace_s = 3;
    o.restart_node_wait_s = 60;
    auto s = Scheduler::Create(o, &hub_);
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(*s);
  }

  // Registers node `node` (2 CPUs, 8 GiB) as an agent whose commands land
  // in commands_.
  void Connect(const std::string& node = "n1") {
    conn_ = std::make_shared<AgentConnection>([this](const v1::CoordinatorCommand& c) {
      commands_.push_back(c);
      return true;
    });
    v1::RegisterAgent reg;
    reg.set_node(node);
    reg.mutable_topology()->set_node(node);
    reg.mutable_topology()->set_cpu_count(2);
    reg.mutable_topology()->set_memory_bytes(8ull << 30);
    ASSERT_TRUE(sched_->AgentRegistered(reg, "test", conn_).ok());
  }

  std::string Submit(const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    req.set_spec_path("t.yaml");
    auto r = sched_->Submit(req);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->problems_size(), 0) << r->problems(0).message();
    return r->job_id();
  }

  // Connects node n1, submits a 2-rank job and runs it: its two launches
  // are taken. Returns the job id.
  std::string RunningJob(int max_restarts = 0) {
    Connect();
    const std::string id = Submit(Spec(max_restarts));
    sched_->Tick();
    EXPECT_EQ(TakeLaunches().size(), 2u);
    EXPECT_EQ(Job(id).state(), v1::RUNNING);
    return id;
  }

  v1::Job Job(const std::string& id) {
    auto j = sched_->GetJob(id);
    EXPECT_TRUE(j.ok()) << j.status();
    return j->job();
  }
  std::vector<v1::JobEvent> Events(const std::string& id) {
    auto j = sched_->GetJob(id);
    return {j->events().begin(), j->events().end()};
  }
  bool HasEvent(const std::string& id, const std::string& kind, const std::string& text) {
    for (const auto& e : Events(id))
      if (e.kind() == kind && absl::StrContains(e.message(), text)) return true;
    return false;
  }

  // The launches and stops sent since the last call.
  std::vector<v1::LaunchRank> TakeLaunches() {
    std::vector<v1::LaunchRank> out;
    for (const auto& c : commands_)
      if (c.has_launch()) out.push_back(c.launch());
    commands_.clear();
    return out;
  }
  int CountStops() {
    int n = 0;
    for (const auto& c : commands_) n += c.has_stop();
    return n;
  }

  void Exit(const std::string& id, int rank, int attempt, int code, int signal = 0,
            const std::string& last_output = "") {
    v1::RankExited e;
    e.set_job_id(id);
    e.set_rank(rank);
    e.set_attempt(attempt);
    e.set_exit_code(code);
    e.set_signal(signal);
    e.set_message(last_output);
    sched_->RankExited("n1", e);
  }
  v1::RankHeartbeatResponse Heartbeat(const std::string& id, int rank, int attempt,
                                      int64_t step = 1) {
    v1::RankHeartbeatRequest hb;
    hb.set_job_id(id);
    hb.set_rank(rank);
    hb.set_attempt(attempt);
    hb.set_step(step);
    return sched_->RankHeartbeat(hb);
  }
  void Step(const std::string& id, int rank, int attempt, int64_t step) {
    v1::MetricSample s;
    v1::StepMetrics* m = s.mutable_step();
    m->set_job_id(id);
    m->set_rank(rank);
    m->set_attempt(attempt);
    m->set_step(step);
    m->set_total_steps(10);
    m->set_loss(2.0);
    m->set_step_seconds(0.1);
    m->set_samples_per_second(100);
    sched_->IngestSample(s, "");
  }

  std::string dir_;
  FakeClock clock_;
  MetricsHub hub_;
  std::unique_ptr<Scheduler> sched_;
  std::shared_ptr<AgentConnection> conn_;
  std::vector<v1::CoordinatorCommand> commands_;
};

TEST_F(SchedulerTest, WaitsForAnAgentThenRunsToSuccess) {
  const std::string id = Submit(Spec());
  sched_->Tick();
  EXPECT_EQ(Job(id).state(), v1::PENDING);
  EXPECT_EQ(Job(id).message(), "waiting for a node agent");

  Connect();
  sched_->Tick();
  v1::Job j = Job(id);
  ASSERT_EQ(j.state(), v1::RUNNING) << j.message();
  std::vector<v1::LaunchRank> launches = TakeLaunches();
  ASSERT_EQ(launches.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(launches[r].job_id(), id);
    EXPECT_EQ(launches[r].rank(), r);
    EXPECT_EQ(launches[r].world_size(), 2);
    EXPECT_EQ(launches[r].attempt(), 0);
  }
  EXPECT_TRUE(HasEvent(id, "plan", "ranks=2 device=cpu backend=gloo"));

  v1::GetAssignmentRequest a;
  a.set_job_id(id);
  a.set_rank(1);
  auto assignment = sched_->GetAssignment(a);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  EXPECT_EQ(assignment->world_size(), 2);
  EXPECT_EQ(assignment->plan().ranks(), 2);
  EXPECT_EQ(assignment->checkpoint_dir(), dir_ + "/jobs/" + id + "/checkpoints");

  for (int step = 1; step <= 10; ++step) {
    Step(id, 0, 0, step);
    Step(id, 1, 0, step);
  }
  j = Job(id);
  EXPECT_EQ(j.step(), 10);
  EXPECT_EQ(j.ranks_size(), 2);
  EXPECT_DOUBLE_EQ(j.samples_per_second(), 200);

  Exit(id, 0, 0, 0);
  EXPECT_EQ(Job(id).state(), v1::RUNNING);  // rank 1 still runs
  Exit(id, 1, 0, 0);
  j = Job(id);
  EXPECT_EQ(j.state(), v1::SUCCEEDED);
  EXPECT_EQ(j.message(), "all 2 ranks exited 0");
  EXPECT_TRUE(sched_->IsTerminal(id));
  // The review of the plan against the 8 steady-state steps of each rank.
  EXPECT_EQ(j.plan_check().samples(), 16);
}

TEST_F(SchedulerTest, AFailedRankRestartsTheJobThenFailsItWhenRestartsRunOut) {
  const std::string id = RunningJob(/*max_restarts=*/1);

  Exit(id, 1, 0, 1);
  // The other rank is told to stop; the job is still running until it has.
  EXPECT_EQ(CountStops(), 1);
  EXPECT_TRUE(HasEvent(id, "rank_exit", "rank 1 on node n1 exited with code 1"));
  EXPECT_TRUE(HasEvent(id, "stop", "(restart)"));
  EXPECT_TRUE(Heartbeat(id, 0, 0).stop());
  Exit(id, 0, 0, 0, SIGTERM);
  sched_->Tick();
  std::vector<v1::LaunchRank> again = TakeLaunches();
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].attempt(), 1);
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::RUNNING);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_TRUE(HasEvent(id, "restart", "restart 1 of 1 (attempt 1) after: rank 1 on node n1"));
  // The old attempt is stale now.
  EXPECT_TRUE(Heartbeat(id, 0, 0).stop());
  EXPECT_FALSE(Heartbeat(id, 0, 1).stop());

  Exit(id, 0, 1, kExitFailed);
  Exit(id, 1, 1, 0, SIGTERM);
  sched_->Tick();
  j = Job(id);
  EXPECT_EQ(j.state(), v1::FAILED);
  EXPECT_TRUE(absl::StartsWith(j.message(), "rank 0 on node n1 exited with code 1 (after 1 "
                                            "restarts; train.max_restarts is 1)"))
      << j.message();
  EXPECT_TRUE(TakeLaunches().empty());
}

// The restart count belongs to the headline, not after the rank's last
// output lines (it used to come at the very end of the message).
TEST_F(SchedulerTest, AFailureMessageCountsRestartsBeforeTheRanksOutput) {
  const std::string id = RunningJob(/*max_restarts=*/1);
  Exit(id, 1, 0, 1, 0, "loading data\nerror: out of memory");
  Exit(id, 0, 0, 0, SIGTERM);
  sched_->Tick();
  ASSERT_EQ(TakeLaunches().size(), 2u);
  Exit(id, 1, 1, 1, 0, "loading data\nerror: out of memory");
  Exit(id, 0, 1, 0, SIGTERM);
  sched_->Tick();
  const v1::Job j = Job(id);
  ASSERT_EQ(j.state(), v1::FAILED);
  EXPECT_EQ(j.message(),
            "rank 1 on node n1 exited with code 1 (after 1 restarts; train.max_restarts is 1); "
            "last output:\nloading data\nerror: out of memory");
}

TEST_F(SchedulerTest, ARankThatGoesSilentIsStalledAfterTheHeartbeatTimeout) {
  const std::string id = RunningJob();
  // Rank 0 keeps calling in; rank 1 says nothing.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(9.9);
    EXPECT_FALSE(Heartbeat(id, 0, 0).stop());
    sched_->Tick();
  }
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(CountStops(), 0);
  clock_.Advance(0.5);  // rank 1: 30.2 s of silence
  sched_->Tick();
  EXPECT_TRUE(HasEvent(id, "rank_exit", "rank 1 on node n1 made no progress for 30 s"));
  EXPECT_EQ(CountStops(), 1);
  // Neither rank reports its end: the stop completes at its deadline
  // (grace 3 s + 5 s).
  clock_.Advance(7.9);
  sched_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  clock_.Advance(0.2);
  sched_->Tick();
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(j.message(), "made no progress")) << j.message();
  for (const auto& r : j.ranks()) EXPECT_NE(r.state(), "running") << r.rank();
}

// A heartbeat carrying the rank's phase (as rank_main sends it).
v1::RankHeartbeatRequest PhaseBeat(const std::string& id, int rank, v1::RankPhaseKind kind,
                                   int64_t step, double seconds, int index = 0, int count = 0) {
  v1::RankHeartbeatRequest hb;
  hb.set_job_id(id);
  hb.set_rank(rank);
  hb.set_attempt(0);
  hb.set_step(step - 1);
  hb.set_heartbeat_interval_seconds(2);
  hb.mutable_phase()->set_kind(kind);
  hb.mutable_phase()->set_step(step);
  hb.mutable_phase()->set_seconds(seconds);
  hb.mutable_phase()->set_index(index);
  hb.mutable_phase()->set_count(count);
  hb.mutable_phase()->set_bytes(count > 0 ? 2000000 : 0);
  return hb;
}

// An agent speaks for the ranks of its own node only: an exit of rank 0
// (on n1) reported by n2's agent, which holds the same agent token, is
// ignored; n1's report of it counts.
TEST_F(SchedulerTest, AnotherNodesAgentCannotEndARank) {
  const std::string id = RunningJob();
  v1::RankExited e;
  e.set_job_id(id);
  e.set_rank(0);
  e.set_attempt(0);
  e.set_exit_code(1);
  sched_->RankExited("n2", e);
  sched_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).ranks(0).state(), "starting");
  EXPECT_EQ(CountStops(), 0);
  sched_->RankExited("n1", e);
  sched_->Tick();
  EXPECT_EQ(Job(id).ranks(0).state(), "failed");
  EXPECT_GE(CountStops(), 1);
}

// train.progress_timeout_s: rank 1 waits for its data while its heartbeat
// thread runs; rank 0 waits in the all-reduce. The attempt fails at the
// timeout, naming rank 1, and meanwhile the job shows both phases.
TEST_F(SchedulerTest, ARankStuckInOnePhaseFailsAfterTheProgressTimeout) {
  Connect();
  const std::string id = Submit("name: t\ntrain: {steps: 10, progress_timeout_s: 10}\n"
                                "resources: {ranks: 2, device: cpu}\n");
  sched_->Tick();
  ASSERT_EQ(TakeLaunches().size(), 2u);
  double t = 0;
  for (int i = 0; i < 4; ++i) {  // 8 s in
    clock_.Advance(2);
    t += 2;
    EXPECT_FALSE(sched_->RankHeartbeat(PhaseBeat(id, 0, v1::RANK_PHASE_ALL_REDUCE, 4, t - 0.2, 1, 2)).stop());
    EXPECT_FALSE(sched_->RankHeartbeat(PhaseBeat(id, 1, v1::RANK_PHASE_DATA, 4, t)).stop());
    sched_->Tick();
  }
  clock_.Advance(1.5);
  sched_->Tick();
  EXPECT_EQ(CountStops(), 0);
  v1::Job j = Job(id);
  ASSERT_EQ(j.ranks_size(), 2);
  EXPECT_EQ(j.ranks(1).phase().kind(), v1::RANK_PHASE_DATA);
  EXPECT_DOUBLE_EQ(j.ranks(1).phase().seconds(), 9.5);  // 8 s reported + 1.5 s since
  EXPECT_EQ(j.ranks(0).phase().index(), 1);
  clock_.Advance(0.6);  // rank 1: 10.1 s without progress
  sched_->Tick();
  EXPECT_EQ(CountStops(), 1);
  EXPECT_TRUE(HasEvent(id, "rank_exit",
                       "rank 1 (node n1) stuck 10 s waiting for data (loader) in step 4; rank 0 "
                       "(node n1) waiting 9.9 s in all-reduce 1/2 of step 4 (2.0 MB) (no progress "
                       "within train.progress_timeout_s, 10 s)"))
      << (Events(id).empty() ? "" : Events(id).back().message());
}

// A frozen rank (SIGSTOP) sends nothing: its last phase ages, and it is
// named as silent. With the progress timeout off, the heartbeat timeout
// still names the phase it was last in.
TEST_F(SchedulerTest, AFrozenRankIsNamedWithItsLastPhase) {
  Connect();
  const std::string id = Submit("name: t\ntrain: {steps: 10, progress_timeout_s: 10}\n"
                                "resources: {ranks: 2, device: cpu}\n");
  sched_->Tick();
  ASSERT_EQ(TakeLaunches().size(), 2u);
  clock_.Advance(2);
  sched_->RankHeartbeat(PhaseBeat(id, 0, v1::RANK_PHASE_FORWARD, 7, 0.1));
  sched_->RankHeartbeat(PhaseBeat(id, 1, v1::RANK_PHASE_BACKWARD, 7, 0.3));
  for (int i = 1; i <= 4; ++i) {  // rank 1 frozen from here; rank 0 waits for it
    clock_.Advance(2);
    sched_->RankHeartbeat(PhaseBeat(id, 0, v1::RANK_PHASE_ALL_REDUCE, 7, 2.0 * i - 1, 3, 4));
    sched_->Tick();
  }
  EXPECT_EQ(CountStops(), 0);
  clock_.Advance(2);  // rank 1: 10 s silent, 10.3 s without progress
  sched_->Tick();
  EXPECT_EQ(CountStops(), 1);
  EXPECT_TRUE(HasEvent(id, "rank_exit",
                       "rank 1 (node n1) stuck: no heartbeat for 10 s, last in backward of step 7 "
                       "(no progress for 10 s); rank 0 (node n1) waiting 9.0 s in all-reduce 3/4 "
                       "of step 7 (2.0 MB)"))
      << (Events(id).empty() ? "" : Events(id).back().message());
}

// With the default progress timeout (300 s) the collective's own timeout
// (60 s) ends the waiting rank first: its failure names the stuck one.
TEST_F(SchedulerTest, ARankFailingWhileAnotherIsStuckNamesIt) {
  const std::string id = RunningJob();
  for (int i = 1; i <= 30; ++i) {
    clock_.Advance(2);
    sched_->RankHeartbeat(PhaseBeat(id, 0, v1::RANK_PHASE_ALL_REDUCE, 4, 2.0 * i, 1, 2));
    sched_->RankHeartbeat(PhaseBeat(id, 1, v1::RANK_PHASE_DATA, 4, 2.0 * i + 0.1));
    sched_->Tick();
  }
  EXPECT_EQ(CountStops(), 0);
  Exit(id, 0, 0, 1, 0, "error: gloo allreduce timed out");
  EXPECT_TRUE(HasEvent(id, "rank_exit",
                       "rank 0 on node n1 exited with code 1; meanwhile rank 1 (node n1) stuck 60 s "
                       "waiting for data (loader) in step 4; last output:\nerror: gloo allreduce "
                       "timed out"))
      << (Events(id).empty() ? "" : Events(id).back().message());
}

TEST_F(SchedulerTest, ARankFailingWhileTheOthersProgressSaysNothingMore) {
  const std::string id = RunningJob();
  clock_.Advance(2);
  sched_->RankHeartbeat(PhaseBeat(id, 0, v1::RANK_PHASE_FORWARD, 4, 0.2));
  sched_->RankHeartbeat(PhaseBeat(id, 1, v1::RANK_PHASE_BACKWARD, 4, 0.1));
  clock_.Advance(1);
  Exit(id, 0, 0, 1, 0, "error: out of memory");
  EXPECT_TRUE(HasEvent(id, "rank_exit",
                       "rank 0 on node n1 exited with code 1; last output:\nerror: out of memory"))
      << (Events(id).empty() ? "" : Events(id).back().message());
}

// With the progress timeout off, a frozen rank trips the heartbeat timeout
// (30 s), whose message names the phase it was last in.
TEST_F(SchedulerTest, TheHeartbeatTimeoutNamesTheLastPhase) {
  Connect();
  const std::string id = Submit("name: t\ntrain: {steps: 10, progress_timeout_s: 0}\n"
                                "resources: {ranks: 2, device: cpu}\n");
  sched_->Tick();
  ASSERT_EQ(TakeLaunches().size(), 2u);
  sched_->RankHeartbeat(PhaseBeat(id, 1, v1::RANK_PHASE_CHECKPOINT, 5, 1.2));
  for (int i = 1; i <= 3; ++i) {  // rank 0 in the barrier for minutes: no progress timeout
    clock_.Advance(i < 3 ? 10 : 10.5);
    sched_->RankHeartbeat(PhaseBeat(id, 0, v1::RANK_PHASE_CHECKPOINT_BARRIER, 5, 10.0 * i));
    sched_->Tick();
  }
  EXPECT_EQ(CountStops(), 1);
  EXPECT_TRUE(HasEvent(id, "rank_exit",
                       "rank 1 on node n1 made no progress for 30 s (no heartbeat or step; timeout "
                       "30 s), last writing the checkpoint of step 5 (no progress for 32 s)"))
      << (Events(id).empty() ? "" : Events(id).back().message());
}

TEST_F(SchedulerTest, CancelStopsTheRanksAndEndsCancelled) {
  const std::string id = RunningJob();
  auto c = sched_->Cancel(id, std::chrono::milliseconds(0));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), v1::RUNNING);  // stopping
  EXPECT_EQ(CountStops(), 1);
  EXPECT_TRUE(Heartbeat(id, 0, 0).stop());
  Exit(id, 0, 0, kExitStopped);
  Exit(id, 1, 0, 0, SIGTERM);
  sched_->Tick();
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::CANCELLED);
  EXPECT_EQ(j.message(), "cancelled by user");
  // Ranks that ended on the cancel's stop read so, not "failed".
  ASSERT_EQ(j.ranks_size(), 2);
  for (const auto& r : j.ranks()) EXPECT_EQ(r.state(), "cancelled") << r.rank();
  // Again: not an error; the job as it ended, and said to have ended.
  bool already_ended = false;
  auto again = sched_->Cancel(id, std::chrono::milliseconds(0), &already_ended);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(already_ended);
  EXPECT_EQ(again->state(), v1::CANCELLED);
}

// dgca delete: an active job is refused; an ended one loses its record,
// events and directory under the state dir; a second delete is NOT_FOUND.
TEST_F(SchedulerTest, DeleteRemovesAnEndedJobAndRefusesAnActiveOne) {
  const std::string id = RunningJob();
  auto active = sched_->DeleteJob(id);
  ASSERT_FALSE(active.ok());
  EXPECT_EQ(active.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(active.status().message(),
                                absl::StrCat("job ", id, " is RUNNING: only a job that has ended "
                                             "can be deleted; cancel it first (dgca cancel ")))
      << active.status();
  const std::string job_dir = dir_ + "/jobs/" + id;
  std::filesystem::create_directories(job_dir + "/checkpoints/step-00000010");
  std::ofstream(job_dir + "/rank-0.log") << std::string(1000, 'x');
  std::ofstream(job_dir + "/checkpoints/step-00000010/model.safetensors") << std::string(24, 'w');
  Exit(id, 0, 0, 0);
  Exit(id, 1, 0, 0);
  ASSERT_EQ(Job(id).state(), v1::SUCCEEDED);
  auto d = sched_->DeleteJob(id);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->job().state(), v1::SUCCEEDED);
  EXPECT_EQ(d->removed_dir(), job_dir);
  EXPECT_EQ(d->removed_bytes(), 1024);
  EXPECT_FALSE(std::filesystem::exists(job_dir));
  EXPECT_EQ(sched_->GetJob(id).status().code(), absl::StatusCode::kNotFound);
  auto listed = sched_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(sched_->DeleteJob(id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, CancelOfAQueuedJobIsImmediate) {
  const std::string id = Submit(Spec());
  auto c = sched_->Cancel(id, std::chrono::milliseconds(0));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), v1::CANCELLED);
  Connect();
  sched_->Tick();
  EXPECT_TRUE(TakeLaunches().empty());
}

TEST_F(SchedulerTest, ARestartWaitsForItsNodeThenGivesUp) {
  const std::string id = RunningJob(/*max_restarts=*/2);
  Exit(id, 0, 0, 1);
  // The node's agent goes away before the other rank reports.
  sched_->AgentDisconnected("n1", conn_);
  clock_.Advance(8.1);
  sched_->Tick();
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::PLANNING);
  EXPECT_TRUE(absl::StrContains(j.message(), "node n1 (rank 0) is not connected")) << j.message();
  EXPECT_TRUE(absl::StrContains(j.message(), "restart 1 of 2 waits for it (up to 60 s)"))
      << j.message();
  clock_.Advance(59);
  sched_->Tick();
  EXPECT_EQ(Job(id).state(), v1::PLANNING);
  clock_.Advance(2);
  sched_->Tick();
  j = Job(id);
  EXPECT_EQ(j.state(), v1::FAILED);
  EXPECT_TRUE(absl::StartsWith(j.message(), "cannot restart after: rank 0 on node n1 exited with "
                                            "code 1"))
      << j.message();
}

TEST_F(SchedulerTest, ARestartLaunchesWhenItsNodeComesBack) {
  const std::string id = RunningJob(/*max_restarts=*/1);
  Exit(id, 0, 0, 1);
  sched_->AgentDisconnected("n1", conn_);
  clock_.Advance(8.1);
  sched_->Tick();
  ASSERT_EQ(Job(id).state(), v1::PLANNING);
  Connect();  // the agent is back
  // It is asked to adopt and stop rank 1 of attempt 0, which never reported.
  bool adopted = false, stopped_old = false;
  for (const auto& c : commands_) {
    if (c.has_adopt())
      for (const auto& r : c.adopt().ranks()) adopted |= r.rank() == 1 && r.attempt() == 0;
    if (c.has_stop())
      for (int a : c.stop().attempts()) stopped_old |= a == 0;
  }
  EXPECT_TRUE(adopted);
  EXPECT_TRUE(stopped_old);
  sched_->Tick();
  std::vector<v1::LaunchRank> again = TakeLaunches();
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].attempt(), 1);
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_TRUE(HasEvent(id, "restart", "restart 1 of 1 (attempt 1)"));
}

// The agent says it is stopping (AgentLeaving) and its ranks die with it,
// the stream still open: the restart must not be launched back onto it (the
// launch would be lost with the stream moments later); it waits for the
// node to register again.
TEST_F(SchedulerTest, ARestartIsNotLaunchedOntoALeavingAgent) {
  const std::string id = RunningJob(/*max_restarts=*/1);
  v1::AgentLeaving leaving;
  leaving.set_reason("the agent is stopping");
  sched_->AgentLeaving("n1", conn_, leaving);
  v1::RankExited e;
  e.set_job_id(id);
  e.set_attempt(0);
  e.set_exit_code(-1);
  e.set_signal(SIGTERM);
  e.set_agent_leaving(true);
  for (int r = 0; r < 2; ++r) {
    e.set_rank(r);
    sched_->RankExited("n1", e);
  }
  EXPECT_TRUE(HasEvent(id, "rank_exit", "killed by signal 15 (Terminated) while its agent was "
                                        "stopping"));
  sched_->Tick();
  EXPECT_TRUE(TakeLaunches().empty());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::PLANNING);
  EXPECT_TRUE(absl::StrContains(j.message(), "node n1 (rank 0) is leaving (its agent is stopping)"))
      << j.message();
  Connect();  // a new agent on the node
  sched_->Tick();
  ASSERT_EQ(TakeLaunches().size(), 2u);
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).restarts(), 1);
}

// A frozen agent (SIGSTOP) keeps its stream open but sends no heartbeat:
// after the heartbeat timeout it is "silent", gets no ranks (a restart waits
// for it rather than being sent into a stream nobody reads), and is used
// again once heard.
TEST_F(SchedulerTest, ASilentAgentGetsNoRanksUntilItIsHeardAgain) {
  const std::string id = RunningJob(/*max_restarts=*/1);
  for (int i = 0; i < 4; ++i) {  // the ranks call in; the agent says nothing
    clock_.Advance(8);
    for (int r = 0; r < 2; ++r) Heartbeat(id, r, 0);
    sched_->Tick();
  }
  const auto nodes = sched_->ListNodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].state(), "silent");
  EXPECT_TRUE(nodes[0].connected());
  EXPECT_EQ(Job(id).state(), v1::RUNNING);  // its ranks train on
  Exit(id, 0, 0, 1);
  Exit(id, 1, 0, 0, SIGTERM);
  sched_->Tick();
  EXPECT_TRUE(TakeLaunches().empty());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::PLANNING);
  EXPECT_TRUE(absl::StrContains(j.message(), "node n1 (rank 0) is silent")) << j.message();
  v1::AgentHeartbeat hb;
  sched_->AgentHeartbeat("n1", hb);
  EXPECT_EQ(sched_->ListNodes()[0].state(), "connected");
  sched_->Tick();
  ASSERT_EQ(TakeLaunches().size(), 2u);
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
}

// An agent resumed after a freeze may run ranks no active attempt owns (a
// launch it read late, a stop it missed): its next heartbeat lists them and
// they are stopped, attempt by attempt; the current attempt's are left.
TEST_F(SchedulerTest, AHeartbeatListingStaleRanksStopsThem) {
  const std::string id = RunningJob(/*max_restarts=*/1);
  Exit(id, 0, 0, 1);
  Exit(id, 1, 0, 0, SIGTERM);
  sched_->Tick();
  ASSERT_EQ(TakeLaunches().size(), 2u);  // attempt 1
  commands_.clear();
  v1::AgentHeartbeat hb;
  for (int attempt : {0, 1}) {
    v1::RunningRank* r = hb.add_running();
    r->set_job_id(id);
    r->set_rank(0);
    r->set_attempt(attempt);
    r->set_pid(100 + attempt);
  }
  v1::RunningRank* gone = hb.add_running();
  gone->set_job_id("j-ended");
  gone->set_rank(0);
  gone->set_attempt(3);
  sched_->AgentHeartbeat("n1", hb);
  std::map<std::string, std::set<int>> stopped;
  for (const auto& c : commands_) {
    if (c.has_stop()) {
      for (int a : c.stop().attempts()) stopped[c.stop().job_id()].insert(a);
    }
  }
  EXPECT_EQ(stopped[id], std::set<int>({0}));
  EXPECT_EQ(stopped["j-ended"], std::set<int>({3}));
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
}

TEST_F(SchedulerTest, ARestartedSchedulerReadoptsARunningJob) {
  const std::string id = RunningJob();
  v1::RunningRank r0, r1;
  for (auto* r : {&r0, &r1}) {
    r->set_job_id(id);
    r->set_attempt(0);
  }
  r0.set_rank(0);
  r0.set_pid(1000001);
  r1.set_rank(1);
  r1.set_pid(1000002);
  sched_->RecordRunning("n1", {r0, r1});
  sched_->Detach();
  sched_.reset();

  Open();  // a new coordinator on the same state dir
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  std::vector<StoredRank> recovered = sched_->RecoveredRanks();
  ASSERT_EQ(recovered.size(), 2u);
  EXPECT_EQ(recovered[1].pid, 1000002);
  EXPECT_TRUE(HasEvent(id, "info", "re-adopting attempt 0 (rank@node:pid 0@n1:1000001 "
                                   "1@n1:1000002)"));
  // The ranks call in again and finish.
  Connect();
  EXPECT_FALSE(Heartbeat(id, 0, 0).stop());
  Exit(id, 0, 0, 0);
  Exit(id, 1, 0, 0);
  EXPECT_EQ(Job(id).state(), v1::SUCCEEDED);
}

// Each LaunchRank carries the files the spec names, resolved against the
// spec's directory and located in it, for the agent to check on its node.
TEST_F(SchedulerTest, LaunchesCarryTheSpecsInputFiles) {
  Connect();
  v1::SubmitJobRequest req;
  req.set_spec_yaml(Spec() + "data:\n  train: t.txt\n  eval: /abs/e.txt\n");
  req.set_spec_path("t.yaml");
  req.set_base_dir("/jobs");
  auto r = sched_->Submit(req);  // no input_check_node: not checked here
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->problems_size(), 0);
  sched_->Tick();
  const std::vector<v1::LaunchRank> launches = TakeLaunches();
  ASSERT_EQ(launches.size(), 2u);
  for (const v1::LaunchRank& l : launches) {
    ASSERT_EQ(l.inputs_size(), 2);
    EXPECT_EQ(l.inputs(0).field(), "data.train");
    EXPECT_EQ(l.inputs(0).path(), "/jobs/t.txt");
    EXPECT_EQ(l.inputs(0).spec_file(), "t.yaml");
    EXPECT_EQ(l.inputs(0).line(), 5);
    EXPECT_EQ(l.inputs(0).column(), 10);
    EXPECT_EQ(l.inputs(1).path(), "/abs/e.txt");
  }
}

// A rank its agent did not start because files are missing on its node:
// the job fails at once with the agent's list, said once (no rank_exit
// event, no "other ranks" for the rest reporting the same), and is not
// restarted, since a restart would find the same files missing. Its
// diagnosis says why it failed, not that it ran too few steps.
TEST_F(SchedulerTest, MissingInputFilesOnANodeFailTheJobOnceWithoutARestart) {
  const std::string id = RunningJob(/*max_restarts=*/2);
  const std::string why =
      "1 input file of the job cannot be read on node n1 by its agent:\n"
      "t.yaml:4:10: data.train: /jobs/t.txt: does not exist";
  for (int rank : {0, 1}) {
    v1::RankExited e;
    e.set_job_id(id);
    e.set_rank(rank);
    e.set_exit_code(kExitUsage);
    e.set_inputs_missing(true);
    e.set_message(why);
    sched_->RankExited("n1", e);
  }
  sched_->Tick();
  const v1::Job j = Job(id);
  ASSERT_EQ(j.state(), v1::FAILED);
  EXPECT_EQ(j.message(), "cannot start the ranks: " + why);
  EXPECT_TRUE(TakeLaunches().empty()) << "restarted";
  EXPECT_EQ(j.restarts(), 0);
  for (const auto& e : Events(id)) EXPECT_NE(e.kind(), "rank_exit") << e.message();
  auto d = sched_->DiagnoseJob(id);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.status().message(),
            "job " + id + " failed before its first training step, so it has no steps to "
            "diagnose; it failed: cannot start the ranks: " + why);
}

// With input_check_node (the coordinator's embedded agent runs ranks on
// this node), Submit and dry runs refuse a spec whose files are not here,
// every one with its place in the spec, and store nothing.
TEST_F(SchedulerTest, SubmitRefusesInputFilesMissingOnTheCoordinatorsNode) {
  sched_.reset();
  SchedulerOptions o;
  o.state_dir = dir_;
  o.clock = &clock_;
  o.input_check_node = "head";
  auto s = Scheduler::Create(o, &hub_);
  ASSERT_TRUE(s.ok()) << s.status();
  sched_ = std::move(*s);
  Connect("head");  // the coordinator's own node, the only one: ranks can only run here
  v1::SubmitJobRequest req;
  req.set_spec_yaml(Spec() + "data:\n  train: t.txt\n  eval: e.txt\n");
  req.set_spec_path("t.yaml");
  req.set_base_dir(dir_);
  for (bool dry : {false, true}) {
    req.set_dry_run(dry);
    auto r = sched_->Submit(req);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->problems_size(), 2) << dry;
    EXPECT_EQ(FormatProblem(r->problems(0)).rfind("t.yaml:5:10: data.train: " + dir_ +
                                                      "/t.txt: does not exist",
                                                  0),
              0u)
        << FormatProblem(r->problems(0));
    EXPECT_NE(r->problems(0).message().find("checked on node head, the coordinator's"),
              std::string::npos)
        << r->problems(0).message();
    EXPECT_EQ(r->problems(1).field(), "data.eval");
    EXPECT_EQ(r->problems(1).line(), 6);
    EXPECT_TRUE(r->job_id().empty());
  }
  auto listed = sched_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  // With another node connected the job may run where its files are: not
  // refused here (that node's agent checks before its ranks start).
  Connect("gpu1");
  req.set_dry_run(true);
  auto elsewhere = sched_->Submit(req);
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  EXPECT_EQ(elsewhere->problems_size(), 0) << elsewhere->problems(0).message();
  // With the files there, the job is taken.
  for (const char* f : {"/t.txt", "/e.txt"}) std::ofstream(dir_ + f) << "甲\t甲\n";
  req.set_dry_run(false);
  auto r = sched_->Submit(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->problems_size(), 0) << r->problems(0).message();
  EXPECT_FALSE(r->job_id().empty());
}

}  // namespace
}  // namespace dgca
