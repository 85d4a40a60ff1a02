#include "model/train/export.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "model/core/data.h"
#include "model/core/files.h"
#include "model/core/json.h"
#include "model/core/safetensors.h"
#include "model/train/checkpoint.h"
#include "model/train/checkpoint_retention.h"

namespace dgca {
namespace {

namespace fs = std::filesystem;

// config.json is a few KiB (the eval metrics are its longest part).
constexpr size_t kMaxConfigBytes = 1 << 20;

const char* PromptEncoderName(PromptEncoderKind k) {
  switch (k) {
    case PromptEncoderKind::kLstm: return "lstm";
    case PromptEncoderKind::kMlp: return "mlp";
    case PromptEncoderKind::kNone: return "none";
  }
  return "none";
}

std::string Num(double x) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", x);
  return buf;
}

std::string Quote(const std::string& s) {
  std::string out;
  AppendJsonString(s, &out);
  return out;
}

// Every metric of a step directory's eval.json (empty when it has none).
std::map<std::string, double> ReadEvalMetrics(const std::string& step_dir) {
  std::map<std::string, double> out;
  const std::string path = step_dir + "/" + kCheckpointEvalFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return out;
  auto text = ReadTextFile(path, 64 << 10, "{\"step\": N, \"metrics\": {...}}");
  if (!text.ok()) return out;
  auto js = ParseJson(*text, path);
  if (!js.ok()) return out;
  const JsonValue* m = js->Find("metrics");
  if (m == nullptr || !m->is_object()) return out;
  for (const auto& [name, v] : m->object) {
    if (v.is_number() && std::isfinite(v.number)) out[name] = v.number;
  }
  return out;
}

std::string ConfigJson(const ModelConfig& c, const Vocab& vocab, const ExportSource& src,
                       int64_t step, const std::map<std::string, double>& eval, bool heads_file,
                       bool confusion_file) {
  std::string j = "{\n";
  // Hugging Face BertConfig (transformers reads these; it keeps "dgca" as an
  // attribute it does not use).
  j += "  \"architectures\": [\"BertForMaskedLM\"],\n";
  j += "  \"model_type\": \"bert\",\n";
  j += "  \"vocab_size\": " + std::to_string(c.vocab_size) + ",\n";
  j += "  \"hidden_size\": " + std::to_string(c.hidden) + ",\n";
  j += "  \"num_hidden_layers\": " + std::to_string(c.layers) + ",\n";
  j += "  \"num_attention_heads\": " + std::to_string(c.heads) + ",\n";
  j += "  \"intermediate_size\": " + std::to_string(c.ffn) + ",\n";
  j += "  \"hidden_act\": \"gelu\",\n";  // HF's "gelu" is the exact erf GELU ours is
  // Not in a checkpoint (training-only, no effect on inference): HF's defaults.
  j += "  \"hidden_dropout_prob\": 0.1,\n";
  j += "  \"attention_probs_dropout_prob\": 0.1,\n";
  j += "  \"max_position_embeddings\": " + std::to_string(c.max_position) + ",\n";
  j += "  \"type_vocab_size\": " + std::to_string(c.type_vocab) + ",\n";
  j += "  \"initializer_range\": 0.02,\n";
  char eps[32];  // the float as written (1e-12), not its double expansion
  std::snprintf(eps, sizeof(eps), "%.9g", c.layer_norm_eps);
  j += "  \"layer_norm_eps\": " + std::string(eps) + ",\n";
  j += "  \"pad_token_id\": " + std::to_string(vocab.pad_id()) + ",\n";
  j += "  \"position_embedding_type\": \"absolute\",\n";
  j += "  \"torch_dtype\": \"float32\",\n";
  j += "  \"dgca\": {\n";
  j += "    \"format\": " + std::to_string(kExportFormat) + ",\n";
  j += "    \"prompt_length\": " + std::to_string(c.prompt_length) + ",\n";
  j += "    \"prompt_encoder\": \"" + std::string(PromptEncoderName(c.prompt_encoder)) + "\",\n";
  j += std::string("    \"detector\": ") + (c.detector ? "true" : "false") + ",\n";
  j += std::string("    \"candidate\": ") + (c.candidate ? "true" : "false") + ",\n";
  j += "    \"candidate_top_k\": " + std::to_string(c.candidate_top_k) + ",\n";
  j += std::string("    \"fusion\": \"") + (c.fusion == FusionKind::kGated ? "gated" : "none") + "\",\n";
  j += "    \"max_seq_len\": " + std::to_string(src.max_seq_len) + ",\n";
  j += "    \"heads_file\": " + (heads_file ? Quote(kExportHeadsFile) : std::string("null")) + ",\n";
  j += "    \"confusion_file\": " + (confusion_file ? Quote(kExportConfusionFile) : std::string("null")) + ",\n";
  j += "    \"step\": " + std::to_string(step) + ",\n";
  j += "    \"source\": " + Quote(src.description.empty() ? src.step_dir : src.description) + ",\n";
  j += "    \"eval\": {";
  bool first = true;
  for (const auto& [name, v] : eval) {
    j += (first ? "" : ", ") + Quote(name) + ": " + Num(v);
    first = false;
  }
  j += "}\n  }\n}\n";
  return j;
}

// {"字": ["字1", ...], ...}: the lists of every id that has one, in id order.
std::string ConfusionJson(const ConfusionSet& cs, const Vocab& vocab) {
  std::string j = "{";
  bool first = true;
  for (int32_t id = 0; id < vocab.size(); ++id) {
    int n = 0;
    const int32_t* list = cs.Candidates(id, &n);
    if (n == 0) continue;
    j += first ? "\n" : ",\n";
    first = false;
    AppendJsonString(vocab.Token(id), &j);
    j += ": [";
    for (int k = 0; k < n; ++k) {
      if (k) j += ", ";
      AppendJsonString(vocab.Token(list[k]), &j);
    }
    j += "]";
  }
  j += "\n}\n";
  return j;
}

Status CheckSeqLen(const ModelConfig& c, int max_seq_len, const std::string& where) {
  const int lo = 2 * c.prompt_length + 4;
  if (max_seq_len < lo || max_seq_len > c.max_position) {
    return InvalidArgumentError(where + ": max_seq_len " + std::to_string(max_seq_len) +
                                " is outside " + std::to_string(lo) + ".." +
                                std::to_string(c.max_position) + " (2 x prompt length " +
                                std::to_string(c.prompt_length) + " + 4 .. max_position)");
  }
  return OkStatus();
}

Status CheckVocab(const Vocab& vocab, const ModelConfig& c, const std::string& path) {
  if (vocab.size() != c.vocab_size) {
    return InvalidArgumentError(path + ": the vocabulary has " + std::to_string(vocab.size()) +
                                " tokens but the model's vocab_size is " +
                                std::to_string(c.vocab_size) + "; is it the job's vocabulary?");
  }
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (!vocab.Contains(t)) {
      return InvalidArgumentError(path + ": the vocabulary lacks the special token " +
                                  std::string(t) + " (BERT's [PAD], [UNK], [CLS], [SEP], [MASK] "
                                  "are needed)");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<ChosenCheckpoint> ChooseCheckpoint(const std::string& dir, const std::string& which) {
  if (which != "best" && which != "latest") {
    return InvalidArgumentError("checkpoint choice '" + which +
                                "': expected best, latest or a step directory's path");
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return NotFoundError("checkpoint directory " + dir + " does not exist (or is not a directory)");
  }
  DGCA_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> entries, ListCheckpoints(dir));
  if (entries.empty()) {
    return NotFoundError("checkpoint directory " + dir +
                         " holds no step-NNNNNNNN checkpoint (the job writes one every "
                         "train.checkpoint_every steps and at its end when that is > 0)");
  }
  DGCA_ASSIGN_OR_RETURN(std::string latest_dir, LatestCheckpoint(dir));
  DGCA_ASSIGN_OR_RETURN(CheckpointState latest_state, ReadCheckpointState(latest_dir));
  const std::string of = " of " + std::to_string(entries.size()) + " checkpoint" +
                         (entries.size() == 1 ? "" : "s");
  ChosenCheckpoint c;
  c.step_dir = latest_dir;
  c.step = latest_state.step;
  c.kind = "latest";
  for (const CheckpointEntry& e : entries) {
    if (e.step == c.step) {
      c.has_metric = e.has_metric;
      c.metric = e.metric;
    }
  }
  const std::string name = CheckpointDirName(c.step);
  if (which == "latest") {
    c.reason = name + ", the latest" + of;
    return c;
  }
  const RetentionPlan plan = PlanRetention(entries, c.step, 1);
  if (plan.best < 0) {
    c.reason = name + ", the latest" + of + "; none has an eval recorded at its step, so there is "
               "no best (train.eval_every, or the final eval at a checkpoint's step)";
    return c;
  }
  c.kind = "best";
  c.step = plan.best;
  c.step_dir = dir + "/" + CheckpointDirName(plan.best);
  for (const CheckpointEntry& e : entries) {
    if (e.step == plan.best) {
      c.has_metric = true;
      c.metric = e.metric;
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4f", c.metric);
  c.reason = CheckpointDirName(plan.best) + ", the best by " + kRetentionMetric + " (" + buf + ")" +
             of;
  return c;
}

StatusOr<ExportResult> ExportModel(const ExportSource& source, const std::string& out_dir) {
  DGCA_ASSIGN_OR_RETURN(ModelConfig cfg, ReadCheckpointConfig(source.step_dir));
  DGCA_RETURN_IF_ERROR(CheckSeqLen(cfg, source.max_seq_len, "export of " + source.step_dir));
  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<DgcaModel> model,
                        DgcaModel::Create(cfg, 1, source.max_seq_len, 0, 1));
  ParamStore& params = model->params();
  CheckpointState state;
  DGCA_RETURN_IF_ERROR(LoadCheckpoint(source.step_dir, cfg, &params, nullptr, &state));
  DGCA_ASSIGN_OR_RETURN(Vocab vocab, Vocab::Load(source.vocab_path));
  DGCA_RETURN_IF_ERROR(CheckVocab(vocab, cfg, source.vocab_path));
  std::unique_ptr<ConfusionSet> confusion;
  if (cfg.candidate) {
    if (!source.confusion_path.empty()) {
      DGCA_ASSIGN_OR_RETURN(ConfusionSet cs, ConfusionSet::LoadJson(source.confusion_path, vocab));
      confusion = std::make_unique<ConfusionSet>(std::move(cs));
    } else {
      DGCA_ASSIGN_OR_RETURN(ConfusionSet cs, ConfusionSet::BuildFromUnihan(vocab));
      confusion = std::make_unique<ConfusionSet>(std::move(cs));
    }
  }

  ExportResult r;
  r.step = state.step;
  r.parameters = params.parameter_count();
  r.eval = ReadEvalMetrics(source.step_dir);
  std::vector<TensorView> bert, ours;
  for (int i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params.info(i);
    (IsHfBertParameter(p.name) ? bert : ours).push_back({p.name, p.shape, params.value(i)});
  }
  r.bert_tensors = static_cast<int>(bert.size());
  r.dgca_tensors = static_cast<int>(ours.size());

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir, ec)) {
    return InvalidArgumentError("export: cannot create the output directory " + out_dir +
                                (ec ? ": " + ec.message() : std::string(" (a file is in the way)")));
  }
  auto path = [&](const char* f) { return out_dir + "/" + f; };
  // transformers refuses a safetensors file whose metadata lacks format "pt".
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"writer", "dgca export"}};
  DGCA_RETURN_IF_ERROR(WriteSafetensors(path(kExportModelFile), bert, meta));
  r.files.push_back(kExportModelFile);
  const std::string heads = path(kExportHeadsFile);
  if (!ours.empty()) {
    DGCA_RETURN_IF_ERROR(WriteSafetensors(heads, ours, meta));
    r.files.push_back(kExportHeadsFile);
  } else {
    fs::remove(heads, ec);  // an earlier export's into the same OUT
  }
  DGCA_RETURN_IF_ERROR(vocab.Save(path(kExportVocabFile) + ".tmp"));
  fs::rename(path(kExportVocabFile) + ".tmp", path(kExportVocabFile), ec);
  if (ec) return InternalError("export: cannot rename " + path(kExportVocabFile) + ".tmp: " + ec.message());
  r.files.push_back(kExportVocabFile);
  if (confusion) {
    DGCA_RETURN_IF_ERROR(WriteFileAtomically(path(kExportConfusionFile), ConfusionJson(*confusion, vocab)));
    r.files.push_back(kExportConfusionFile);
  } else {
    fs::remove(path(kExportConfusionFile), ec);
  }
  // config.json last: a directory with it is a finished export.
  DGCA_RETURN_IF_ERROR(WriteFileAtomically(
      path(kExportConfigFile),
      ConfigJson(cfg, vocab, source, state.step, r.eval, !ours.empty(), confusion != nullptr)));
  r.files.push_back(kExportConfigFile);
  return r;
}

