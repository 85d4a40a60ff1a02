#include "cli/app.h"

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace cli {
namespace {

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The first argument that is neither an option nor a global option's value:
// the command the user meant ("" when there is none).
std::string FirstPositional(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return i + 1 < argc ? argv[i + 1] : "";
    if (a.size() > 1 && a[0] == '-') {
      if (a.find('=') == std::string::npos &&
          (a == "--coordinator" || a == "--token-file" || a == "--tls-ca")) {
        ++i;  // its value
      }
      continue;
    }
    return a;
  }
  return "";
}

}  // namespace

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
           bool err_is_tty) {
  CLI::App app{"dgca: submit and follow DGCA-ReLM training jobs", "dgca"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the command
  GlobalOptions g;
  g.coordinator = EnvOr("DGCA_COORDINATOR", "127.0.0.1:7600");
  g.token_file = EnvOr("DGCA_TOKEN_FILE", ".dgca/token");
  g.tls_ca_file = EnvOr("DGCA_TLS_CA", "");
  app.add_option("--coordinator", g.coordinator, "coordinator HOST:PORT (env DGCA_COORDINATOR)")
      ->capture_default_str();
  app.add_option("--token-file", g.token_file, "bearer token file (env DGCA_TOKEN_FILE)")
      ->capture_default_str();
  app.add_option("--tls-ca", g.tls_ca_file, "use TLS with this root CA (env DGCA_TLS_CA)");

  std::string spec, job, root, out_dir;
  std::vector<std::string> sets;  // submit/validate/plan --set KEY=VALUE
  bool wait = false, json = false, follow = false;
  int rank = -1;  // logs: -1 = every rank

  auto* submit = app.add_subcommand("submit", "submit a job spec");
  submit->add_option("SPEC", spec, "job spec (YAML)")->required();
  submit->add_option("--set", sets,
                     "KEY=VALUE: a spec value over the file's (train.steps=200); repeatable");
  submit->add_flag("--wait", wait, "follow the job to its end; exit 0 only if it succeeded");

  auto* resubmit = app.add_subcommand("resubmit", "submit a job's stored spec again, as a new job");
  resubmit->add_option("JOB", job, "job id")->required();
  resubmit->add_flag("--wait", wait, "follow the new job to its end; exit 0 only if it succeeded");

  auto* del = app.add_subcommand("delete", "delete jobs that have ended: record, events, files");
  std::vector<std::string> del_jobs;
  del->add_option("JOB", del_jobs, "job id(s)")->required();

  auto* validate = app.add_subcommand("validate", "check a job spec (no coordinator needed)");
  validate->add_option("SPEC", spec, "job spec (YAML)")->required();
  validate->add_option("--set", sets, "KEY=VALUE over the file's value; repeatable");
  bool spec_only = false;
  validate->add_flag("--spec-only", spec_only,
                     "check the spec alone, not the files it names (where the data is not, or "
                     "before it is built)");

  auto* plan = app.add_subcommand("plan", "dry run: the planner's choices and reasons");
  plan->add_option("SPEC", spec, "job spec (YAML)")->required();
  plan->add_option("--set", sets, "KEY=VALUE over the file's value; repeatable");
  plan->add_flag("--json", json, "one JSON document");

  auto* list = app.add_subcommand("list", "list jobs, newest first");
  ListOptions list_opt;
  list->add_flag("--json", list_opt.json, "one JSON document");
  list->add_option("--state", list_opt.states,
                   "only jobs in these states (pending, planning, running, succeeded, failed, "
                   "cancelled, active, ended; repeat or comma-separate)");
  list->add_option("--name", list_opt.name, "only jobs whose name contains this");
  list->add_option("--since", list_opt.since,
                   "only jobs created since: a span back from now (30m, 2h, 7d) or a UTC date or "
                   "time (2026-11-28, 2026-11-28T14:05)");
  list->add_option("--limit", list_opt.limit, "at most this many (0 = all)");

  auto* status = app.add_subcommand("status", "a job's state, per-rank progress, events");
  status->add_option("JOB", job, "job id")->required();
  status->add_flag("--json", json, "one JSON document");

  auto* watch = app.add_subcommand("watch", "live progress of a job until it ends");
  watch->add_option("JOB", job, "job id")->required();

  auto* logs = app.add_subcommand("logs", "the ranks' output (-f follows it)");
  logs->add_option("JOB", job, "job id")->required();
  logs->add_option("--rank", rank,
                   "one rank's log as written (default: every rank's, each line prefixed "
                   "[rank N])");
  logs->add_flag("--follow,-f", follow, "keep printing until the job ends");

  auto* cancel = app.add_subcommand("cancel", "cancel a job (stops every rank)");
  cancel->add_option("JOB", job, "job id")->required();

  auto* topo = app.add_subcommand("topo", "what the topology probe sees on this machine");
  topo->add_option("--root", root, "probe this directory tree instead of /");
  topo->add_flag("--json", json, "one JSON document");

  auto* nodes = app.add_subcommand("nodes", "the nodes registered with the coordinator");
  nodes->add_flag("--json", json, "one JSON document");
  std::string node;
  auto* forget = nodes->add_subcommand(
      "forget", "drop a disconnected node that is gone for good (list, /metrics, its alert)");
  forget->add_option("NODE", node, "node name (dgca nodes)")->required();

  auto* diagnose = app.add_subcommand(
      "diagnose", "where a job's step time goes and what limits it (dgca diagnose JOB)");
  std::string diag_job;
  bool diag_json = false;
  diagnose->add_option("JOB", diag_job, "job id (dgca list)");
  diagnose->add_flag("--json", diag_json, "one JSON document");
  DiagnoseCommOptions dco;
  auto* dcomm = diagnose->add_subcommand(
      "comm", "all-reduce bandwidth sweep as a job (like nccl-tests); stored for the planner");
  dcomm->add_option("--ranks", dco.ranks, "ranks")->capture_default_str();
  dcomm->add_option("--device", dco.device, "cpu (Gloo) | cuda (NCCL) | auto")
      ->capture_default_str();
  dcomm->add_option("--sizes", dco.sizes,
                    "sizes: LO..HI (x4), LO..HI:F, or a list 4K,1M; K/M/G suffixes");
  dcomm->add_flag("--json", dco.json, "one JSON document");

  auto* export_cmd = app.add_subcommand(
      "export", "write a job's trained model as a Hugging Face BERT directory plus the DGCA heads");
  ExportOptions eo;
  export_cmd->add_option("JOB", eo.job_id, "job id (dgca list)");
  export_cmd->add_option("--out", eo.out_dir, "directory to write the model to")->required();
  export_cmd->add_option("--checkpoint", eo.checkpoint,
                  "best (by eval; the latest when none has one), latest, or a step directory")
      ->capture_default_str();
  export_cmd->add_option("--checkpoint-dir", eo.checkpoint_dir,
                  "export this checkpoint directory (or step directory) instead of a job's");
  export_cmd->add_option("--vocab", eo.vocab, "the job's vocab.txt (default: the spec's, or beside the checkpoints)");
  export_cmd->add_option("--confusion", eo.confusion,
                  "the job's confusion set JSON (default: the spec's, or the built-in Unihan one)");
  export_cmd->add_option("--max-seq-len", eo.max_seq_len,
                  "the job's data.max_seq_len (default: the spec's, or 128)");

  auto* correct = app.add_subcommand(
      "correct", "correct sentences with an exported model (on the CPU)");
  CorrectOptions co;
  correct->add_option("SENTENCE", co.sentences, "sentences (default: --file, else stdin, one per line)");
  correct->add_option("--model", co.model_dir, "a directory dgca export wrote")->required();
  correct->add_option("--file", co.file, "read sentences from this file, one per line");
  correct->add_option("--eval", co.eval_file,
                      "score an ECSpell file (src<TAB>trg) as the trainer's evaluation does");
  correct->add_flag("--json", co.json, "one JSON document");
  correct->add_option("--batch-size", co.batch_size, "sentences per forward pass")->capture_default_str();
  correct->add_option("--threads", co.threads, "CPU threads")->capture_default_str();

  auto* data = app.add_subcommand("data", "data tools");
  data->require_subcommand(1);
  auto* synth = data->add_subcommand("synth", "build the synthetic ECSpell-format corpus");
  synth->add_option("--out", out_dir, "output directory")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp& e) {
    out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // Help for a subcommand comes as CallForHelp too; everything else is usage.
    // A word that is no command makes CLI11 say "A subcommand is required":
    // name the word and the commands instead.
    const std::string first = FirstPositional(argc, argv);
    if (!first.empty() && app.get_subcommands().empty()) {
      bool known = false;
      std::string names;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
        known = known || sub->check_name(first);
        absl::StrAppend(&names, names.empty() ? "" : ", ", sub->get_name());
      }
      if (!known) {
        err << "error: unknown command '" << first << "'; the commands are: " << names << "\n";
        err << "run 'dgca --help' for what each does\n";
        return kExitUsage;
      }
    }
    err << "error: " << e.what() << "\n";
    err << "run 'dgca --help' for the commands\n";
    return kExitUsage;
  }
  Io io{out, err, err_is_tty};
  // Job ids are checked here, before any connection: an overlong one would
  // otherwise fail in gRPC's metadata limits and read as exit 1.
  for (const CLI::App* sub : {status, watch, logs, cancel, diagnose, resubmit}) {
    const std::string& id = sub == diagnose ? diag_job : job;
    if (!*sub || (sub == diagnose && (diag_job.empty() || *dcomm))) continue;
    if (absl::Status st = CheckJobId(id); !st.ok()) {
      err << "error: " << st.message() << "\n";
      return kExitUsage;
    }
  }
  if (*submit) return CmdSubmit(g, io, spec, wait, sets);
  if (*resubmit) return CmdResubmit(g, io, job, wait);
  if (*del) {
    for (const std::string& id : del_jobs) {
      if (absl::Status st = CheckJobId(id); !st.ok()) {
        err << "error: " << st.message() << "\n";
        return kExitUsage;
      }
    }
    return CmdDelete(g, io, del_jobs);
  }
  if (*validate) return CmdValidate(io, spec, sets, !spec_only);
  if (*plan) return CmdPlan(g, io, spec, json, sets);
  if (*list) return CmdList(g, io, list_opt);
  if (*status) return CmdStatus(g, io, job, json);
  if (*watch) return CmdWatch(g, io, job);
  if (*logs) return CmdLogs(g, io, job, rank, follow);
  if (*cancel) return CmdCancel(g, io, job);
  if (*topo) return CmdTopo(io, root, json);
  if (*forget) return CmdForgetNode(g, io, node);
  if (*nodes) return CmdNodes(g, io, json);
  if (*dcomm) return CmdDiagnoseComm(g, io, dco);
  if (*diagnose && !diag_job.empty()) return CmdDiagnoseJob(g, io, diag_job, diag_json);
  if (*diagnose) return CmdDiagnose(io);
  if (*synth) return CmdDataSynth(io, out_dir);
  if (*export_cmd) return CmdExport(g, io, eo);
  if (*correct) return CmdCorrect(io, co, std::cin);
  err << "error: no command\n";
  return kExitUsage;
}

}  // namespace cli
}  // namespace dgca
