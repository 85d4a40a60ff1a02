#include "proto/rpc/rank_phase.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dgca {
namespace {

const char* KindWord(v1::RankPhaseKind k) {
  switch (k) {
    case v1::RANK_PHASE_STARTING: return "starting";
    case v1::RANK_PHASE_RENDEZVOUS: return "rendezvous";
    case v1::RANK_PHASE_BROADCAST: return "broadcast";
    case v1::RANK_PHASE_DATA: return "data";
    case v1::RANK_PHASE_FORWARD: return "forward";
    case v1::RANK_PHASE_BACKWARD: return "backward";
    case v1::RANK_PHASE_FORWARD_BACKWARD: return "forward/backward";
    case v1::RANK_PHASE_ALL_REDUCE: return "all-reduce";
    case v1::RANK_PHASE_OPTIMIZER: return "optimizer";
    case v1::RANK_PHASE_CHECKPOINT: return "checkpoint";
    case v1::RANK_PHASE_CHECKPOINT_BARRIER: return "checkpoint barrier";
    case v1::RANK_PHASE_EVAL: return "eval";
    case v1::RANK_PHASE_FINISHING: return "finishing";
    default: return "";
  }
}

std::string OfStep(const v1::RankPhase& p) {
  return p.step() > 0 ? absl::StrCat(" of step ", p.step()) : "";
}

}  // namespace

const char* RankPhaseKindName(v1::RankPhaseKind kind) { return KindWord(kind); }

bool RankPhaseWaits(v1::RankPhaseKind kind) {
  return kind == v1::RANK_PHASE_RENDEZVOUS || kind == v1::RANK_PHASE_BROADCAST ||
         kind == v1::RANK_PHASE_ALL_REDUCE || kind == v1::RANK_PHASE_CHECKPOINT_BARRIER ||
         kind == v1::RANK_PHASE_FINISHING;
}

std::string RankPhaseLabel(const v1::RankPhase& p) {
  std::string out = KindWord(p.kind());
  if (!out.empty() && p.count() > 0) absl::StrAppend(&out, " ", p.index(), "/", p.count());
  return out;
}

std::string RankPhaseColumn(const v1::RankPhase& p) {
  const std::string label = RankPhaseLabel(p);
  if (label.empty()) return "-";
  return absl::StrCat(label, " ", FormatPhaseSeconds(p.seconds()));
}

std::string RankPhaseDescription(const v1::RankPhase& p) {
  const std::string of_step = OfStep(p);
  switch (p.kind()) {
    case v1::RANK_PHASE_STARTING:
      return "starting (reading data, building the model)";
    case v1::RANK_PHASE_RENDEZVOUS:
      return "in the rendezvous (building the communicator)";
    case v1::RANK_PHASE_BROADCAST:
      return "in the broadcast of rank 0's weights";
    case v1::RANK_PHASE_DATA:
      return absl::StrCat("waiting for data (loader)", p.step() > 0 ? absl::StrCat(" in step ", p.step()) : "");
    case v1::RANK_PHASE_ALL_REDUCE: {
      std::string out = "in all-reduce";
      if (p.count() > 0) absl::StrAppend(&out, " ", p.index(), "/", p.count());
      absl::StrAppend(&out, of_step);
      if (p.bytes() > 0) absl::StrAppend(&out, " (", FormatPhaseBytes(p.bytes()), ")");
      return out;
    }
    case v1::RANK_PHASE_CHECKPOINT:
      return absl::StrCat("writing the checkpoint", of_step);
    case v1::RANK_PHASE_CHECKPOINT_BARRIER:
      return absl::StrCat("in the checkpoint barrier", of_step);
    case v1::RANK_PHASE_EVAL: {
      std::string out = "in eval";
      if (p.count() > 0) absl::StrAppend(&out, " batch ", p.index(), "/", p.count());
      if (p.step() > 0) absl::StrAppend(&out, " at step ", p.step());
      return out;
    }
    case v1::RANK_PHASE_FINISHING:
      return "finishing (the teardown barrier)";
    case v1::RANK_PHASE_FORWARD:
    case v1::RANK_PHASE_BACKWARD:
    case v1::RANK_PHASE_FORWARD_BACKWARD:
    case v1::RANK_PHASE_OPTIMIZER:
      return absl::StrCat("in ", KindWord(p.kind()), of_step);
    default:
      return "in an unknown phase";
  }
}

bool RankPhaseSamePlace(const v1::RankPhase& a, const v1::RankPhase& b) {
  return a.kind() == b.kind() && a.step() == b.step() && a.index() == b.index();
}

std::string FormatPhaseBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return absl::StrFormat("%.1f GB", b / 1e9);
  if (b >= 1e7) return absl::StrFormat("%.0f MB", b / 1e6);
  if (b >= 1e6) return absl::StrFormat("%.1f MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.0f KB", b / 1e3);
  return absl::StrCat(bytes, " B");
}

std::string FormatPhaseSeconds(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  if (s < 9.95) return absl::StrFormat("%.1f s", s);  // not "10.0 s"
  if (s < 600) return absl::StrFormat("%.0f s", s);
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t < 3600) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%dh%02dm", t / 3600, (t / 60) % 60);
}

}  // namespace dgca