namespace {

// Reads config.json fields with errors that name the file and the field.
class ConfigReader {
 public:
  ConfigReader(const JsonValue* obj, std::string where) : obj_(obj), where_(std::move(where)) {}
  Status Int(const char* name, int64_t lo, int64_t hi, int* out) const {
    const JsonValue* v = obj_->Find(name);
    if (v == nullptr || !v->is_number() || !v->is_integer) {
      return Bad(name, "missing or not an integer");
    }
    if (v->integer < lo || v->integer > hi) {
      return Bad(name, std::to_string(v->integer) + " is outside " + std::to_string(lo) + ".." +
                           std::to_string(hi));
    }
    *out = static_cast<int>(v->integer);
    return OkStatus();
  }
  Status Bool(const char* name, bool* out) const {
    const JsonValue* v = obj_->Find(name);
    if (v == nullptr || v->type != JsonValue::Type::kBool) return Bad(name, "missing or not true/false");
    *out = v->boolean;
    return OkStatus();
  }
  Status String(const char* name, const std::vector<std::string>& valid, std::string* out) const {
    const JsonValue* v = obj_->Find(name);
    if (v == nullptr || !v->is_string()) return Bad(name, "missing or not a string");
    std::string list;
    for (const std::string& s : valid) {
      if (s == v->string) {
        *out = s;
        return OkStatus();
      }
      list += (list.empty() ? "" : ", ") + s;
    }
    if (valid.empty()) {
      *out = v->string;
      return OkStatus();
    }
    return Bad(name, "'" + v->string + "' is not one of " + list);
  }
  Status Bad(const std::string& name, const std::string& what) const {
    return InvalidArgumentError(where_ + ": field '" + name + "': " + what);
  }

