#include "spec/spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "spec/rank_env.h"
#include "spec/slurm_values.h"
#include "spec/yaml_fields.h"
#include "spec/yaml_text.h"

namespace dgca {
namespace {

constexpr int kMaxFlowNesting = 100;

class Parser : public YamlFields {
 public:
  using YamlFields::YamlFields;

  void ParseTop(const YAML::Node& root, v1::JobSpec* spec);
};

void Parser::ParseTop(const YAML::Node& root, v1::JobSpec* spec) {
  v1::ModelSpec* model = spec->mutable_model();
  v1::DataSpec* data = spec->mutable_data();
  v1::TrainSpec* train = spec->mutable_train();
  v1::ResourcesSpec* res = spec->mutable_resources();
  v1::CommSpec* comm = spec->mutable_comm();
  v1::TuningSpec* tuning = spec->mutable_tuning();
  constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();
  constexpr int64_t kI64 = std::numeric_limits<int64_t>::max();
  const double kInf = std::numeric_limits<double>::infinity();
  YAML::Mark train_mark, model_mark, hidden_mark, slurm_mark;
  // Which of a custom model's sizes the spec gives (valid or not: an
  // invalid one has its own problem, and is not also reported missing).
  bool layers_given = false, hidden_given = false, heads_given = false, ffn_given = false;

  auto candidate = [&](const YAML::Node& n, const std::string& f) {
    v1::CandidateSpec* c = model->mutable_heads_spec()->mutable_candidate();
    int b = BoolValue(n);
    if (b >= 0) { c->set_enabled(b == 1); return; }
    if (!n.IsMap() && !n.IsNull()) {
      Problem(n, f, absl::StrCat("expected a mapping {top_k, confusion, enabled} or false, got ",
                                 Describe(n)));
      return;
    }
    Map(n, f, {
      {"top_k", [&](const YAML::Node& v, const std::string& p) {
         int32_t k = c->top_k(); Int(v, p, 1, 256, false, &k); c->set_top_k(k); }},
      {"confusion", [&](const YAML::Node& v, const std::string& p) {
         Str(v, p, true, c->mutable_confusion()); }},
      {"enabled", [&](const YAML::Node& v, const std::string& p) {
         bool e = c->enabled(); Bool(v, p, &e); c->set_enabled(e); }},
    });
  };

  auto heads = [&](const YAML::Node& n, const std::string& f) {
    v1::HeadsSpec* h = model->mutable_heads_spec();
    int b = BoolValue(n);
    if (b == 0) {
      h->set_detector(false);
      h->mutable_candidate()->set_enabled(false);
      h->set_fusion("none");
      return;
    }
    if (b == 1) return;
    Map(n, f, {
      {"detector", [&](const YAML::Node& v, const std::string& p) {
         bool d = h->detector(); Bool(v, p, &d); h->set_detector(d); }},
      {"candidate", candidate},
      {"fusion", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"gated", "none"}, h->mutable_fusion()); }},
    });
  };

  auto model_fn = [&](const YAML::Node& n, const std::string& f) {
    model_mark = n.Mark();
    Map(n, f, {
      {"preset", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"tiny", "small", "bert-base", "custom"}, model->mutable_preset()); }},
      {"layers", [&](const YAML::Node& v, const std::string& p) {
         layers_given = true;
         int32_t x = 0; Int(v, p, 1, 96, false, &x); model->set_layers(x); }},
      {"hidden", [&](const YAML::Node& v, const std::string& p) {
         hidden_given = true;
         hidden_mark = v.Mark();
         int32_t x = 0; Int(v, p, 8, 16384, false, &x); model->set_hidden(x); }},
      {"heads", [&](const YAML::Node& v, const std::string& p) {
         // `model.heads` is the attention-head count when it is an integer and
         // the heads spec (detector/candidate/fusion) otherwise.
         if (v.IsScalar() && BoolValue(v) < 0) {
           heads_given = true;
           int32_t x = 0; Int(v, p, 1, 256, false, &x); model->set_heads(x);
         } else {
           heads(v, p);
         }
       }},
      {"attention_heads", [&](const YAML::Node& v, const std::string& p) {
         // The unambiguous spelling of the attention-head count, so a spec can
         // give explicit sizes and a `heads:` mapping for the DGCA heads.
         heads_given = true;
         int32_t x = 0; Int(v, p, 1, 256, false, &x); model->set_heads(x); }},
      {"ffn", [&](const YAML::Node& v, const std::string& p) {
         ffn_given = true;
         int32_t x = 0; Int(v, p, 8, 65536, false, &x); model->set_ffn(x); }},
      {"vocab", [&](const YAML::Node& v, const std::string& p) {
         Str(v, p, true, model->mutable_vocab()); }},
      {"init_from", [&](const YAML::Node& v, const std::string& p) {
         Str(v, p, true, model->mutable_init_from()); }},
      {"prompt", [&](const YAML::Node& v, const std::string& p) {
         v1::PromptSpec* ps = model->mutable_prompt();
         Map(v, p, {
           {"length", [&](const YAML::Node& x, const std::string& q) {
              int32_t l = ps->length(); Int(x, q, 0, 64, false, &l); ps->set_length(l); }},
           {"encoder", [&](const YAML::Node& x, const std::string& q) {
              Enum(x, q, {"lstm", "mlp", "none"}, ps->mutable_encoder()); }},
         });
       }},
      {"dropout", [&](const YAML::Node& v, const std::string& p) {
         // Probabilities in [0, 1) (HF hidden_dropout_prob and
         // attention_probs_dropout_prob); 0 turns one off.
         v1::DropoutSpec* ds = model->mutable_dropout();
         // The ranks train in float: a value that rounds to 1 is refused
         // here, not when the ranks start.
         auto prob = [&](const YAML::Node& x, const std::string& q, double* r) {
           Num(x, q, 0, 1, false, false, r, /*hi_open=*/true);
           if (*r < 1 && !(static_cast<float>(*r) < 1.0f))
             Problem(x, q, absl::StrCat("must be < 1 in single precision (the trainer's), got ", Quote(x.Scalar())));
         };
         Map(v, p, {
           {"hidden", [&](const YAML::Node& x, const std::string& q) {
              double r = ds->hidden(); prob(x, q, &r); ds->set_hidden(r); }},
           {"attention", [&](const YAML::Node& x, const std::string& q) {
              double r = ds->attention(); prob(x, q, &r); ds->set_attention(r); }},
         });
       }},
    });
  };

  auto data_fn = [&](const YAML::Node& n, const std::string& f) {
    Map(n, f, {
      {"train", [&](const YAML::Node& v, const std::string& p) { Str(v, p, true, data->mutable_train()); }},
      {"eval", [&](const YAML::Node& v, const std::string& p) { Str(v, p, true, data->mutable_eval()); }},
      {"max_seq_len", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = data->max_seq_len(); Int(v, p, 8, 512, false, &x); data->set_max_seq_len(x); }},
      {"mft", [&](const YAML::Node& v, const std::string& p) {
         v1::MftSpec* m = data->mutable_mft();
         Map(v, p, {
           {"mode", [&](const YAML::Node& x, const std::string& q) {
              Enum(x, q, {"noerror", "none"}, m->mutable_mode()); }},
           {"rate", [&](const YAML::Node& x, const std::string& q) {
              double r = m->rate(); Num(x, q, 0, 1, false, false, &r); m->set_rate(r); }},
         });
       }},
      {"loader", [&](const YAML::Node& v, const std::string& p) {
         v1::LoaderSpec* l = data->mutable_loader();
         Map(v, p, {
           {"threads", [&](const YAML::Node& x, const std::string& q) {
              int32_t t = l->threads(); Int(x, q, 0, 256, true, &t); l->set_threads(t); }},
           {"prefetch", [&](const YAML::Node& x, const std::string& q) {
              int32_t t = l->prefetch(); Int(x, q, 0, 1024, false, &t); l->set_prefetch(t); }},
         });
       }},
    });
  };

  auto optimizer_fn = [&](const YAML::Node& n, const std::string& f) {
    v1::OptimizerSpec* o = train->mutable_optimizer();
    Map(n, f, {
      {"lr", [&](const YAML::Node& v, const std::string& p) {
         double x = o->lr(); Num(v, p, 0, 10, true, false, &x); o->set_lr(x); }},
      {"weight_decay", [&](const YAML::Node& v, const std::string& p) {
         double x = o->weight_decay(); Num(v, p, 0, 1, false, false, &x); o->set_weight_decay(x); }},
      {"warmup_steps", [&](const YAML::Node& v, const std::string& p) {
         int64_t x = o->warmup_steps(); Int(v, p, 0, kI64, false, &x); o->set_warmup_steps(x); }},
      {"clip_norm", [&](const YAML::Node& v, const std::string& p) {
         double x = o->clip_norm(); Num(v, p, 0, kInf, false, false, &x); o->set_clip_norm(x); }},
      {"schedule", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"constant", "linear"}, o->mutable_schedule()); }},
    });
  };

  auto train_fn = [&](const YAML::Node& n, const std::string& f) {
    train_mark = n.Mark();
    Map(n, f, {
      {"steps", [&](const YAML::Node& v, const std::string& p) {
         int64_t x = train->steps(); Int(v, p, 1, kI64, false, &x); train->set_steps(x); }},
      {"global_batch", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = train->global_batch(); Int(v, p, 1, kI32, false, &x); train->set_global_batch(x); }},
      {"micro_batch", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = 0; Int(v, p, 0, kI32, true, &x); train->set_micro_batch(x); }},
      {"accumulation", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = 0; Int(v, p, 0, kI32, true, &x); train->set_accumulation(x); }},
      {"precision", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"auto", "fp32", "fp16", "bf16"}, train->mutable_precision()); }},
      {"attention", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"auto", "fused", "gemm"}, train->mutable_attention()); }},
      {"optimizer", optimizer_fn},
      {"eval_every", [&](const YAML::Node& v, const std::string& p) {
         int64_t x = train->eval_every(); Int(v, p, 0, kI64, false, &x); train->set_eval_every(x); }},
      {"checkpoint_every", [&](const YAML::Node& v, const std::string& p) {
         int64_t x = train->checkpoint_every(); Int(v, p, 0, kI64, false, &x); train->set_checkpoint_every(x); }},
      {"seed", [&](const YAML::Node& v, const std::string& p) {
         int64_t x = static_cast<int64_t>(train->seed()); Int(v, p, 0, kI64, false, &x);
         train->set_seed(static_cast<uint64_t>(x)); }},
      {"max_restarts", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = train->max_restarts(); Int(v, p, 0, 1000, false, &x); train->set_max_restarts(x); }},
      {"keep_checkpoints", [&](const YAML::Node& v, const std::string& p) {
         // A negative count gets its own message: it says what 0 means,
         // which "must be >= 0" alone would leave a reader to guess.
         int64_t neg = 0;
         if (v.IsScalar() && absl::SimpleAtoi(absl::StripAsciiWhitespace(v.Scalar()), &neg) && neg < 0) {
           Problem(v, p, absl::StrCat("must be >= 0 (0 keeps every checkpoint; N keeps the newest N "
                                      "and the best by eval), got ", Quote(v.Scalar())));
           return;
         }
         // 1 is refused: a restart is handed the newest checkpoint by name
         // while a rank 0 of the stopped attempt may still save one more
         // (past the stop's deadline) and, keeping one, delete it.
         if (v.IsScalar() && neg == 1) {
           Problem(v, p, "must be 0 or at least 2: with 1, a rank of a stopped attempt that saves "
                         "once more deletes the checkpoint the restart was handed");
           return;
         }
         int32_t x = train->keep_checkpoints(); Int(v, p, 0, kI32, false, &x); train->set_keep_checkpoints(x); }},
      {"progress_timeout_s", [&](const YAML::Node& v, const std::string& p) {
         double x = -1; Num(v, p, 0, 86400, false, false, &x);
         if (x < 0) return;  // refused above
         // Ranks report their phase every 2 s: a shorter timeout would
         // fail healthy ranks between two heartbeats.
         if (x > 0 && x < 1) {
           Problem(v, p, absl::StrCat("must be 0 (no progress timeout) or at least 1 (seconds; "
                                      "ranks report their phase every 2 s), got ", Quote(v.Scalar())));
           return;
         }
         train->set_progress_timeout_s(x); }},
    });
  };

  // A Slurm name (partition, account, qos): it goes into an #SBATCH line.
  auto slurm_name = [&](const YAML::Node& v, const std::string& p, std::string* out) {
    std::string x;
    Str(v, p, false, &x);
    if (x.empty() && v.IsScalar()) {
      Problem(v, p, "expected a name; leave the field out for Slurm's default");
      return;
    }
    if (!SlurmName(x)) {
      if (!x.empty())
        Problem(v, p, absl::StrCat("expected 1-64 of A-Z a-z 0-9 . _ -, got ", Quote(x)));
      return;
    }
    *out = x;
  };
  auto slurm_fn = [&](const YAML::Node& n, const std::string& f) {
    slurm_mark = n.Mark();
    v1::SlurmSpec* sl = res->mutable_slurm();
    Map(n, f, {
      {"partition", [&](const YAML::Node& v, const std::string& p) {
         slurm_name(v, p, sl->mutable_partition()); }},
      {"account", [&](const YAML::Node& v, const std::string& p) {
         slurm_name(v, p, sl->mutable_account()); }},
      {"qos", [&](const YAML::Node& v, const std::string& p) {
         slurm_name(v, p, sl->mutable_qos()); }},
      {"nodes", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = sl->nodes(); Int(v, p, 1, 4096, false, &x); sl->set_nodes(x); }},
      {"gpus_per_node", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = 0; Int(v, p, 0, 64, false, &x); sl->set_gpus_per_node(x); }},
      {"time", [&](const YAML::Node& v, const std::string& p) {
         std::string x;
         Str(v, p, false, &x);
         if (!v.IsScalar()) return;
         const std::string t(absl::StripAsciiWhitespace(x));
         if (absl::AsciiStrToLower(t) == "auto") {
           sl->set_time("auto");
         } else if (SlurmTime(t)) {
           sl->set_time(t);
         } else {
           Problem(v, p, absl::StrCat("expected 'auto' or a Slurm time limit (MM, MM:SS, HH:MM:SS, "
                                      "D-HH, D-HH:MM or D-HH:MM:SS), got ", Quote(x)));
         }
       }},
      {"extra_args", [&](const YAML::Node& v, const std::string& p) {
         if (!v.IsSequence() || v.size() > 32) {
           Problem(v, p, absl::StrCat("expected a list of at most 32 sbatch options such as "
                                      "'--exclusive' or '--constraint=a100', got ", Describe(v)));
           return;
         }
         sl->clear_extra_args();
         for (size_t i = 0; i < v.size(); ++i) {
           const std::string at = absl::StrCat(p, "[", i, "]");
           std::string a;
           Str(v[i], at, false, &a);
           if (!v[i].IsScalar()) continue;
           if (std::string why = SbatchArgProblem(a); !why.empty()) {
             Problem(v[i], at, why);
             continue;
           }
           sl->add_extra_args(a);
         }
       }},
    });
  };

  auto resources_fn = [&](const YAML::Node& n, const std::string& f) {
    Map(n, f, {
      {"ranks", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = 0; Int(v, p, 0, 4096, true, &x); res->set_ranks(x); }},
      {"device", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"auto", "cuda", "cpu"}, res->mutable_device()); }},
      {"threads_per_rank", [&](const YAML::Node& v, const std::string& p) {
         int32_t x = 0; Int(v, p, 0, 1024, true, &x); res->set_threads_per_rank(x); }},
      {"launcher", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"local", "slurm"}, res->mutable_launcher()); }},
      {"slurm", slurm_fn},
    });
  };

  auto env_fn = [&](const YAML::Node& n, const std::string& f) {
    if (n.IsNull()) return;
    if (!n.IsMap()) {
      Problem(n, f, absl::StrCat("expected a mapping of NCCL_*/CUDA_*/OMP_* variables, got ",
                                 Describe(n)));
      return;
    }
    std::set<std::string> seen;
    for (auto it = n.begin(); it != n.end(); ++it) {
      const YAML::Node k = it->first;
      const YAML::Node v = it->second;
      if (!k.IsScalar()) {
        Problem(k, f, absl::StrCat("variable names must be strings, got ", Describe(k)));
        continue;
      }
      const std::string name = k.Scalar();
      const std::string path = absl::StrCat(f, ".", name);
      bool ok = false;
      for (const char* prefix : {"NCCL_", "CUDA_", "OMP_"}) {
        if (name.rfind(prefix, 0) == 0 && name.size() > std::string(prefix).size()) ok = true;
      }
      ok = ok && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      });
      if (!ok) {
        Problem(k, path, absl::StrCat("variable ", Quote(name),
                                      " is not allowed; only NCCL_*, CUDA_* and OMP_* "
                                      "(upper-case letters, digits, _) may be set"));
        continue;
      }
      if (const std::string why = RankEnvRefusal(name); !why.empty()) {
        Problem(k, path,
                absl::StrCat(name, " is not allowed: it ", why,
                             ". comm.env may set NCCL_*, CUDA_* and OMP_* variables that neither "
                             "load code nor write files (docs/job-spec.md lists the refused ones); "
                             "a node's operator can set such a variable in its agent's environment"));
        continue;
      }
      if (name == "NCCL_COMM_BLOCKING") {
        Problem(k, path,
                "NCCL_COMM_BLOCKING is not allowed (whatever its value): the ranks create their NCCL "
                "communicators non-blocking so that a peer that never joins times out, and this variable "
                "would override that");
        continue;
      }
      if (!seen.insert(name).second) {
        Problem(k, path, "duplicate variable");
        continue;
      }
      if (!v.IsScalar()) {
        Problem(v, path, absl::StrCat("expected a string value, got ", Describe(v)));
        continue;
      }
      if (v.Scalar().size() > 4096 || v.Scalar().find('\0') != std::string::npos) {
        Problem(v, path, "value too long or contains NUL");
        continue;
      }
      (*comm->mutable_env())[name] = v.Scalar();
    }
  };

  auto comm_fn = [&](const YAML::Node& n, const std::string& f) {
    Map(n, f, {
      {"backend", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"auto", "nccl", "gloo"}, comm->mutable_backend()); }},
      {"bucket_mb", [&](const YAML::Node& v, const std::string& p) {
         double x = 0; Num(v, p, 0, 4096, true, true, &x); comm->set_bucket_mb(x); }},
      {"overlap", [&](const YAML::Node& v, const std::string& p) {
         bool b = comm->overlap(); Bool(v, p, &b); comm->set_overlap(b); }},
      {"env", env_fn},
      {"timeout_s", [&](const YAML::Node& v, const std::string& p) {
         double x = comm->timeout_s(); Num(v, p, 0, 86400, true, false, &x); comm->set_timeout_s(x); }},
    });
  };

  auto tuning_fn = [&](const YAML::Node& n, const std::string& f) {
    Map(n, f, {
      {"mode", [&](const YAML::Node& v, const std::string& p) {
         Enum(v, p, {"off", "model", "trial", "auto"}, tuning->mutable_mode()); }},
      {"budget_s", [&](const YAML::Node& v, const std::string& p) {
         double x = tuning->budget_s(); Num(v, p, 0, 86400, false, false, &x); tuning->set_budget_s(x); }},
    });
  };

  YAML::Mark name_mark;
  if (!root.IsMap()) {
    if (root.IsNull()) {
      Problem(root, "(top level)", "the spec is empty; expected a mapping with fields such as "
                                   "name, model, data, train, resources, comm, tuning");
    } else {
      Problem(root, "(top level)",
              absl::StrCat("the spec must be a mapping (name: ..., train: ...), got ", Describe(root)));
    }
    return;
  }
  Map(root, "", {
    {"name", [&](const YAML::Node& v, const std::string& p) {
       name_mark = v.Mark();
       std::string s;
       if (!v.IsScalar()) { Str(v, p, false, &s); return; }
       s = v.Scalar();
       bool ok = !s.empty() && s.size() <= 128 &&
                 std::all_of(s.begin(), s.end(), [](char c) {
                   unsigned char u = static_cast<unsigned char>(c);
                   return u >= 0x80 || std::isalnum(u) || c == '-' || c == '_' || c == '.';
                 });
        if (!ok) {
          Problem(v, p, absl::StrCat("must be 1-128 characters of letters, digits, '-', '_' or '.', got ",
                                     Quote(s)));
          return;
        }
        spec->set_name(s);
     }},
    {"model", model_fn},
    {"data", data_fn},
    {"train", train_fn},
    {"resources", resources_fn},
    {"comm", comm_fn},
    {"tuning", tuning_fn},
    // Probe jobs (`dgca diagnose comm` writes these).
    {"kind", [&](const YAML::Node& v, const std::string& p) {
       Enum(v, p, {"train", "comm_probe"}, spec->mutable_kind()); }},
    {"probe", [&](const YAML::Node& n, const std::string& f) {
       Map(n, f, {
         {"sizes", [&](const YAML::Node& v, const std::string& p) {
            if (!v.IsSequence() || v.size() == 0 || v.size() > 64) {
              Problem(v, p, absl::StrCat("expected a list of 1 to 64 sizes in bytes, got ",
                                         Describe(v)));
              return;
            }
            spec->mutable_probe()->clear_sizes_bytes();
            for (size_t i = 0; i < v.size(); ++i) {
              int64_t b = 0;
              Int(v[i], absl::StrCat(p, "[", i, "]"), int64_t{4}, int64_t{1} << 31, false, &b);
              if (b > 0 && b % 4 != 0) {
                Problem(v[i], absl::StrCat(p, "[", i, "]"),
                        absl::StrCat("must be a multiple of 4 bytes (whole floats), got ", b));
                continue;
              }
              if (b > 0) spec->mutable_probe()->add_sizes_bytes(b);
            }
          }},
       });
     }},
  });

  // No name: the spec file's base name when it is a valid name, else "job".
  if (!root["name"]) {
    const size_t slash = file().find_last_of('/');
    std::string base = file().substr(slash == std::string::npos ? 0 : slash + 1);
    base = base.substr(0, base.find('.'));
    bool ok = !base.empty() && base.size() <= 128 &&
              std::all_of(base.begin(), base.end(), [](char c) {
                return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
              });
    if (ok) spec->set_name(base);
  }

  // Cross-field checks (only between values the user set explicitly).
  const v1::TrainSpec& t = *train;
  if (t.micro_batch() > 0 && t.micro_batch() > t.global_batch()) {
    Problem(train_mark, "train.micro_batch",
            absl::StrCat("micro_batch ", t.micro_batch(), " is larger than global_batch ",
                         t.global_batch(), "; it must be <= global_batch"));
  }
  if (t.micro_batch() > 0 && t.accumulation() > 0 && res->ranks() > 0 &&
      static_cast<int64_t>(t.micro_batch()) * t.accumulation() * res->ranks() != t.global_batch()) {
    Problem(train_mark, "train.global_batch",
            absl::StrCat("global_batch ", t.global_batch(), " must equal micro_batch x accumulation x ranks = ",
                         t.micro_batch(), " x ", t.accumulation(), " x ", res->ranks(),
                         "; set one of them to auto"));
  }
  if (res->has_slurm() && res->launcher() != "slurm") {
    Problem(slurm_mark, "resources.slurm",
            "is used only with resources.launcher: slurm (the launcher is " + res->launcher() +
                "); set the launcher or drop this section");
  }
  if (res->device() == "cpu" && comm->backend() == "nccl") {
    Problem(YAML::Mark::null_mark(), "comm.backend",
            "nccl needs resources.device cuda (or auto); use gloo on cpu");
  }
  if (model->preset() == "custom" && !(layers_given && hidden_given && heads_given && ffn_given)) {
    std::vector<std::string> missing;
    if (!layers_given) missing.push_back("model.layers");
    if (!hidden_given) missing.push_back("model.hidden");
    if (!heads_given) missing.push_back("model.attention_heads (or an integer model.heads)");
    if (!ffn_given) missing.push_back("model.ffn");
    Problem(model_mark, "model.preset",
            absl::StrCat("preset 'custom' needs model.layers, model.hidden, model.attention_heads (or an integer "
                         "model.heads) and model.ffn; missing: ",
                         absl::StrJoin(missing, ", ")));
  }
  if (model->hidden() > 0 && model->heads() > 0 && model->hidden() % model->heads() != 0) {
    Problem(hidden_mark, "model.hidden",
            absl::StrCat("hidden ", model->hidden(), " must be divisible by heads ", model->heads()));
  }
}

}  // namespace

