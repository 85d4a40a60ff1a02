#include "worker/rank/train_config.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "spec/spec.h"
#include "spec/spec_files.h"
#include "model/core/dropout.h"

namespace dgca {
namespace {

std::string Lower(const std::string& s) { return absl::AsciiStrToLower(s); }
bool IsAuto(const std::string& s) { return s.empty() || Lower(s) == "auto"; }

void Decide(v1::Plan* plan, const std::string& name, const std::string& value,
            v1::ValueSource source, const std::string& reason) {
  auto* d = plan->add_decisions();
  d->set_name(name);
  d->set_value(value);
  d->set_source(source);
  d->set_reason(reason);
}

}  // namespace

v1::Plan SimplePlan(const v1::JobSpec& spec, int ranks) {
  v1::Plan plan;
  const auto& t = spec.train();
  ranks = std::max(1, ranks);
  plan.set_ranks(ranks);
  plan.set_device("cpu");
  plan.set_backend(ranks > 1 ? "gloo" : "local");
  const bool user_acc = t.accumulation() > 0;
  int acc = user_acc ? t.accumulation() : 1;
  const bool user_mb = t.micro_batch() > 0;
  int mb = user_mb ? t.micro_batch() : std::max(1, t.global_batch() / (acc * ranks));
  plan.set_accumulation(acc);
  plan.set_micro_batch(mb);
  Decide(&plan, "train.accumulation", absl::StrCat(acc), user_acc ? v1::USER : v1::DEFAULT,
         user_acc ? "set in the spec" : "no planner: 1 (no accumulation)");
  Decide(&plan, "train.micro_batch", absl::StrCat(mb), user_mb ? v1::USER : v1::DEFAULT,
         user_mb ? "set in the spec"
                 : absl::StrCat("no planner: global_batch ", t.global_batch(), " / (accumulation ",
                                acc, " x ranks ", ranks, ")"));
  std::string prec = IsAuto(t.precision()) ? "fp32" : Lower(t.precision());
  plan.set_precision(prec);
  Decide(&plan, "train.precision", prec, IsAuto(t.precision()) ? v1::DEFAULT : v1::USER,
         IsAuto(t.precision()) ? "CPU trainer: fp32" : "set in the spec");
  int threads = spec.resources().threads_per_rank() > 0 ? spec.resources().threads_per_rank() : 1;
  plan.set_threads_per_rank(threads);
  Decide(&plan, "resources.threads_per_rank", absl::StrCat(threads),
         spec.resources().threads_per_rank() > 0 ? v1::USER : v1::DEFAULT,
         spec.resources().threads_per_rank() > 0 ? "set in the spec" : "no planner: 1");
  int loader = spec.data().loader().threads() > 0 ? spec.data().loader().threads() : 1;
  plan.set_loader_threads(loader);
  double bucket = spec.comm().bucket_mb() > 0 ? spec.comm().bucket_mb() : 25.0;
  plan.set_bucket_mb(bucket);
  Decide(&plan, "comm.bucket_mb", absl::StrCat(bucket),
         spec.comm().bucket_mb() > 0 ? v1::USER : v1::DEFAULT,
         spec.comm().bucket_mb() > 0 ? "set in the spec" : "no planner: 25 MB (PyTorch DDP's default)");
  for (const auto& [k, v] : spec.comm().env()) (*plan.mutable_env())[k] = v;
  for (int r = 0; r < ranks; ++r) {
    plan.add_rank_nodes("");
    plan.add_rank_local_devices(-1);
  }
  return plan;
}

absl::StatusOr<TrainConfig> TrainConfigFromSpec(const v1::JobSpec& spec, const v1::Plan& plan) {
  TrainConfig c;
  const auto& ms = spec.model();
  ModelConfig m;
  // Heads and prompt first: ApplyPreset keeps them.
  m.prompt_length = ms.prompt().length();
  const std::string enc = Lower(ms.prompt().encoder());
  if (enc == "lstm" || enc.empty()) {
    m.prompt_encoder = PromptEncoderKind::kLstm;
  } else if (enc == "mlp") {
    m.prompt_encoder = PromptEncoderKind::kMlp;
  } else if (enc == "none") {
    m.prompt_encoder = PromptEncoderKind::kNone;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.prompt.encoder: '", ms.prompt().encoder(), "' is not one of lstm, mlp, none"));
  }
  const auto& hs = ms.heads_spec();
  m.detector = hs.detector();
  m.candidate = hs.candidate().enabled();
  if (hs.candidate().top_k() > 0) m.candidate_top_k = hs.candidate().top_k();
  const std::string fusion = Lower(hs.fusion());
  if (fusion == "gated" || fusion.empty()) {
    m.fusion = FusionKind::kGated;
  } else if (fusion == "none") {
    m.fusion = FusionKind::kNone;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("model.heads.fusion: '", hs.fusion(), "' is not one of gated, none"));
  }
  const std::string preset = Lower(ms.preset());
  if (!preset.empty() && preset != "custom") {
    StatusOr<ModelConfig> p = ApplyPreset(preset, m);
    if (!p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.preset: ", p.status().message()));
    }
    m = *p;
  }
  if (ms.layers() > 0) m.layers = ms.layers();
  if (ms.hidden() > 0) m.hidden = ms.hidden();
  if (ms.heads() > 0) m.heads = ms.heads();
  if (ms.ffn() > 0) m.ffn = ms.ffn();
  if (m.heads <= 0 || m.hidden % m.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model: hidden ", m.hidden,
                                                   " must be a multiple of heads ", m.heads));
  }
  // model.dropout: unset is HF BertConfig's 0.1 (ParseJobSpec fills it in;
  // a JobSpec built in code or stored before the field existed may not).
  // Checked as the float the model gets (0.99999999 rounds to 1).
  const SpecDropout dr = DropoutOf(ms);
  m.hidden_dropout = static_cast<float>(dr.hidden);
  m.attention_dropout = static_cast<float>(dr.attention);
  if (!ValidDropout(dr.hidden)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dropout.hidden: ", dr.hidden, " is not in [0, 1)"));
  }
  if (!ValidDropout(dr.attention)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dropout.attention: ", dr.attention, " is not in [0, 1)"));
  }
  c.model = m;

  const std::string& base = spec.base_dir();
  const auto& ds = spec.data();
  c.train_path = ResolveSpecPath(base, ds.train());
  if (c.train_path.empty()) {
    return absl::InvalidArgumentError(
        "data.train: no training data; set it to an ECSpell-format file (src<TAB>trg)");
  }
  c.eval_path = ResolveSpecPath(base, ds.eval());
  c.vocab_path = ResolveSpecPath(base, ms.vocab());
  c.confusion_path = ResolveSpecPath(base, hs.candidate().confusion());
  c.init_from = ResolveSpecPath(base, ms.init_from());
  if (ds.max_seq_len() > 0) c.max_seq_len = ds.max_seq_len();
  const std::string mft = Lower(ds.mft().mode());
  if (mft == "noerror" || mft.empty()) {
    c.mft_mode = MftMode::kNoError;
  } else if (mft == "none") {
    c.mft_mode = MftMode::kNone;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("data.mft.mode: '", ds.mft().mode(), "' is not one of noerror, none"));
  }
  c.mft_rate = static_cast<float>(ds.mft().rate());
  c.loader_threads = plan.loader_threads() > 0    ? plan.loader_threads()
                     : ds.loader().threads() > 0 ? ds.loader().threads()
                                                 : 1;
  c.prefetch = ds.loader().prefetch() > 0 ? ds.loader().prefetch() : 2;

  const auto& t = spec.train();
  if (t.steps() <= 0) return absl::InvalidArgumentError("train.steps must be > 0");
  c.steps = t.steps();
  const int ranks = plan.ranks() > 0 ? plan.ranks() : std::max(1, spec.resources().ranks());
  c.accumulation = plan.accumulation() > 0 ? plan.accumulation()
                   : t.accumulation() > 0  ? t.accumulation()
                                           : 1;
  c.micro_batch = plan.micro_batch() > 0 ? plan.micro_batch()
                  : t.micro_batch() > 0  ? t.micro_batch()
                                         : std::max(1, t.global_batch() / (c.accumulation * ranks));
  std::string prec = !IsAuto(plan.precision()) ? Lower(plan.precision())
                     : !IsAuto(t.precision())  ? Lower(t.precision())
                                               : "fp32";
  const ::dgca::StatusOr<::dgca::Precision> parsed = ::dgca::ParsePrecision(prec, "train.precision");
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.precision: '", prec, "' is not one of auto, fp32, fp16, bf16"));
  }
  c.precision = *parsed;
  // train.attention: the plan's (CUDA ranks: "auto" there means the
  // planner found that both versions fit, so the rank times them), else
  // the spec's (empty = auto).
  const std::string attention = !plan.attention().empty() ? Lower(plan.attention()) : Lower(t.attention());
  auto kernels = ParseAttentionKernels(attention.empty() ? "auto" : attention, "train.attention");
  if (!kernels.ok()) return absl::InvalidArgumentError(kernels.status().message());
  c.attention = *kernels;
  const auto& o = t.optimizer();
  c.lr = static_cast<float>(o.lr());
  c.weight_decay = static_cast<float>(o.weight_decay());
  c.warmup_steps = o.warmup_steps();
  c.clip_norm = static_cast<float>(o.clip_norm());
  const std::string sched = Lower(o.schedule());
  if (sched == "linear" || sched.empty()) {
    c.schedule = LrSchedule::kLinear;
  } else if (sched == "constant") {
    c.schedule = LrSchedule::kConstant;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.optimizer.schedule: '", o.schedule(), "' is not one of constant, linear"));
  }
  c.eval_every = t.eval_every();
  c.checkpoint_every = t.checkpoint_every();
  c.keep_checkpoints = KeepCheckpointsOf(t);
  if (c.keep_checkpoints < 0) {
    // Only a spec that skipped ParseJobSpec gets here.
    return absl::InvalidArgumentError(absl::StrCat(
        "train.keep_checkpoints: ", c.keep_checkpoints,
        " is not >= 0 (0 keeps every checkpoint; N keeps the newest N and the best by eval)"));
  }
  c.seed = t.seed();
  c.threads = plan.threads_per_rank() > 0            ? plan.threads_per_rank()
              : spec.resources().threads_per_rank() > 0 ? spec.resources().threads_per_rank()
                                                        : 1;
  c.bucket_mb = plan.bucket_mb() > 0          ? plan.bucket_mb()
                : spec.comm().bucket_mb() > 0 ? spec.comm().bucket_mb()
                                              : 25.0;
  c.overlap = spec.comm().overlap();
  c.comm_timeout_s = spec.comm().timeout_s() > 0 ? spec.comm().timeout_s() : 60.0;
  return c;
}

}  // namespace dgca
