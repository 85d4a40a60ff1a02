#include "model/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "model/core/confusion.h"
#include "model/core/data.h"
#include "model/core/strings.h"
#include "model/core/tokenizer.h"
#include "model/nn/model.h"
#include "model/train/buckets.h"
#include "model/train/checkpoint.h"
#include "model/train/checkpoint_retention.h"
#include "model/train/loss_scaler.h"
#include "model/train/optimizer.h"
#include "model/train/predict.h"

namespace dgca {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string FormatDuration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  long long t = static_cast<long long>(s + 0.5);
  char buf[64];
  if (t >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", t / 3600, (t / 60) % 60);
  } else if (t >= 60) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", t);
  }
  return buf;
}

class Logger {
 public:
  Logger(TrainObserver* obs, int rank) : obs_(obs), rank_(rank) {}
  void operator()(const std::string& line) const {
    if (obs_) obs_->OnLog(line);
  }
  int rank() const { return rank_; }

 private:
  TrainObserver* obs_;
  int rank_;
};

// The special tokens a training batch is built from (model/core/data.cc
// BuildBatch: [PAD] fills, [CLS] starts the row and the prompt slots, [SEP]
// ends the halves, [MASK] the targets and MFT; Vocab::Lookup maps unknown
// characters to [UNK]). A vocabulary without one would fall back to BERT's
// fixed id, which may be outside it: refused here, naming them and the file.
Status CheckSpecialTokens(const Vocab& vocab, const std::string& path) {
  std::string missing;
  int n = 0;
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (vocab.Contains(t)) continue;
    missing += std::string(n++ ? ", " : "") + t;
  }
  if (n == 0) return OkStatus();
  return InvalidArgumentError(path + ": the vocabulary (" + std::to_string(vocab.size()) +
                              " tokens) lacks the special token" + (n > 1 ? "s " : " ") + missing +
                              " that training needs ([PAD], [UNK], [CLS], [SEP] and [MASK], "
                              "one line each, as in BERT's vocab.txt)");
}

Status ValidateConfig(const TrainConfig& c) {
  if (c.train_path.empty()) return InvalidArgumentError("train: data.train (train_path) is empty");
  if (c.steps <= 0) return InvalidArgumentError("train: steps must be > 0, got " + std::to_string(c.steps));
  if (c.micro_batch <= 0) {
    return InvalidArgumentError("train: micro_batch must be > 0, got " + std::to_string(c.micro_batch));
  }
  if (c.accumulation <= 0) {
    return InvalidArgumentError("train: accumulation must be > 0, got " + std::to_string(c.accumulation));
  }
  if (c.bucket_mb <= 0) return InvalidArgumentError("train: bucket_mb must be > 0");
  return OkStatus();
}

// Decodes the eval set with Predict (no MFT) and scores it
// (model/train/predict.h: the path `dgca correct` decodes by too). Every
// rank evaluates the whole (possibly capped) eval set: simple, and
// identical on all ranks, so no reduction is needed.
StatusOr<EvalReport> Evaluate(DgcaModel* model, const std::vector<Example>& examples,
                              const ConfusionSet* confusion, const BatchOptions& opts,
                              int batch_size, int64_t max_samples, int64_t step,
                              PhaseTracker* phases) {
  // Every batch is progress: a long eval is not a hang.
  auto on_batch = [&](int64_t b, int64_t batches) {
    if (phases == nullptr) return;
    if (b == 0) {
      phases->Enter(TrainPhase::kEval, step, batches > 0 ? 1 : 0, static_cast<int32_t>(batches));
    } else {
      phases->Progress(static_cast<int32_t>(b + 1));
    }
  };
  DGCA_ASSIGN_OR_RETURN(
      std::vector<std::vector<int32_t>> pred,
      PredictExamples(model, examples, confusion, opts, batch_size, max_samples, on_batch));
  EvalReport report;
  report.step = step;
  report.metrics = ScorePredictions(examples, pred);
  report.samples = static_cast<int64_t>(pred.size());
  return report;
}

