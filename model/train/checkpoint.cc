#include "model/train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>

#include "model/core/files.h"
#include "model/core/json.h"
#include "model/core/safetensors.h"

namespace dgca {
namespace {

namespace fs = std::filesystem;

// CRC-32 (IEEE 802.3, as zlib's crc32 and Python's zlib.crc32), slice-by-8.
class Crc32 {
 public:
  Crc32() {
    static const Tables* const kTables = new Tables();
    t_ = kTables;
  }
  void Update(const unsigned char* p, size_t n) {
    uint32_t c = ~crc_;
    while (n >= 8) {
      const uint32_t lo = c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                               uint32_t{p[3]} << 24);
      const uint32_t hi = uint32_t{p[4]} | uint32_t{p[5]} << 8 | uint32_t{p[6]} << 16 |
                          uint32_t{p[7]} << 24;
      c = t_->t[7][lo & 0xff] ^ t_->t[6][(lo >> 8) & 0xff] ^ t_->t[5][(lo >> 16) & 0xff] ^
          t_->t[4][lo >> 24] ^ t_->t[3][hi & 0xff] ^ t_->t[2][(hi >> 8) & 0xff] ^
          t_->t[1][(hi >> 16) & 0xff] ^ t_->t[0][hi >> 24];
      p += 8;
      n -= 8;
    }
    while (n-- > 0) c = t_->t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    crc_ = ~c;
  }
  uint32_t value() const { return crc_; }

 private:
  struct Tables {
    uint32_t t[8][256];
    Tables() {
      for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[0][i] = c;
      }
      for (uint32_t i = 0; i < 256; ++i) {
        for (int s = 1; s < 8; ++s) t[s][i] = t[0][t[s - 1][i] & 0xff] ^ (t[s - 1][i] >> 8);
      }
    }
  };
  const Tables* t_;
  uint32_t crc_ = 0;
};

// What state.json records of each data file of a step directory.
struct FileDigest {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

std::string Hex32(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", x);
  return buf;
}

StatusOr<FileDigest> DigestFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFoundError(path + ": cannot open (missing?)");
  FileDigest d;
  Crc32 crc;
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = f.gcount();
    if (n <= 0) break;
    crc.Update(reinterpret_cast<const unsigned char*>(buf.data()), static_cast<size_t>(n));
    d.bytes += n;
  }
  if (f.bad()) return DataLossError(path + ": read error");
  d.crc32 = crc.value();
  return d;
}

// The data files of a step directory whose digests state.json records.
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
// `latest` is one short line; state.json a few hundred bytes.
constexpr size_t kMaxLatestBytes = 4096;
constexpr size_t kMaxStateBytes = 1 << 20;

// Validates `file` against the expected names/shapes; `prefix` is prepended
// to each ParamStore name ("" for weights, "m." / "v." for moments).
Status CheckTensors(const std::string& path, const SafetensorsFile& file,
                    const ParamStore& params, const std::vector<std::string>& prefixes) {
  std::set<std::string> expected;
  for (const std::string& pre : prefixes) {
    for (int i = 0; i < params.size(); ++i) {
      const ParamInfo& info = params.info(i);
      const std::string name = pre + info.name;
      expected.insert(name);
      auto it = file.tensors.find(name);
      if (it == file.tensors.end()) {
        return DataLossError(path + ": missing tensor '" + name + "' (shape " +
                             ShapeString(info.shape) + ")");
      }
      if (it->second.shape != info.shape) {
        return InvalidArgumentError(path + ": tensor '" + name + "' has the wrong shape: expected " +
                                    ShapeString(info.shape) + ", got " +
                                    ShapeString(it->second.shape));
      }
    }
  }
  for (const auto& kv : file.tensors) {
    if (!expected.count(kv.first)) {
      return InvalidArgumentError(path + ": unknown tensor '" + kv.first +
                                  "' (not a parameter of this model)");
    }
  }
  return OkStatus();
}

