// Using a trained model (docs/cli.md): `dgca export JOB --out DIR` writes a
// job's checkpoint as a Hugging Face BERT directory plus the DGCA parts
// (model/train/export.h); `dgca correct --model DIR SENTENCE...` corrects
// sentences with it on the CPU (model/train/corrector.h).
//
// Export reads the checkpoint files themselves, so it runs where they are:
// the coordinator's node for ranks it ran there (the in-process agent, the
// quickstart), rank 0's node otherwise; GetJob says which directory and
// node, and elsewhere the error says so. --checkpoint-dir exports any
// checkpoint directory without a coordinator.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "model/core/json.h"
#include "model/train/corrector.h"
#include "model/train/export.h"
#include "proto/rpc/rpc_util.h"
#include "spec/spec_files.h"

namespace dgca {
namespace cli {
namespace {

namespace fs = std::filesystem;

int Fail(Io io, const absl::Status& s) {
  io.err << "error: " << s.message() << "\n";
  return ExitCodeFor(s);
}

int Fail(Io io, const Status& s) { return Fail(io, ToAbsl(s)); }

// The spec's default data.max_seq_len (proto/dgca/v1/job.proto).
constexpr int kDefaultMaxSeqLen = 128;

std::string MetricLine(const std::map<std::string, double>& m) {
  auto get = [&](const char* k) {
    auto it = m.find(k);
    return it == m.end() ? 0.0 : it->second;
  };
  return absl::StrFormat(
      "sentence correction P/R/F1 %.4f/%.4f/%.4f, detection F1 %.4f, char correction F1 %.4f, "
      "false positive rate %.4f",
      get("sentence_correction_precision"), get("sentence_correction_recall"),
      get("sentence_correction_f1"), get("sentence_detection_f1"), get("char_correction_f1"),
      get("false_positive_rate"));
}

// Round-trip exact: --eval over a job's test set is compared with its eval.
std::string JsonNum(double x) { return absl::StrFormat("%.17g", x); }

std::string JsonStr(const std::string& s) {
  std::string out;
  AppendJsonString(s, &out);
  return out;
}

std::string MetricsJson(const std::map<std::string, double>& m) {
  std::string j = "{";
  for (const auto& [k, v] : m) absl::StrAppend(&j, j.size() > 1 ? ", " : "", JsonStr(k), ": ", JsonNum(v));
  return j + "}";
}

}  // namespace

int CmdExport(const GlobalOptions& g, Io io, const ExportOptions& o) {
  if (o.out_dir.empty()) {
    io.err << "error: --out DIR is required (the directory to write the model to)\n";
    return kExitUsage;
  }
  if (o.job_id.empty() == o.checkpoint_dir.empty()) {
    io.err << "error: give a job (dgca export JOB --out DIR) or --checkpoint-dir PATH, not "
           << (o.job_id.empty() ? "neither" : "both") << "\n";
    return kExitUsage;
  }
  ExportSource src;
  std::string dir;        // the checkpoint DIR (holding step-NNNNNNNN/ and latest)
  std::string what;       // "job J" or the directory, for messages
  if (!o.job_id.empty()) {
    if (absl::Status st = CheckJobId(o.job_id); !st.ok()) return Fail(io, st);
    auto client = Client::Connect(g);
    if (!client.ok()) return ReportError(io.err, g, client.status());
    absl::StatusOr<v1::GetJobResponse> got = (*client)->GetJob(o.job_id);
    if (!got.ok()) return ReportError(io.err, g, got.status());
    const v1::JobSpec& spec = got->job().spec();
    if (spec.kind() == "comm_probe") {
      return Fail(io, absl::InvalidArgumentError(absl::StrCat(
                          "job ", o.job_id, " is a communication probe (dgca diagnose comm): it "
                          "trains no model")));
    }
    dir = got->checkpoint_dir();
    what = "job " + o.job_id;
    if (dir.empty()) {
      return Fail(io, absl::FailedPreconditionError(absl::StrCat(
                          "the coordinator has no state dir, so job ", o.job_id,
                          " kept no checkpoints it can point to; export a checkpoint directory "
                          "with --checkpoint-dir PATH")));
    }
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      const std::string node =
          got->plan().rank_nodes_size() > 0 ? got->plan().rank_nodes(0) : std::string();
      return Fail(io, absl::FailedPreconditionError(absl::StrCat(
                          "job ", o.job_id, "'s checkpoints are in ", dir, " on ",
                          node.empty() ? std::string("rank 0's node") : "rank 0's node " + node,
                          " (the coordinator runs on ",
                          got->coordinator_host().empty() ? "another host" : got->coordinator_host(),
                          "), and this machine has no such directory: run dgca export there, or "
                          "copy the directory here and give it as --checkpoint-dir")));
    }
    const std::string& base = spec.base_dir();
    src.vocab_path = ResolveSpecPath(base, spec.model().vocab());
    src.confusion_path = ResolveSpecPath(base, spec.model().heads_spec().candidate().confusion());
    src.max_seq_len = spec.data().max_seq_len() > 0 ? spec.data().max_seq_len() : kDefaultMaxSeqLen;
  } else {
    dir = o.checkpoint_dir;
    what = dir;
    src.max_seq_len = kDefaultMaxSeqLen;
  }
  if (!o.vocab.empty()) src.vocab_path = o.vocab;
  if (!o.confusion.empty()) src.confusion_path = o.confusion;
  if (o.max_seq_len > 0) src.max_seq_len = o.max_seq_len;