std::string EvalLine(const EvalReport& r) {
  auto get = [&](const char* k) {
    auto it = r.metrics.find(k);
    return it == r.metrics.end() ? 0.0 : it->second;
  };
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "eval step %lld (%lld sentences): sentence correction P/R/F1 %.4f/%.4f/%.4f, "
                "detection F1 %.4f, char correction F1 %.4f, false positive rate %.4f",
                static_cast<long long>(r.step), static_cast<long long>(r.samples),
                get("sentence_correction_precision"), get("sentence_correction_recall"),
                get("sentence_correction_f1"), get("sentence_detection_f1"),
                get("char_correction_f1"), get("false_positive_rate"));
  return buf;
}

}  // namespace

StatusOr<TrainResult> Train(const TrainConfig& config, Communicator* comm,
                            TrainObserver* observer) {
  return Train(config, comm, observer, MakeCpuTrainDevice);
}

StatusOr<TrainResult> Train(const TrainConfig& config, Communicator* comm,
                            TrainObserver* observer, const TrainDeviceFactory& make_device) {
  DGCA_RETURN_IF_ERROR(ValidateConfig(config));
  std::unique_ptr<Communicator> local;
  if (comm == nullptr) {
    local = MakeLocalCommunicator();
    comm = local.get();
  }
  const int rank = comm->rank();
  const int world = comm->world_size();
  Logger log(observer, rank);
  const auto run_start = Clock::now();
  // Where this thread is, for hang diagnosis (model/train/train_phase.h).
  PhaseTracker* const phases = observer ? observer->phases() : nullptr;
  auto enter = [phases](TrainPhase p, int64_t step) {
    if (phases) phases->Enter(p, step);
  };
  enter(TrainPhase::kStarting, 0);

  // Vocabulary: given, or the one saved next to the checkpoints (so a resumed
  // run keeps its ids), or built from the training data.
  Vocab vocab;
  const std::string saved_vocab =
      config.checkpoint_dir.empty() ? "" : config.checkpoint_dir + "/vocab.txt";
  if (!config.vocab_path.empty()) {
    DGCA_ASSIGN_OR_RETURN(vocab, Vocab::Load(config.vocab_path));
    DGCA_RETURN_IF_ERROR(CheckSpecialTokens(vocab, config.vocab_path));
  } else if (!saved_vocab.empty() && fs::exists(saved_vocab)) {
    DGCA_ASSIGN_OR_RETURN(vocab, Vocab::Load(saved_vocab));
    DGCA_RETURN_IF_ERROR(CheckSpecialTokens(vocab, saved_vocab));
    log("vocab: " + std::to_string(vocab.size()) + " tokens from " + saved_vocab);
  } else {
    DGCA_ASSIGN_OR_RETURN(vocab, Vocab::BuildFromExamples({config.train_path}));
    log("vocab: built " + std::to_string(vocab.size()) + " tokens from " + config.train_path);
    if (!saved_vocab.empty() && rank == 0) {
      // Written under a temporary name and renamed: other ranks may be
      // checking for it right now.
      std::error_code ec;
      fs::create_directories(config.checkpoint_dir, ec);
      const std::string tmp = saved_vocab + ".tmp";
      DGCA_RETURN_IF_ERROR(vocab.Save(tmp));
      fs::rename(tmp, saved_vocab, ec);
      if (ec) return InternalError("cannot rename " + tmp + " to " + saved_vocab + ": " + ec.message());
    }
  }

  ModelConfig mcfg = config.model;
  mcfg.vocab_size = vocab.size();

  std::shared_ptr<const ConfusionSet> confusion;
  if (mcfg.candidate) {
    if (!config.confusion_path.empty()) {
      DGCA_ASSIGN_OR_RETURN(ConfusionSet cs, ConfusionSet::LoadJson(config.confusion_path, vocab));
      confusion = std::make_shared<const ConfusionSet>(std::move(cs));
      log("confusion set: " + config.confusion_path);
    } else {
      DGCA_ASSIGN_OR_RETURN(ConfusionSet cs, ConfusionSet::BuildFromUnihan(vocab));
      confusion = std::make_shared<const ConfusionSet>(std::move(cs));
      log("confusion set: built-in Unihan homophones");
    }
  }

  ReadStats stats;
  const int max_chars = MaxCharsForSeqLen(config.max_seq_len, mcfg.prompt_length);
  if (max_chars < 1) {
    return InvalidArgumentError("train: max_seq_len " + std::to_string(config.max_seq_len) +
                                " leaves no room for characters with prompt length " +
                                std::to_string(mcfg.prompt_length) + " (need >= " +
                                std::to_string(2 * mcfg.prompt_length + 4) + ")");
  }
  DGCA_ASSIGN_OR_RETURN(std::vector<Example> train_ex,
                        ReadEcspell(config.train_path, vocab, max_chars, &stats));
  log("train data " + config.train_path + ": " + std::to_string(stats.lines) + " lines, " +
      std::to_string(stats.kept) + " kept, " + std::to_string(stats.skipped_unequal) +
      " skipped (unequal lengths), " + std::to_string(stats.skipped_empty) + " empty, " + std::to_string(stats.truncated) +
      " truncated to " + std::to_string(max_chars) + " chars");
  if (train_ex.empty()) {
    return InvalidArgumentError("train data " + config.train_path + ": no usable sentence pairs");
  }
  auto train_examples = std::make_shared<const std::vector<Example>>(std::move(train_ex));
  std::vector<Example> eval_examples;
  if (!config.eval_path.empty()) {
    ReadStats es;
    DGCA_ASSIGN_OR_RETURN(eval_examples, ReadEcspell(config.eval_path, vocab, max_chars, &es));
    log("eval data " + config.eval_path + ": " + std::to_string(es.kept) + " kept, " +
        std::to_string(es.skipped_unequal) + " skipped (unequal lengths), " +
        std::to_string(es.truncated) + " truncated to " + std::to_string(max_chars) + " chars");
  }

  // Initial weights: resume > init_from > random (from the seed). The
  // checkpoint is found before the device is built: a resumed run keeps the
  // attention kernels it ran (CheckpointState::attention_kernels).
  std::string resume_dir;
  if (!config.resume_from.empty()) {
    if (fs::exists(config.resume_from + "/latest")) {
      DGCA_ASSIGN_OR_RETURN(resume_dir, LatestCheckpoint(config.resume_from));
    } else {
      resume_dir = config.resume_from;
    }
  } else if (!config.checkpoint_dir.empty()) {
    auto latest = LatestCheckpoint(config.checkpoint_dir);
    if (latest.ok()) {
      resume_dir = *latest;
    } else if (latest.status().code() != StatusCode::kNotFound) {
      return latest.status();
    }
  }
  TrainDeviceSpec dspec;
  dspec.model = mcfg;
  dspec.micro_batch = config.micro_batch;
  dspec.seq_len = config.max_seq_len;
  dspec.seed = config.seed;
  dspec.threads = config.threads;
  dspec.precision = config.precision;
  dspec.deterministic = config.deterministic;
  dspec.cuda_graphs = config.cuda_graphs;
  dspec.attention = config.attention;
  if (!resume_dir.empty() && config.attention == AttentionKernels::kAuto) {
    DGCA_ASSIGN_OR_RETURN(CheckpointState resumed, ReadCheckpointState(resume_dir));
    dspec.resumed_attention = resumed.attention_kernels;
  }
  dspec.loss_scaler.init_scale = config.fp16_init_loss_scale;
  dspec.adam.weight_decay = config.weight_decay;
  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<TrainDevice> device, make_device(dspec));
  DgcaModel* model = device->model();
  ParamStore& params = device->params();
  AdamW& adam = device->adam();
  log("device: " + device->Describe());
  if (device->device_memory() && world > 1 && comm->backend() != "nccl") {
    return FailedPreconditionError("train: device " + device->Describe() + " keeps gradients in GPU "
                                   "memory; data parallel over it needs the nccl backend, got " +
                                   comm->backend());
  }
  if (world > 1) {
    bool changed = false;
    enter(TrainPhase::kBroadcast, 0);
    DGCA_RETURN_IF_ERROR(device->AdoptRankZeroChoices(comm, &changed));
    enter(TrainPhase::kStarting, 0);
    if (changed) log("device (rank 0's timed choices adopted): " + device->Describe());
  }

  int64_t start_step = 0;
  int64_t loader_step = 0;  // differs from start_step only if the global batch changed
  if (!resume_dir.empty()) {
    CheckpointState st;
    DGCA_RETURN_IF_ERROR(LoadCheckpoint(resume_dir, mcfg, &params, &adam, &st));
    DGCA_RETURN_IF_ERROR(device->PushFromHost());
    if (LossScaler* scaler = device->loss_scaler(); scaler != nullptr && st.loss_scale > 0) {
      DGCA_RETURN_IF_ERROR(scaler->Restore(st.loss_scale, st.loss_scale_tracker)
                               .WithPrefix("checkpoint " + resume_dir));
    }
    start_step = st.step;
    loader_step = st.loader_step;
    if (st.seed != config.seed) {
      log("warning: checkpoint seed " + std::to_string(st.seed) + " differs from this run's " +
          std::to_string(config.seed) + "; the data order will differ");
    }
    log("resumed from " + resume_dir + " at step " + std::to_string(start_step));
  } else if (!config.init_from.empty()) {
    DGCA_ASSIGN_OR_RETURN(HfLoadReport r, LoadHfInit(config.init_from, &params));
    DGCA_RETURN_IF_ERROR(device->PushFromHost());
    log("init_from " + config.init_from + ": " + r.Summary());
  } else {
    log("random init (seed " + std::to_string(config.seed) + "), " +
        std::to_string(params.parameter_count()) + " parameters");
  }
  if (world > 1) {
    // Every rank starts from rank 0's weights (and optimizer state).
    enter(TrainPhase::kBroadcast, start_step);
    const auto tb = Clock::now();
    const size_t n = static_cast<size_t>(params.total_numel());
    DGCA_RETURN_IF_ERROR(comm->Broadcast(device->value_buffer(), n, 0));
    DGCA_RETURN_IF_ERROR(comm->Broadcast(device->moment1_buffer(), n, 0));
    DGCA_RETURN_IF_ERROR(comm->Broadcast(device->moment2_buffer(), n, 0));
    // The step count is every rank's own: all load the same checkpoint.
    DGCA_RETURN_IF_ERROR(device->BuffersChanged(adam.step()));
    char buf[160];
    std::snprintf(buf, sizeof(buf), "weights and optimizer state broadcast from rank 0 (%.1f MB) in %.3f s",
                  3.0 * params.total_numel() * sizeof(float) / 1e6, Since(tb));
    log(buf);
  }

  BatchOptions bopt;
  bopt.seq_len = config.max_seq_len;
  bopt.prompt_length = mcfg.prompt_length;
  bopt.top_k = mcfg.candidate ? mcfg.candidate_top_k : 0;
  bopt.mft_mode = config.mft_mode;
  bopt.mft_rate = config.mft_rate;
  bopt.seed = config.seed;
  SetSpecialTokens(vocab, &bopt);
  LoaderOptions lopt;
  lopt.batch = bopt;
  lopt.micro_batch = config.micro_batch;
  lopt.accumulation = config.accumulation;
  lopt.rank = rank;
  lopt.world_size = world;
  lopt.threads = std::max(1, config.loader_threads);
  lopt.prefetch = std::max(1, config.prefetch);
  LoaderPosition pos;
  pos.step = loader_step;
  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<DataLoader> loader,
                        DataLoader::Create(train_examples, confusion, lopt, pos));

  GradientBuckets buckets(comm, &params, config.bucket_mb, device->grad_buffer());
  log("training: rank " + std::to_string(rank) + "/" + std::to_string(world) + ", steps " +
      std::to_string(start_step) + ".." + std::to_string(config.steps) + ", global batch " +
      std::to_string(static_cast<int64_t>(config.micro_batch) * config.accumulation * world) +
      " (micro " + std::to_string(config.micro_batch) + " x accumulation " +
      std::to_string(config.accumulation) + " x ranks " + std::to_string(world) + "), " +
      std::to_string(buckets.buckets().size()) + " gradient buckets, overlap " +
      (config.overlap ? "on" : "off"));

  TrainResult result;
  int64_t last_ckpt = -1;
  // Rank 0, after each checkpoint and each eval recorded beside one:
  // train.keep_checkpoints (model/train/checkpoint_retention.h). A prune that
  // fails costs disk, not the run: it is logged and training goes on.
  auto prune = [&] {
    if (rank != 0 || config.checkpoint_dir.empty() || config.keep_checkpoints <= 0) return;
    auto r = PruneCheckpoints(config.checkpoint_dir, config.keep_checkpoints);
    if (!r.ok()) {
      log("warning: checkpoint pruning stopped: " + std::string(r.status().message()) +
          "; training goes on, and the directory may hold more than keep_checkpoints (" +
          std::to_string(config.keep_checkpoints) + ") checkpoints until the next prune");
      return;
    }
    if (const std::string line = r->Summary(); !line.empty()) log(line);
  };
  auto run_eval = [&](int64_t step) -> Status {
    if (eval_examples.empty()) return OkStatus();
    DGCA_ASSIGN_OR_RETURN(EvalReport er,
                          Evaluate(model, eval_examples, confusion.get(), bopt,
                                   config.micro_batch, config.max_eval_samples, step, phases));
    log(EvalLine(er));
    if (observer) observer->OnEval(er);
    result.eval = er.metrics;
    if (rank == 0 && !config.checkpoint_dir.empty() && last_ckpt == step) {
      // The weights just evaluated are the checkpoint of this step: record
      // the eval beside it, for retention's "best" (and for whoever picks a
      // checkpoint by hand). Losing it loses that checkpoint its claim to
      // best, no more.
      const std::string step_dir = config.checkpoint_dir + "/" + CheckpointDirName(step);
      if (Status w = WriteCheckpointEval(step_dir, step, er.metrics); !w.ok()) {
        log("warning: eval of step " + std::to_string(step) + " not recorded in " + step_dir +
            ": " + std::string(w.message()));
      } else {
        prune();  // it may be the new best, and the old best now prunable
      }
    }
    return OkStatus();
  };
  auto save = [&](int64_t step) -> Status {
    if (config.checkpoint_dir.empty() || last_ckpt == step) return OkStatus();
    std::string dir;
    if (rank == 0) {
      enter(TrainPhase::kCheckpoint, step);
      DGCA_RETURN_IF_ERROR(device->PullToHost());
      CheckpointState st;
      st.step = step;
      st.loader_step = loader->position().step;
      st.seed = config.seed;
      if (const LossScaler* scaler = device->loss_scaler(); scaler != nullptr) {
        st.loss_scale = scaler->scale();
        st.loss_scale_tracker = scaler->growth_tracker();
      }
      st.attention_kernels = device->attention_kernels();
      DGCA_ASSIGN_OR_RETURN(dir, SaveCheckpoint(config.checkpoint_dir, params, &adam, mcfg, st));
      log("checkpoint " + dir);
      if (observer) observer->OnCheckpoint(dir, step);
      prune();  // after `latest` names the new one: that one is never deleted
    }
    last_ckpt = step;
    enter(TrainPhase::kCheckpointBarrier, step);
    return comm->Barrier();  // nobody runs ahead of a half-written checkpoint
  };

  const int acc = config.accumulation;
  const float grad_scale = 1.0f / static_cast<float>(acc);
  const int64_t log_every = std::max<int64_t>(1, config.steps / 20);
  double train_seconds = 0;
  int64_t train_samples = 0;
  auto last_log = Clock::now();
  for (int64_t step = start_step; step < config.steps; ++step) {
    const auto t0 = Clock::now();
    StepReport rep;
    rep.step = step + 1;
    rep.total_steps = config.steps;
    DGCA_RETURN_IF_ERROR(device->ZeroGrads());
    LossBreakdown sum;
    CommStats cs;
    for (int a = 0; a < acc; ++a) {
      const bool last = a == acc - 1;
      double wait = 0;
      enter(TrainPhase::kData, step + 1);
      DGCA_ASSIGN_OR_RETURN(Batch batch, loader->Next(&wait));
      rep.data_wait_seconds += wait;
      rep.samples += batch.batch_size;
      if (observer) observer->OnBatch(batch, step + 1, a);
      buckets.BeginStep(last);
      GradReadyFn ready;
      const bool overlap = last && config.overlap && world > 1;
      // Backward's first gradient-ready callback is where forward ended.
      // The CPU model takes a callback at no cost; a GPU model gives up its
      // CUDA graphs for one, so there only overlap's callback says it, and
      // without overlap the phase is forward/backward.
      // One reference captured: the std::function holds it without
      // allocating.
      struct {
        GradientBuckets* buckets;
        PhaseTracker* phases;
        bool overlap;
        bool in_backward;
        int64_t step;
      } cb{&buckets, phases, overlap, false, step + 1};
      if (overlap || (phases && !device->device_memory())) {
        ready = [&cb](int first) {
          if (cb.phases && !cb.in_backward) {
            cb.in_backward = true;
            cb.phases->Enter(TrainPhase::kBackward, cb.step);
          }
          if (cb.overlap) cb.buckets->OnGradReady(first);
        };
      }
      enter(ready || !phases ? TrainPhase::kForward : TrainPhase::kForwardBackward, step + 1);
      DGCA_ASSIGN_OR_RETURN(LossBreakdown lb, model->ForwardBackward(batch, grad_scale, ready));
      if (!std::isfinite(lb.total)) {
        return InternalError("train: loss is not finite at step " + std::to_string(step + 1) +
                             " (lr " + std::to_string(config.lr) + "); try a lower learning rate");
      }
      sum.total += lb.total;
      sum.fusion += lb.fusion;
      sum.mft += lb.mft;
      sum.detector += lb.detector;
      sum.candidate += lb.candidate;
      if (last) {
        // A GPU's backward may still be running: wait for it, so the
        // exposed communication below starts at the backward's real end.
        if (device->device_memory()) DGCA_RETURN_IF_ERROR(device->FinishStep());
        buckets.MarkBackwardEnd();
        auto w = buckets.WaitAll(phases, step + 1);
        if (!w.ok()) {
          return w.status().WithPrefix("train: gradient all-reduce at step " +
                                       std::to_string(step + 1));
        }
        cs = std::move(w).value();
      }
    }
    enter(TrainPhase::kOptimizer, step + 1);
    rep.loss = sum.total / acc;
    rep.loss_by_head = {{"fusion", sum.fusion / acc},
                        {"mft", sum.mft / acc},
                        {"detector", sum.detector / acc},
                        {"candidate", sum.candidate / acc}};
    DGCA_ASSIGN_OR_RETURN(rep.grad_norm, device->ClipGradNorm(config.clip_norm));
    rep.learning_rate =
        ScheduledLr(config.schedule, config.lr, step, config.warmup_steps, config.steps);
    DGCA_RETURN_IF_ERROR(device->OptimizerStep(static_cast<float>(rep.learning_rate)));
    DGCA_RETURN_IF_ERROR(device->FinishStep());
    rep.attention_kernels = device->attention_kernels();
    if (const LossScaler* scaler = device->loss_scaler(); scaler != nullptr) {
      rep.loss_scale = scaler->scale();
      rep.overflow_skipped = device->last_step_skipped();
      if (rep.overflow_skipped) {
        char buf[160];
        std::snprintf(buf, sizeof(buf),
                      "step %lld: fp16 gradients overflowed: update skipped, loss scale now %g",
                      static_cast<long long>(rep.step), rep.loss_scale);
        log(buf);
      }
    }
    rep.step_seconds = Since(t0);
    rep.allreduce_seconds = cs.allreduce_seconds;
    rep.exposed_comm_seconds = cs.exposed_seconds;
    rep.bus_bandwidth_bytes_per_second = cs.bus_bandwidth;
    rep.buckets = static_cast<int>(cs.events.size());
    if (!cs.events.empty()) {
      rep.first_allreduce_start = cs.events[0].start;
      for (const BucketEvent& e : cs.events) {
        rep.first_allreduce_start = std::min(rep.first_allreduce_start, e.start);
      }
      rep.backward_end = cs.backward_end;
    }
    rep.samples_per_second = rep.step_seconds > 0 ? rep.samples / rep.step_seconds : 0;
    train_seconds += rep.step_seconds;
    train_samples += rep.samples;
    const int64_t done = step + 1 - start_step;
    rep.eta_seconds = train_seconds / done * static_cast<double>(config.steps - step - 1);
    result.losses.push_back(rep.loss);
    result.steps = step + 1;
    if (observer) observer->OnStep(rep);
    if (step == start_step || rep.step % log_every == 0 || rep.step == config.steps ||
        Since(last_log) >= 10.0) {
      char buf[512];
      std::snprintf(buf, sizeof(buf),
                    "step %lld/%lld loss %.4f (fusion %.4f mft %.4f det %.4f cand %.4f) lr %.3g "
                    "gnorm %.3f %.1f samples/s data %.0f%% comm %.0f%% exposed %.0f%% eta %s",
                    static_cast<long long>(rep.step), static_cast<long long>(config.steps),
                    rep.loss, rep.loss_by_head["fusion"], rep.loss_by_head["mft"],
                    rep.loss_by_head["detector"], rep.loss_by_head["candidate"],
                    rep.learning_rate, rep.grad_norm, rep.samples_per_second,
                    100.0 * rep.data_wait_seconds / std::max(1e-9, rep.step_seconds),
                    100.0 * rep.allreduce_seconds / std::max(1e-9, rep.step_seconds),
                    100.0 * rep.exposed_comm_seconds / std::max(1e-9, rep.step_seconds),
                    FormatDuration(rep.eta_seconds).c_str());
      if (rep.loss_scale > 0) {
        const size_t len = std::strlen(buf);
        std::snprintf(buf + len, sizeof(buf) - len, " loss scale %g", rep.loss_scale);
      }
      log(buf);
      last_log = Clock::now();
    }
    const bool asked = observer && observer->CheckpointAtStep() == rep.step;
    if ((config.checkpoint_every > 0 && rep.step % config.checkpoint_every == 0) || asked) {
      if (asked) log("checkpoint asked for at step " + std::to_string(rep.step));
      DGCA_RETURN_IF_ERROR(save(rep.step));
    }
    if (config.eval_every > 0 && rep.step % config.eval_every == 0 && rep.step != config.steps) {
      DGCA_RETURN_IF_ERROR(run_eval(rep.step));
    }
    if (observer && observer->StopRequested()) {
      log("stop requested after step " + std::to_string(rep.step));
      return CancelledError("train: stopped at step " + std::to_string(rep.step) +
                            " on request");
    }
  }
  if (start_step >= config.steps) {
    log("checkpoint is at step " + std::to_string(start_step) + ", at or past steps " +
        std::to_string(config.steps) + ": nothing to train");
  } else if (config.checkpoint_every > 0) {
    DGCA_RETURN_IF_ERROR(save(config.steps));
  }
  DGCA_RETURN_IF_ERROR(run_eval(config.steps));
  result.steps = config.steps;
  // The final loss, one figure for the whole job: this rank's mean over its
  // last steps (less noisy than one step), averaged over the ranks, so each
  // rank's log and the coordinator say the same number. Every rank has
  // trained the same steps, so all take this branch, or none.
  if (!result.losses.empty()) {
    const size_t k = std::min<size_t>(kFinalLossSteps, result.losses.size());
    double s = 0;
    for (size_t i = result.losses.size() - k; i < result.losses.size(); ++i) s += result.losses[i];
    float mean = static_cast<float>(s / k);
    if (world > 1) {
      DGCA_RETURN_IF_ERROR(device->AllReduceHost(comm, &mean, 1, ReduceOp::kAverage));
    }
    result.final_loss = mean;
    result.final_loss_steps = static_cast<int>(k);
    result.final_loss_ranks = world;
  }
  result.samples_per_second = train_seconds > 0 ? train_samples / train_seconds : 0;
  if (const std::string summary = device->Summary(); !summary.empty()) log(summary);
  char sps[32];
  std::snprintf(sps, sizeof(sps), "%.1f", result.samples_per_second);
  log("done: " + std::to_string(result.steps) + " steps in " + FormatDuration(Since(run_start)) +
      ", " + sps + " samples/s, final loss " +
      FinalLossText(result.final_loss, result.final_loss_steps, result.final_loss_ranks));
  return result;
}

}  // namespace dgca