// Every element finite (and >= 0 where `nonnegative`: Adam's second
// moments); otherwise DATA_LOSS naming the file, the tensor and the first
// bad element. Training from a NaN weight would only print NaN norms.
Status CheckFinite(const std::string& path, const SafetensorsFile& file, const ParamStore& params,
                   const std::string& prefix, bool nonnegative) {
  for (int i = 0; i < params.size(); ++i) {
    const std::string name = prefix + params.info(i).name;
    const Tensor& t = file.tensors.at(name);
    for (size_t k = 0; k < t.data.size(); ++k) {
      const float x = t.data[k];
      if (std::isfinite(x) && (!nonnegative || x >= 0.0f)) continue;
      char val[32];
      if (std::isnan(x)) {
        std::snprintf(val, sizeof(val), "NaN");
      } else if (std::isinf(x)) {
        std::snprintf(val, sizeof(val), "%s", x > 0 ? "+inf" : "-inf");
      } else {
        std::snprintf(val, sizeof(val), "%g", static_cast<double>(x));
      }
      return DataLossError(path + ": tensor '" + name + "' (shape " + ShapeString(t.shape) +
                           ") element " + std::to_string(k) + " (flat index) is " + val +
                           (std::isfinite(x) ? " (an Adam second moment must be >= 0)"
                                             : " (not finite)") +
                           ": the checkpoint is corrupted; resume from an earlier step directory "
                           "or start afresh");
    }
  }
  return OkStatus();
}

bool ParseU64(const JsonValue* v, uint64_t* out) {
  if (v == nullptr) return false;
  if (v->is_string()) {
    if (v->string.empty()) return false;
    char* end = nullptr;
    errno = 0;
    unsigned long long x = std::strtoull(v->string.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return false;
    *out = x;
    return true;
  }
  if (v->is_number() && v->is_integer && v->integer >= 0) {
    *out = static_cast<uint64_t>(v->integer);
    return true;
  }
  return false;
}

bool ParseI64(const JsonValue* v, int64_t* out) {
  if (v == nullptr || !v->is_number() || !v->is_integer) return false;
  *out = v->integer;
  return true;
}

}  // namespace

std::map<std::string, int64_t> ConfigFingerprint(const ModelConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"hidden", c.hidden},
          {"layers", c.layers},
          {"heads", c.heads},
          {"ffn", c.ffn},
          {"max_position", c.max_position},
          {"type_vocab", c.type_vocab},
          {"prompt_length", c.prompt_length},
          {"prompt_encoder", static_cast<int64_t>(c.prompt_encoder)},
          {"detector", c.detector ? 1 : 0},
          {"candidate", c.candidate ? 1 : 0},
          {"candidate_top_k", c.candidate_top_k},
          {"fusion", static_cast<int64_t>(c.fusion)}};
}

std::string CheckpointDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