  // Which step directory: a path given, or best / latest of DIR. A
  // --checkpoint-dir that is itself a step directory is that one.
  std::error_code ec;
  std::string reason;
  const bool is_step_dir = fs::is_regular_file(dir + "/state.json", ec);
  if (o.checkpoint != "best" && o.checkpoint != "latest") {
    src.step_dir = o.checkpoint;
    if (!fs::is_regular_file(src.step_dir + "/state.json", ec)) {
      return Fail(io, absl::InvalidArgumentError(absl::StrCat(
                          "--checkpoint ", o.checkpoint, ": expected best, latest or a checkpoint "
                          "step directory (one holding state.json and model.safetensors)")));
    }
    reason = src.step_dir + ", as given";
  } else if (is_step_dir) {
    src.step_dir = dir;
    reason = dir + ", a step directory given";
  } else {
    StatusOr<ChosenCheckpoint> chosen = ChooseCheckpoint(dir, o.checkpoint);
    if (!chosen.ok()) return Fail(io, chosen.status());
    src.step_dir = chosen->step_dir;
    reason = chosen->reason;
  }
  // The job's vocabulary: the spec's model.vocab, else the one training
  // built and saved beside the step directories.
  if (src.vocab_path.empty()) {
    const std::string parent = fs::path(src.step_dir).parent_path().string();
    for (const std::string& d : {dir, parent}) {
      if (fs::is_regular_file(d + "/vocab.txt", ec)) {
        src.vocab_path = d + "/vocab.txt";
        break;
      }
    }
    if (src.vocab_path.empty()) {
      return Fail(io, absl::NotFoundError(absl::StrCat(
                          "no vocab.txt beside the checkpoints in ", dir,
                          " and no model.vocab in the spec: give the job's vocabulary as --vocab "
                          "FILE")));
    }
  }
  src.description = absl::StrCat(what, ", ", reason);
  StatusOr<ExportResult> r = ExportModel(src, o.out_dir);
  if (!r.ok()) return Fail(io, r.status());
  io.out << "exported " << src.description << " (step " << r->step << ", "
         << r->parameters << " parameters) to " << o.out_dir << ":\n";
  io.out << "  " << kExportModelFile << "  BERT encoder and MLM head, " << r->bert_tensors
         << " tensors (Hugging Face BertForMaskedLM names)\n";
  if (r->dgca_tensors > 0) {
    io.out << "  " << kExportHeadsFile << "  prompt encoder, detector, candidate head, fusion: "
           << r->dgca_tensors << " tensors\n";
  }
  io.out << "  " << kExportConfigFile << ", " << kExportVocabFile
         << (std::find(r->files.begin(), r->files.end(), kExportConfusionFile) != r->files.end()
                 ? absl::StrCat(", ", kExportConfusionFile)
                 : std::string())
         << "\n";
  if (!r->eval.empty()) io.out << "  its eval: " << MetricLine(r->eval) << "\n";
  io.out << "correct sentences with: dgca correct --model " << o.out_dir << " \"SENTENCE\"\n";
  return kExitOk;
}

int CmdCorrect(Io io, const CorrectOptions& o, std::istream& in) {
  if (o.model_dir.empty()) {
    io.err << "error: --model DIR is required (a directory dgca export wrote)\n";
    return kExitUsage;
  }
  CorrectorOptions co;
  co.batch_size = o.batch_size;
  co.threads = o.threads;
  StatusOr<std::unique_ptr<Corrector>> c = Corrector::Load(o.model_dir, co);
  if (!c.ok()) return Fail(io, c.status());

  if (!o.eval_file.empty()) {
    StatusOr<CorrectorEval> e = (*c)->Evaluate(o.eval_file);
    if (!e.ok()) return Fail(io, e.status());
    if (o.json) {
      io.out << "{\"model\": " << JsonStr(o.model_dir) << ", \"file\": " << JsonStr(o.eval_file)
             << ", \"sentences\": " << e->sentences << ", \"truncated\": " << e->stats.truncated
             << ", \"skipped\": " << e->stats.skipped_unequal + e->stats.skipped_empty
             << ", \"metrics\": " << MetricsJson(e->metrics) << "}\n";
    } else {
      io.out << "eval " << o.eval_file << " (" << e->sentences << " sentences): " << MetricLine(e->metrics)
             << "\n";
    }
    return kExitOk;
  }

  std::vector<std::string> sentences = o.sentences, names;
  for (size_t i = 0; i < sentences.size(); ++i) names.push_back(absl::StrCat("argument ", i + 1));
  if (sentences.empty()) {
    std::ifstream file;
    std::istream* src = &in;
    std::string label = "stdin";
    if (!o.file.empty()) {
      std::error_code ec;
      if (!fs::is_regular_file(o.file, ec)) {
        return Fail(io, absl::NotFoundError(o.file + ": no such file (--file takes a text file, "
                                                     "one sentence per line)"));
      }
      file.open(o.file);
      if (!file) return Fail(io, absl::NotFoundError(o.file + ": cannot open"));
      src = &file;
      label = o.file;
    }
    std::string line;
    for (int n = 1; std::getline(*src, line); ++n) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      sentences.push_back(line);
      names.push_back(absl::StrCat(label, ":", n));
    }
    if (sentences.empty()) {
      io.err << "error: no sentences: give them as arguments, with --file F, or one per line on "
                "stdin\n";
      return kExitUsage;
    }
  }
  StatusOr<std::vector<Correction>> out = (*c)->Correct(sentences, names);
  if (!out.ok()) return Fail(io, out.status());
  if (o.json) {
    io.out << "{\"model\": " << JsonStr(o.model_dir) << ", \"sentences\": [";
    for (size_t i = 0; i < out->size(); ++i) {
      const Correction& r = (*out)[i];
      io.out << (i ? ",\n  " : "\n  ") << "{\"original\": " << JsonStr(r.original)
             << ", \"corrected\": " << JsonStr(r.corrected) << ", \"changes\": [";
      for (size_t k = 0; k < r.changes.size(); ++k) {
        const CharChange& ch = r.changes[k];
        io.out << (k ? ", " : "") << "{\"position\": " << ch.position << ", \"from\": " << JsonStr(ch.from)
               << ", \"to\": " << JsonStr(ch.to) << "}";
      }
      io.out << "]}";
    }
    io.out << "\n]}\n";
    return kExitOk;
  }
  for (const Correction& r : *out) {
    if (r.changes.empty()) {
      io.out << r.original << "  (no change)\n";
      continue;
    }
    io.out << r.original << " -> " << r.corrected << "  [";
    for (size_t k = 0; k < r.changes.size(); ++k) {
      const CharChange& ch = r.changes[k];
      io.out << (k ? ", " : "") << ch.position << ":" << ch.from << "->" << ch.to;
    }
    io.out << "]\n";
  }
  return kExitOk;
}

}  // namespace cli
}  // namespace dgca