 private:
  const JsonValue* obj_;
  std::string where_;
};

}  // namespace

StatusOr<ExportedModel> LoadExportedModel(const std::string& dir, int max_batch, int threads) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return NotFoundError("model directory " + dir + " does not exist (or is not a directory); "
                         "make one with dgca export JOB --out " + dir);
  }
  auto path = [&](const char* f) { return dir + "/" + f; };
  for (const char* f : {kExportConfigFile, kExportModelFile, kExportVocabFile}) {
    if (!fs::is_regular_file(path(f), ec)) {
      return NotFoundError(path(f) + ": missing; is " + dir +
                           " a dgca export directory (dgca export JOB --out DIR)?");
    }
  }
  const std::string config_path = path(kExportConfigFile);
  DGCA_ASSIGN_OR_RETURN(std::string text,
                        ReadTextFile(config_path, kMaxConfigBytes, "the export's config.json"));
  DGCA_ASSIGN_OR_RETURN(JsonValue js, ParseJson(text, config_path));
  if (!js.is_object()) return InvalidArgumentError(config_path + ": expected a JSON object");
  const JsonValue* d = js.Find("dgca");
  if (d == nullptr || !d->is_object()) {
    return InvalidArgumentError(config_path + ": no object field 'dgca': a Hugging Face BERT "
                                "directory, not a dgca export (dgca export JOB --out DIR makes one)");
  }
  ExportedModel m;
  ModelConfig& c = m.config;
  constexpr int64_t kBig = int64_t{1} << 30;
  const ConfigReader hf(&js, config_path);
  const ConfigReader dg(d, config_path + ": dgca");
  int format = 0;
  DGCA_RETURN_IF_ERROR(dg.Int("format", 1, kExportFormat, &format));
  DGCA_RETURN_IF_ERROR(hf.Int("vocab_size", 1, kBig, &c.vocab_size));
  DGCA_RETURN_IF_ERROR(hf.Int("hidden_size", 1, kBig, &c.hidden));
  DGCA_RETURN_IF_ERROR(hf.Int("num_hidden_layers", 0, 1024, &c.layers));
  DGCA_RETURN_IF_ERROR(hf.Int("num_attention_heads", 1, kBig, &c.heads));
  DGCA_RETURN_IF_ERROR(hf.Int("intermediate_size", 1, kBig, &c.ffn));
  DGCA_RETURN_IF_ERROR(hf.Int("max_position_embeddings", 1, kBig, &c.max_position));
  DGCA_RETURN_IF_ERROR(hf.Int("type_vocab_size", 1, kBig, &c.type_vocab));
  std::string act;
  DGCA_RETURN_IF_ERROR(hf.String("hidden_act", {"gelu"}, &act));
  const JsonValue* eps = js.Find("layer_norm_eps");
  if (eps == nullptr || !eps->is_number() || !(eps->number > 0)) {
    return hf.Bad("layer_norm_eps", "missing or not a number > 0");
  }
  c.layer_norm_eps = static_cast<float>(eps->number);
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  DGCA_RETURN_IF_ERROR(dg.Int("prompt_length", 0, 1 << 16, &c.prompt_length));
  std::string pe, fusion;
  DGCA_RETURN_IF_ERROR(dg.String("prompt_encoder", {"lstm", "mlp", "none"}, &pe));
  c.prompt_encoder = pe == "lstm" ? PromptEncoderKind::kLstm
                     : pe == "mlp" ? PromptEncoderKind::kMlp
                                   : PromptEncoderKind::kNone;
  DGCA_RETURN_IF_ERROR(dg.Bool("detector", &c.detector));
  DGCA_RETURN_IF_ERROR(dg.Bool("candidate", &c.candidate));
  DGCA_RETURN_IF_ERROR(dg.Int("candidate_top_k", 0, 1 << 16, &c.candidate_top_k));
  DGCA_RETURN_IF_ERROR(dg.String("fusion", {"gated", "none"}, &fusion));
  c.fusion = fusion == "gated" ? FusionKind::kGated : FusionKind::kNone;
  DGCA_RETURN_IF_ERROR(dg.Int("max_seq_len", 1, kBig, &m.max_seq_len));
  DGCA_RETURN_IF_ERROR(CheckSeqLen(c, m.max_seq_len, config_path + ": dgca"));
  if (const JsonValue* s = d->Find("step"); s != nullptr && s->is_integer) m.step = s->integer;
  if (const JsonValue* s = d->Find("source"); s != nullptr && s->is_string()) m.source = s->string;
  if (const JsonValue* e = d->Find("eval"); e != nullptr && e->is_object()) {
    for (const auto& [name, v] : e->object) {
      if (v.is_number()) m.eval[name] = v.number;
    }
  }

  DGCA_ASSIGN_OR_RETURN(m.vocab, Vocab::Load(path(kExportVocabFile)));
  DGCA_RETURN_IF_ERROR(CheckVocab(m.vocab, c, path(kExportVocabFile)));
  if (c.candidate) {
    if (!fs::is_regular_file(path(kExportConfusionFile), ec)) {
      return NotFoundError(path(kExportConfusionFile) +
                           ": missing; the model's candidate head needs the confusion set it "
                           "was trained with (dgca export writes it)");
    }
    DGCA_ASSIGN_OR_RETURN(ConfusionSet cs, ConfusionSet::LoadJson(path(kExportConfusionFile), m.vocab));
    m.confusion = std::make_shared<const ConfusionSet>(std::move(cs));
  }

  DGCA_ASSIGN_OR_RETURN(m.model, DgcaModel::Create(c, max_batch, m.max_seq_len, 0, threads));
  ParamStore& params = m.model->params();
  // The BERT part as any HF BertForMaskedLM file is read (the tied decoder
  // copies, pooler and NSP head a fine-tuned HF save may carry are ignored).
  const std::string model_path = path(kExportModelFile);
  DGCA_ASSIGN_OR_RETURN(HfLoadReport hf_report, LoadHfInit(model_path, &params));
  if (!hf_report.unexpected.empty()) {
    return InvalidArgumentError(model_path + ": tensor '" + hf_report.unexpected[0] +
                                "' is not a parameter of the model config.json describes (" +
                                std::to_string(hf_report.unexpected.size()) + " such)");
  }
  std::set<std::string> loaded;
  for (int i = 0; i < params.size(); ++i) loaded.insert(params.info(i).name);
  for (const std::string& name : hf_report.missing) loaded.erase(name);
  // The DGCA parts: every parameter LoadHfInit left, by exact name.
  std::vector<std::string> rest = hf_report.missing;
  if (!rest.empty()) {
    const std::string heads_path = path(kExportHeadsFile);
    if (!fs::is_regular_file(heads_path, ec)) {
      return NotFoundError(heads_path + ": missing; the model config.json describes has " +
                           std::to_string(rest.size()) + " parameters outside BERT (" + rest[0] +
                           ", ...) and they are kept there");
    }
    DGCA_ASSIGN_OR_RETURN(SafetensorsFile heads, ReadSafetensors(heads_path));
    for (const auto& [name, t] : heads.tensors) {
      const int i = params.Find(name);
      if (i < 0) {
        return InvalidArgumentError(heads_path + ": tensor '" + name +
                                    "' is not a parameter of the model config.json describes");
      }
      if (t.shape != params.info(i).shape) {
        return InvalidArgumentError(heads_path + ": tensor '" + name + "' has shape " +
                                    ShapeString(t.shape) + ", expected " +
                                    ShapeString(params.info(i).shape));
      }
      std::copy(t.data.begin(), t.data.end(), params.value(i));
      loaded.insert(name);
    }
    for (const std::string& name : rest) {
      if (!loaded.count(name)) {
        return InvalidArgumentError(heads_path + ": missing tensor '" + name + "' (shape " +
                                    ShapeString(params.info(params.Find(name)).shape) + ")");
      }
    }
  }
  return m;
}

}  // namespace dgca