StatusOr<std::string> SaveCheckpoint(const std::string& dir, const ParamStore& params,
                                     const AdamW* adam, const ModelConfig& cfg,
                                     const CheckpointState& state) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create checkpoint dir " + dir + ": " + ec.message());
  const std::string name = CheckpointDirName(state.step);
  const std::string final_dir = dir + "/" + name;
  const std::string tmp_dir = dir + "/." + name + ".tmp." + std::to_string(getpid());
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return InternalError("cannot create " + tmp_dir + ": " + ec.message());

  std::vector<TensorView> weights;
  for (int i = 0; i < params.size(); ++i) {
    weights.push_back({params.info(i).name, params.info(i).shape, params.value(i)});
  }
  DGCA_RETURN_IF_ERROR(WriteSafetensors(tmp_dir + "/model.safetensors", weights,
                                        {{"format", "pt"}, {"writer", "dgca"}}));
  if (adam != nullptr) {
    std::vector<TensorView> moments;
    for (int i = 0; i < params.size(); ++i) {
      const ParamInfo& p = params.info(i);
      moments.push_back({"m." + p.name, p.shape, adam->m().data() + p.offset});
      moments.push_back({"v." + p.name, p.shape, adam->v().data() + p.offset});
    }
    DGCA_RETURN_IF_ERROR(WriteSafetensors(tmp_dir + "/optimizer.safetensors", moments,
                                          {{"writer", "dgca"}}));
  }
  std::string js = "{\n";
  js += "  \"step\": " + std::to_string(state.step) + ",\n";
  js += "  \"loader_step\": " + std::to_string(state.loader_step) + ",\n";
  js += "  \"seed\": \"" + std::to_string(state.seed) + "\",\n";
  js += "  \"rng_state\": \"" + std::to_string(state.rng_state) + "\",\n";
  js += "  \"adam_step\": " + std::to_string(adam ? adam->step() : 0) + ",\n";
  js += "  \"has_optimizer\": " + std::string(adam ? "true" : "false") + ",\n";
  if (state.loss_scale > 0) {
    char scale[64];
    std::snprintf(scale, sizeof(scale), "%.17g", state.loss_scale);
    js += "  \"loss_scale\": " + std::string(scale) + ",\n";
    js += "  \"loss_scale_tracker\": " + std::to_string(state.loss_scale_tracker) + ",\n";
  }
  if (!state.attention_kernels.empty()) {
    js += "  \"attention\": ";
    AppendJsonString(state.attention_kernels, &js);
    js += ",\n";
  }
  // Size and CRC-32 of each data file as written (read back from the page
  // cache), checked by LoadCheckpoint: a corrupted byte is refused before
  // any training on it. Checkpoints written before this load without them.
  js += "  \"files\": {";
  for (const char* file : {kModelFile, kOptimizerFile}) {
    if (adam == nullptr && file == kOptimizerFile) continue;
    DGCA_ASSIGN_OR_RETURN(FileDigest d, DigestFile(tmp_dir + "/" + file));
    js += std::string(file == kModelFile ? "" : ", ") + "\"" + file + "\": {\"bytes\": " +
          std::to_string(d.bytes) + ", \"crc32\": \"" + Hex32(d.crc32) + "\"}";
  }
  js += "},\n";
  js += "  \"config\": {";
  bool first = true;
  for (const auto& kv : ConfigFingerprint(cfg)) {
    js += first ? "" : ", ";
    first = false;
    AppendJsonString(kv.first, &js);
    js += ": " + std::to_string(kv.second);
  }
  js += "}\n}\n";
  DGCA_RETURN_IF_ERROR(WriteFileAtomically(tmp_dir + "/state.json", js));

  fs::remove_all(final_dir, ec);  // re-saving the same step replaces it
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) return InternalError("cannot rename " + tmp_dir + " to " + final_dir + ": " + ec.message());
  DGCA_RETURN_IF_ERROR(WriteFileAtomically(dir + "/latest", name + "\n"));
  return final_dir;
}

StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  const std::string path = dir + "/latest";
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    // Step directories without the pointer (deleted, or lost with a copy):
    // starting afresh would train from random weights and then overwrite
    // `latest`, silently discarding them. Refuse and say how to go on.
    std::vector<std::string> steps;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      bool is_step = name.size() == 13 && name.rfind("step-", 0) == 0;
      for (size_t i = 5; is_step && i < name.size(); ++i) is_step = name[i] >= '0' && name[i] <= '9';
      std::error_code dir_ec;
      if (is_step && it->is_directory(dir_ec)) steps.push_back(name);
    }
    if (steps.empty()) return NotFoundError(path + ": no checkpoint yet");
    std::sort(steps.begin(), steps.end());
    std::string list;
    for (size_t i = 0; i < steps.size() && i < 5; ++i) list += (i ? ", " : "") + steps[i];
    if (steps.size() > 5) {
      list += ", ... " + steps.back() + " (" + std::to_string(steps.size()) + " in all)";
    }
    return FailedPreconditionError(
        "checkpoint directory " + dir + " has no 'latest' file but holds step directories (" +
        list + "); refusing to start afresh over them. To resume from the newest, restore the "
        "pointer: echo " + steps.back() + " > " + path + " (any listed step works); to start a "
        "new run, use an empty checkpoint directory (or move the step directories away)");
  }
  DGCA_ASSIGN_OR_RETURN(std::string text,
                        ReadTextFile(path, kMaxLatestBytes, "one line 'step-NNNNNNNN'"));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.pop_back();
  }
  if (text.empty() || text.find('/') != std::string::npos || text == "." || text == "..") {
    return DataLossError(path + ": expected one line 'step-NNNNNNNN', got '" + text + "'");
  }
  const std::string step_dir = dir + "/" + text;
  if (!fs::is_directory(step_dir, ec)) {
    return DataLossError(path + ": names '" + text + "', which is not a directory in " + dir);
  }
  return step_dir;
}