SpecDropout DropoutOf(const v1::ModelSpec& model) {
  SpecDropout d;
  if (model.dropout().has_hidden()) d.hidden = model.dropout().hidden();
  if (model.dropout().has_attention()) d.attention = model.dropout().attention();
  return d;
}

int KeepCheckpointsOf(const v1::TrainSpec& train) {
  return train.has_keep_checkpoints() ? train.keep_checkpoints() : kDefaultKeepCheckpoints;
}

double ProgressTimeoutOf(const v1::TrainSpec& train) {
  return train.has_progress_timeout_s() ? train.progress_timeout_s()
                                        : kDefaultProgressTimeoutSeconds;
}

v1::JobSpec DefaultJobSpec() {
  v1::JobSpec s;
  s.set_name("job");
  v1::ModelSpec* m = s.mutable_model();
  m->set_preset("bert-base");
  m->mutable_prompt()->set_length(3);
  m->mutable_prompt()->set_encoder("lstm");
  m->mutable_heads_spec()->set_detector(true);
  m->mutable_heads_spec()->mutable_candidate()->set_top_k(8);
  m->mutable_heads_spec()->mutable_candidate()->set_enabled(true);
  m->mutable_heads_spec()->set_fusion("gated");
  m->mutable_dropout()->set_hidden(kDefaultDropout);
  m->mutable_dropout()->set_attention(kDefaultDropout);
  v1::DataSpec* d = s.mutable_data();
  d->set_max_seq_len(128);
  d->mutable_mft()->set_mode("noerror");
  d->mutable_mft()->set_rate(0.3);
  d->mutable_loader()->set_threads(0);
  d->mutable_loader()->set_prefetch(2);
  v1::TrainSpec* t = s.mutable_train();
  t->set_steps(5000);
  t->set_global_batch(128);
  t->set_micro_batch(0);
  t->set_accumulation(0);
  t->set_precision("auto");
  t->set_attention("auto");
  t->mutable_optimizer()->set_lr(5.0e-5);
  t->mutable_optimizer()->set_weight_decay(0);
  t->mutable_optimizer()->set_warmup_steps(0);
  t->mutable_optimizer()->set_clip_norm(0);
  t->mutable_optimizer()->set_schedule("linear");
  t->set_eval_every(500);
  t->set_checkpoint_every(500);
  t->set_seed(42);
  t->set_max_restarts(0);
  t->set_keep_checkpoints(kDefaultKeepCheckpoints);
  t->set_progress_timeout_s(kDefaultProgressTimeoutSeconds);
  s.mutable_resources()->set_ranks(0);
  s.mutable_resources()->set_device("auto");
  s.mutable_resources()->set_threads_per_rank(0);
  s.mutable_resources()->set_launcher("local");
  s.mutable_comm()->set_backend("auto");
  s.mutable_comm()->set_bucket_mb(0);
  s.mutable_comm()->set_overlap(true);
  s.mutable_comm()->set_timeout_s(60);
  s.mutable_tuning()->set_mode("auto");
  s.mutable_tuning()->set_budget_s(120);
  return s;
}