namespace {

// state.json parsed and its fields validated; `js` kept for the config
// fingerprint, which only LoadCheckpoint checks.
struct StateFile {
  CheckpointState state;
  int64_t adam_step = 0;
  JsonValue js;
  // "files": data file name -> its recorded digest (empty: an older
  // checkpoint, nothing to verify).
  std::map<std::string, FileDigest> files;
};

StatusOr<StateFile> ReadStateFile(const std::string& state_path) {
  DGCA_ASSIGN_OR_RETURN(std::string text,
                        ReadTextFile(state_path, kMaxStateBytes, "a checkpoint's JSON state"));
  StateFile sf;
  DGCA_ASSIGN_OR_RETURN(sf.js, ParseJson(text, state_path));
  const JsonValue& js = sf.js;
  if (!js.is_object()) return DataLossError(state_path + ": expected a JSON object");
  CheckpointState& st = sf.state;
  int64_t& adam_step = sf.adam_step;
  if (!ParseI64(js.Find("step"), &st.step) || st.step < 0) {
    return DataLossError(state_path + ": missing or invalid integer field 'step'");
  }
  if (!ParseI64(js.Find("loader_step"), &st.loader_step) || st.loader_step < 0) {
    return DataLossError(state_path + ": missing or invalid integer field 'loader_step'");
  }
  if (!ParseU64(js.Find("seed"), &st.seed)) {
    return DataLossError(state_path + ": missing or invalid field 'seed' (decimal string)");
  }
  if (!ParseU64(js.Find("rng_state"), &st.rng_state)) {
    return DataLossError(state_path + ": missing or invalid field 'rng_state' (decimal string)");
  }
  if (!ParseI64(js.Find("adam_step"), &adam_step) || adam_step < 0) {
    return DataLossError(state_path + ": missing or invalid integer field 'adam_step'");
  }
  // Optional (fp16 runs only).
  if (const JsonValue* ls = js.Find("loss_scale"); ls != nullptr) {
    if (!ls->is_number() || !(ls->number > 0) || !std::isfinite(ls->number)) {
      return DataLossError(state_path + ": field 'loss_scale' must be a finite number > 0");
    }
    st.loss_scale = ls->number;
    if (!ParseI64(js.Find("loss_scale_tracker"), &st.loss_scale_tracker) || st.loss_scale_tracker < 0) {
      return DataLossError(state_path + ": missing or invalid integer field 'loss_scale_tracker' (it goes with 'loss_scale')");
    }
  }
  if (const JsonValue* a = js.Find("attention"); a != nullptr) {
    if (!a->is_string() || (a->string != "fused" && a->string != "gemm")) {
      return DataLossError(state_path + ": field 'attention' must be \"fused\" or \"gemm\"");
    }
    st.attention_kernels = a->string;
  }
  // Optional (checkpoints written before it have none).
  if (const JsonValue* files = js.Find("files"); files != nullptr) {
    if (!files->is_object()) return DataLossError(state_path + ": field 'files' must be an object");
    for (const auto& [name, entry] : files->object) {
      const std::string where = state_path + ": files['" + name + "']";
      if (name != kModelFile && name != kOptimizerFile) {
        return DataLossError(where + ": unknown file (expected " + kModelFile + " or " +
                             kOptimizerFile + ")");
      }
      FileDigest d;
      const JsonValue* crc = entry.Find("crc32");
      if (!ParseI64(entry.Find("bytes"), &d.bytes) || d.bytes < 0) {
        return DataLossError(where + ": missing or invalid integer field 'bytes'");
      }
      bool hex = crc != nullptr && crc->is_string() && crc->string.size() == 8;
      for (size_t i = 0; hex && i < 8; ++i) hex = std::isxdigit(static_cast<unsigned char>(crc->string[i]));
      if (!hex) return DataLossError(where + ": field 'crc32' must be 8 hex digits");
      d.crc32 = static_cast<uint32_t>(std::strtoul(crc->string.c_str(), nullptr, 16));
      if (!sf.files.emplace(name, d).second) return DataLossError(where + ": listed twice");
    }
    if (!sf.files.count(kModelFile)) {
      return DataLossError(state_path + ": field 'files' lacks " + std::string(kModelFile));
    }
  }
  return sf;
}

// The size and CRC-32 of `step_dir`/`name` against state.json's record
// (nothing to check when it has none).
Status VerifyFile(const StateFile& sf, const std::string& state_path, const std::string& step_dir,
                  const std::string& name) {
  auto it = sf.files.find(name);
  if (it == sf.files.end()) return OkStatus();
  const std::string path = step_dir + "/" + name;
  DGCA_ASSIGN_OR_RETURN(FileDigest got, DigestFile(path));
  const FileDigest& want = it->second;
  if (got.bytes != want.bytes || got.crc32 != want.crc32) {
    return DataLossError(path + ": corrupted: " + std::to_string(got.bytes) + " bytes with CRC-32 " +
                         Hex32(got.crc32) + ", but " + state_path + " records " +
                         std::to_string(want.bytes) + " bytes with CRC-32 " + Hex32(want.crc32) +
                         "; resume from an earlier step directory or start afresh");
  }
  return OkStatus();
}

// NOT_FOUND unless `step_dir` is a directory holding every one of `paths`.
Status CheckStepDir(const std::string& step_dir, std::initializer_list<std::string> paths) {
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) return NotFoundError("checkpoint " + step_dir + ": not a directory");
  for (const std::string& p : paths) {
    if (!fs::exists(p, ec)) return NotFoundError("checkpoint " + step_dir + ": missing " + p);
  }
  return OkStatus();
}

}  // namespace

StatusOr<CheckpointState> ReadCheckpointState(const std::string& step_dir) {
  const std::string state_path = step_dir + "/state.json";
  DGCA_RETURN_IF_ERROR(CheckStepDir(step_dir, {state_path}));
  DGCA_ASSIGN_OR_RETURN(StateFile sf, ReadStateFile(state_path));
  return sf.state;
}

StatusOr<ModelConfig> ReadCheckpointConfig(const std::string& step_dir) {
  const std::string state_path = step_dir + "/state.json";
  DGCA_RETURN_IF_ERROR(CheckStepDir(step_dir, {state_path}));
  DGCA_ASSIGN_OR_RETURN(StateFile sf, ReadStateFile(state_path));
  const JsonValue* conf = sf.js.Find("config");
  if (conf == nullptr || !conf->is_object()) {
    return DataLossError(state_path + ": missing object field 'config'");
  }
  // Every field ConfigFingerprint writes, each in its range.
  std::map<std::string, int64_t> v;
  for (const auto& kv : ConfigFingerprint(ModelConfig{})) {
    int64_t got = 0;
    if (!ParseI64(conf->Find(kv.first), &got)) {
      return DataLossError(state_path + ": config field '" + kv.first + "' missing or not an integer");
    }
    v[kv.first] = got;
  }
  auto range = [&](const char* name, int64_t lo, int64_t hi) -> Status {
    if (v[name] >= lo && v[name] <= hi) return OkStatus();
    return DataLossError(state_path + ": config field '" + name + "' is " + std::to_string(v[name]) +
                         ", outside " + std::to_string(lo) + ".." + std::to_string(hi));
  };
  constexpr int64_t kBig = int64_t{1} << 30;
  DGCA_RETURN_IF_ERROR(range("vocab_size", 1, kBig));
  DGCA_RETURN_IF_ERROR(range("hidden", 1, kBig));
  DGCA_RETURN_IF_ERROR(range("layers", 0, 1024));
  DGCA_RETURN_IF_ERROR(range("heads", 1, kBig));
  DGCA_RETURN_IF_ERROR(range("ffn", 1, kBig));
  DGCA_RETURN_IF_ERROR(range("max_position", 1, kBig));
  DGCA_RETURN_IF_ERROR(range("type_vocab", 1, kBig));
  DGCA_RETURN_IF_ERROR(range("prompt_length", 0, 1 << 16));
  DGCA_RETURN_IF_ERROR(range("prompt_encoder", 0, static_cast<int64_t>(PromptEncoderKind::kNone)));
  DGCA_RETURN_IF_ERROR(range("detector", 0, 1));
  DGCA_RETURN_IF_ERROR(range("candidate", 0, 1));
  DGCA_RETURN_IF_ERROR(range("candidate_top_k", 0, 1 << 16));
  DGCA_RETURN_IF_ERROR(range("fusion", 0, static_cast<int64_t>(FusionKind::kNone)));
  ModelConfig c;
  c.vocab_size = static_cast<int>(v["vocab_size"]);
  c.hidden = static_cast<int>(v["hidden"]);
  c.layers = static_cast<int>(v["layers"]);
  c.heads = static_cast<int>(v["heads"]);
  c.ffn = static_cast<int>(v["ffn"]);
  c.max_position = static_cast<int>(v["max_position"]);
  c.type_vocab = static_cast<int>(v["type_vocab"]);
  c.prompt_length = static_cast<int>(v["prompt_length"]);
  c.prompt_encoder = static_cast<PromptEncoderKind>(v["prompt_encoder"]);
  c.detector = v["detector"] != 0;
  c.candidate = v["candidate"] != 0;
  c.candidate_top_k = static_cast<int>(v["candidate_top_k"]);
  c.fusion = static_cast<FusionKind>(v["fusion"]);
  // The inverse of ConfigFingerprint, held to it: a field added there and
  // not here is caught by this, not by a silent default.
  if (ConfigFingerprint(c) != v) {
    return InternalError(state_path + ": ReadCheckpointConfig does not read back every field of "
                         "ConfigFingerprint");
  }
  return c;
}