absl::StatusOr<SpecParseResult> ParseJobSpec(const std::string& yaml_text,
                                             const std::string& file_path) {
  SpecParseResult result;
  result.spec = DefaultJobSpec();
  result.spec.set_source_path(file_path);
  Parser parser(file_path);
  auto fail = [&](int line, int col, const std::string& msg) {
    v1::SpecProblem p;
    p.set_file(file_path);
    p.set_line(line);
    p.set_column(col);
    p.set_field("(syntax)");
    p.set_message(msg);
    result.problems.push_back(std::move(p));
  };
  if (yaml_text.size() > kMaxSpecBytes) {
    fail(0, 0, absl::StrCat("the spec is ", yaml_text.size(), " bytes; at most ", kMaxSpecBytes,
                            " are accepted"));
    return result;
  }
  if (yaml_text.find('\0') != std::string::npos) {
    fail(0, 0, "the spec contains a NUL byte; expected YAML text");
    return result;
  }
  if (size_t bad = FirstInvalidUtf8(yaml_text); bad != std::string::npos) {
    int line = 1, col = 1;
    for (size_t i = 0; i < bad; ++i) {
      if (yaml_text[i] == '\n') { ++line; col = 1; } else if ((static_cast<unsigned char>(yaml_text[i]) & 0xc0) != 0x80) { ++col; }
    }
    fail(line, col, absl::StrCat("invalid UTF-8 byte 0x",
                                 absl::Hex(static_cast<unsigned char>(yaml_text[bad]), absl::kZeroPad2),
                                 "; a job spec must be UTF-8 text"));
    return result;
  }
  if (MaxFlowNesting(yaml_text) > kMaxFlowNesting) {
    fail(0, 0, absl::StrCat("nesting deeper than ", kMaxFlowNesting, " levels; a job spec needs 4"));
    return result;
  }
  try {
    YAML::Mark second;
    bool stuck = false;
    if (SecondDocument(yaml_text, &second, &stuck)) {
      if (stuck) {
        fail(second.line + 1, second.column + 1,
             "YAML syntax error: the parser cannot read on from here (check the indentation of "
             "this line and the one above it)");
        return result;
      }
      parser.Problem(second, "(top level)",
                     "more than one YAML document ('---'); a spec file holds one job");
    }
    const YAML::Node root = YAML::Load(yaml_text);
    for (const UnclosedQuote& u : UnclosedQuotes(root, yaml_text)) {
      parser.Problem(u.mark, "(quoted string)",
                     absl::StrCat("the ", u.quote == '"' ? "double" : "single",
                                  " quote opened here is not closed on this line (is the closing "
                                  "quote missing?); strings in a job spec are one line"));
    }
    parser.ParseTop(root, &result.spec);
  } catch (const YAML::Exception& e) {
    std::string msg = e.msg.empty() ? std::string(e.what()) : e.msg;
    int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    int col = e.mark.is_null() ? 0 : e.mark.column + 1;
    fail(line, col, absl::StrCat("YAML syntax error: ", msg));
  } catch (const std::exception& e) {
    fail(0, 0, absl::StrCat("cannot parse the spec: ", e.what()));
  } catch (...) {
    fail(0, 0, "cannot parse the spec: unknown error");
  }
  for (auto& p : parser.problems()) result.problems.push_back(std::move(p));
  std::stable_sort(result.problems.begin(), result.problems.end(),
                   [](const v1::SpecProblem& a, const v1::SpecProblem& b) {
                     // Problems without a place go last.
                     int al = a.line() == 0 ? INT32_MAX : a.line();
                     int bl = b.line() == 0 ? INT32_MAX : b.line();
                     if (al != bl) return al < bl;
                     return a.column() < b.column();
                   });
  return result;
}

std::string FormatProblem(const v1::SpecProblem& p) {
  std::string out;
  if (!p.file().empty()) absl::StrAppend(&out, p.file(), ":");
  if (p.line() > 0) absl::StrAppend(&out, p.line(), ":", p.column(), ":");
  if (!out.empty()) out += " ";
  absl::StrAppend(&out, p.field(), ": ", p.message(), "\n");
  return out;
}

}  // namespace dgca