Status LoadCheckpoint(const std::string& step_dir, const ModelConfig& cfg, ParamStore* params,
                      AdamW* adam, CheckpointState* state) {
  const std::string state_path = step_dir + "/state.json";
  const std::string model_path = step_dir + "/model.safetensors";
  const std::string opt_path = step_dir + "/optimizer.safetensors";
  DGCA_RETURN_IF_ERROR(CheckStepDir(step_dir, {state_path, model_path}));
  std::error_code ec;
  if (adam != nullptr && !fs::exists(opt_path, ec)) {
    return NotFoundError("checkpoint " + step_dir + ": missing " + opt_path +
                         " (needed to resume the optimizer)");
  }

  // state.json first: a config mismatch explains shape errors better.
  DGCA_ASSIGN_OR_RETURN(StateFile sf, ReadStateFile(state_path));
  const JsonValue& js = sf.js;
  const CheckpointState& st = sf.state;
  const int64_t adam_step = sf.adam_step;
  const JsonValue* conf = js.Find("config");
  if (conf == nullptr || !conf->is_object()) {
    return DataLossError(state_path + ": missing object field 'config'");
  }
  for (const auto& kv : ConfigFingerprint(cfg)) {
    int64_t got = 0;
    if (!ParseI64(conf->Find(kv.first), &got)) {
      return DataLossError(state_path + ": config field '" + kv.first + "' missing or not an integer");
    }
    if (got != kv.second) {
      return FailedPreconditionError(state_path + ": model config mismatch: checkpoint has " +
                                     kv.first + "=" + std::to_string(got) + ", this run has " +
                                     kv.first + "=" + std::to_string(kv.second));
    }
  }

  // The files' recorded digests (when state.json has them) before parsing:
  // a torn or flipped byte is named as such, not as whatever it decodes to.
  DGCA_RETURN_IF_ERROR(VerifyFile(sf, state_path, step_dir, kModelFile));
  if (adam != nullptr) {
    if (!sf.files.empty() && !sf.files.count(kOptimizerFile)) {
      return DataLossError(state_path + ": field 'files' lacks " + std::string(kOptimizerFile) +
                           " (needed to resume the optimizer)");
    }
    DGCA_RETURN_IF_ERROR(VerifyFile(sf, state_path, step_dir, kOptimizerFile));
  }
  DGCA_ASSIGN_OR_RETURN(SafetensorsFile model, ReadSafetensors(model_path));
  DGCA_RETURN_IF_ERROR(CheckTensors(model_path, model, *params, {""}));
  DGCA_RETURN_IF_ERROR(CheckFinite(model_path, model, *params, "", false));
  SafetensorsFile opt;
  if (adam != nullptr) {
    DGCA_ASSIGN_OR_RETURN(opt, ReadSafetensors(opt_path));
    DGCA_RETURN_IF_ERROR(CheckTensors(opt_path, opt, *params, {"m.", "v."}));
    DGCA_RETURN_IF_ERROR(CheckFinite(opt_path, opt, *params, "m.", false));
    DGCA_RETURN_IF_ERROR(CheckFinite(opt_path, opt, *params, "v.", true));
  }
  // All validated: copy.
  for (int i = 0; i < params->size(); ++i) {
    const ParamInfo& p = params->info(i);
    const Tensor& t = model.tensors.at(p.name);
    std::copy(t.data.begin(), t.data.end(), params->value(i));
    if (adam != nullptr) {
      const Tensor& m = opt.tensors.at("m." + p.name);
      const Tensor& v = opt.tensors.at("v." + p.name);
      std::copy(m.data.begin(), m.data.end(), adam->m().data() + p.offset);
      std::copy(v.data.begin(), v.data.end(), adam->v().data() + p.offset);
    }
  }
  if (adam != nullptr) adam->set_step(adam_step);
  if (state != nullptr) *state = st;
  return OkStatus();
}

std::string HfLoadReport::Summary() const {
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 4; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 4) s += ", ...";
    return s;
  };
  std::string s = "loaded " + std::to_string(loaded) + " tensors";
  s += ", missing " + std::to_string(missing.size());
  if (!missing.empty()) s += " (" + list(missing) + ")";
  s += ", unexpected " + std::to_string(unexpected.size());
  if (!unexpected.empty()) s += " (" + list(unexpected) + ")";
  s += ", ignored " + std::to_string(ignored.size());
  return s;
}

bool IsHfBertParameter(const std::string& name) {
  return name.rfind("bert.", 0) == 0 || name.rfind("cls.predictions.", 0) == 0;
}

StatusOr<HfLoadReport> LoadHfInit(const std::string& path, ParamStore* params) {
  DGCA_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  auto known_extra = [](const std::string& n) {
    auto starts = [&](const char* p) { return n.rfind(p, 0) == 0; };
    return n == "bert.embeddings.position_ids" || n == "embeddings.position_ids" ||
           n == "cls.predictions.decoder.weight" || n == "cls.predictions.decoder.bias" ||
           starts("bert.pooler.") || starts("pooler.") || starts("cls.seq_relationship.");
  };
  HfLoadReport report;
  // name in file -> parameter index
  std::vector<std::pair<const Tensor*, int>> plan;
  std::set<int> hit;
  for (const auto& kv : file.tensors) {
    int idx = params->Find(kv.first);
    if (idx < 0 && kv.first.rfind("bert.", 0) != 0) idx = params->Find("bert." + kv.first);
    if (idx < 0) {
      if (known_extra(kv.first)) {
        report.ignored.push_back(kv.first);
      } else {
        report.unexpected.push_back(kv.first);
      }
      continue;
    }
    const ParamInfo& info = params->info(idx);
    if (kv.second.shape != info.shape) {
      return InvalidArgumentError(path + ": tensor '" + kv.first + "' has shape " +
                                  ShapeString(kv.second.shape) + " but the model's '" + info.name +
                                  "' is " + ShapeString(info.shape) +
                                  (info.name.find("word_embeddings") != std::string::npos
                                       ? " (does the vocabulary match the checkpoint's?)"
                                       : ""));
    }
    plan.emplace_back(&kv.second, idx);
    hit.insert(idx);
  }
  for (const auto& pi : plan) {
    std::copy(pi.first->data.begin(), pi.first->data.end(), params->value(pi.second));
  }
  report.loaded = static_cast<int>(plan.size());
  for (int i = 0; i < params->size(); ++i) {
    if (!hit.count(i)) report.missing.push_back(params->info(i).name);
  }
  return report;
}

}  // namespace dgca
