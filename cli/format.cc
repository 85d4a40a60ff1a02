#include "cli/format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/core/json.h"

namespace dgca {
namespace cli {

Progress ComputeProgress(const v1::Job& job, const std::map<int, v1::StepMetrics>& ranks) {
  Progress p;
  p.state = job.state();
  p.step = job.step();
  p.total_steps = job.total_steps();
  p.samples_per_second = job.samples_per_second();
  p.loss = job.loss();
  p.has_loss = job.step() > 0;
  p.eta_seconds = job.eta_seconds() > 0 ? job.eta_seconds() : -1;
  if (job.total_steps() == 0 && job.spec().train().steps() > 0) {
    p.total_steps = job.spec().train().steps();
  }
  if (!ranks.empty()) {
    int64_t min_step = INT64_MAX, total = 0;
    double sps = 0, loss = 0, step_s = 0;
    for (const auto& [r, m] : ranks) {
      min_step = std::min<int64_t>(min_step, m.step());
      total = std::max<int64_t>(total, m.total_steps());
      sps += m.samples_per_second();
      loss += m.loss();
      step_s += m.step_seconds();
    }
    const double n = static_cast<double>(ranks.size());
    if (min_step >= p.step) {
      p.step = min_step;
      if (total > 0) p.total_steps = total;
      p.samples_per_second = sps;
      p.loss = loss / n;
      p.has_loss = true;
      if (p.total_steps > 0 && step_s > 0) {
        p.eta_seconds = (p.total_steps - p.step) * (step_s / n);
      }
    }
  }
  if (job.has_final_loss()) {
    p.loss = job.final_loss();
    p.has_loss = true;
    p.loss_is_final = true;
    p.final_loss_steps = job.final_loss_steps();
  }
  const int64_t start = job.started_unix_ms() > 0 ? job.started_unix_ms() : job.created_unix_ms();
  if (start > 0) {
    int64_t end = job.ended_unix_ms() > 0 ? job.ended_unix_ms()
                  : IsTerminal(job.state()) && job.updated_unix_ms() > 0
                      ? job.updated_unix_ms()
                      : static_cast<int64_t>(std::time(nullptr)) * 1000;
    p.elapsed_seconds = std::max<double>(0, (end - start) / 1000.0);
  }
  return p;
}

std::string ProgressLine(const Progress& p, int bar_width) {
  std::string out = StateName(p.state);
  if (p.total_steps > 0) {
    absl::StrAppendFormat(&out, "  step %d/%d", p.step, p.total_steps);
    double frac = std::clamp(static_cast<double>(p.step) / p.total_steps, 0.0, 1.0);
    if (bar_width > 0) {
      int filled = static_cast<int>(std::lround(frac * bar_width));
      absl::StrAppend(&out, " [", std::string(filled, '#'),
                      std::string(bar_width - filled, '.'), "]");
    }
    absl::StrAppendFormat(&out, " %3d%%", static_cast<int>(frac * 100));
  } else if (p.step > 0) {
    absl::StrAppendFormat(&out, "  step %d", p.step);
  }
  if (p.samples_per_second > 0) absl::StrAppendFormat(&out, "  %.1f samples/s", p.samples_per_second);
  if (p.has_loss && p.loss_is_final) {
    absl::StrAppendFormat(&out, "  final loss %.4f (last %d step%s)", p.loss, p.final_loss_steps,
                          p.final_loss_steps == 1 ? "" : "s");
  } else if (p.has_loss) {
    absl::StrAppendFormat(&out, "  last-step loss %.4f", p.loss);
  }
  if (!IsTerminal(p.state) && p.eta_seconds >= 0) {
    absl::StrAppend(&out, "  ETA ", FormatDuration(p.eta_seconds));
  }
  if (p.elapsed_seconds > 0) absl::StrAppend(&out, "  elapsed ", FormatDuration(p.elapsed_seconds));
  return out;
}

std::string FormatDuration(double s) {
  if (s < 0 || !std::isfinite(s)) return "?";
  int64_t t = static_cast<int64_t>(std::lround(s));
  if (t < 60) return absl::StrCat(t, "s");
  if (t < 3600) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
}

std::string StateName(v1::JobState s) {
  if (s == v1::JOB_STATE_UNSPECIFIED) return "UNKNOWN";
  return v1::JobState_Name(s);
}

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

std::string LossPlot(const v1::Job& job, int width, int height) {
  const auto& pts = job.loss_curve();
  if (pts.size() < 2 || width < 2 || height < 2) return "";
  const int64_t s0 = pts.begin()->step(), s1 = pts.rbegin()->step();
  const v1::LossPoint* lowest = &*pts.begin();
  for (const v1::LossPoint& p : pts)
    if (p.loss() < lowest->loss()) lowest = &p;
  // Column c holds the mean of the points whose step maps to it; the loss
  // axis spans what is drawn (the column means).
  std::vector<double> sum(width, 0.0);
  std::vector<int> n(width, 0);
  for (const v1::LossPoint& p : pts) {
    // The coordinator sends the points in step order; clamped all the same,
    // so a reply out of order cannot index past the grid.
    const int c = s1 > s0 ? static_cast<int>(std::clamp<int64_t>(
                                (p.step() - s0) * (width - 1) / (s1 - s0), 0, width - 1))
                          : 0;
    sum[c] += p.loss();
    ++n[c];
  }
  std::vector<std::pair<int, double>> drawn;  // (column, mean)
  for (int c = 0; c < width; ++c)
    if (n[c] > 0) drawn.emplace_back(c, sum[c] / n[c]);
  const auto [lo_it, hi_it] = std::minmax_element(
      drawn.begin(), drawn.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const double lo = lo_it->second, hi = hi_it->second;
  std::vector<std::string> grid(height, std::string(width, ' '));
  for (const auto& [c, v] : drawn) {
    const int r = hi > lo ? static_cast<int>(std::lround((hi - v) / (hi - lo) * (height - 1))) : height / 2;
    grid[r][c] = '*';
  }
  const std::string top = absl::StrFormat("%.4g", hi), bottom = absl::StrFormat("%.4g", lo);
  const size_t lw = std::max(top.size(), bottom.size());
  std::string out;
  for (int r = 0; r < height; ++r) {
    std::string label = r == 0 ? top : r == height - 1 ? bottom : "";
    out += std::string(lw - label.size(), ' ') + label + " |" + grid[r] + "\n";
  }
  out += std::string(lw, ' ') + " +" + std::string(width, '-') + "\n";
  const std::string left = absl::StrCat("step ", s0), right = absl::StrCat(s1);
  out += std::string(lw + 2, ' ') + left +
         std::string(std::max<int>(1, width - static_cast<int>(left.size() + right.size())), ' ') + right + "\n";
  out += absl::StrFormat("first %.4f (step %d), lowest %.4f (step %d), last %.4f (step %d); %d points\n",
                         pts.begin()->loss(), s0, lowest->loss(), lowest->step(), pts.rbegin()->loss(), s1,
                         pts.size());
  return out;
}

std::string EvalTable(const std::map<std::string, double>& eval) {
  std::vector<std::vector<std::string>> rows = {{"METRIC", "VALUE"}};
  for (const auto& [k, v] : eval) {
    // Counts ("sentences") print as integers, ratios with four decimals.
    bool count = v >= 2 && v == std::floor(v) && v < 1e15;
    rows.push_back({k, count ? absl::StrFormat("%.0f", v) : absl::StrFormat("%.4f", v)});
  }
  return TextTable(rows);
}

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Rewrites proto3 JSON (what protobuf prints for `d`) with every 64-bit
// integer field as a JSON number: proto3 JSON writes int64/uint64 (and their
// sint/fixed forms) as strings, for JavaScript's doubles; our CLI's
// readers are jq and scripts, which want `.step > 10` to work. The rest is
// written as protobuf printed it: numbers keep their text (`src`, the
// printed document), strings are escaped again, map keys stay strings.
class Int64AsNumbers {
 public:
  explicit Int64AsNumbers(std::string_view src) : src_(src) {}

  void Message(const JsonValue& v, const Descriptor* d, int depth, std::string* out) const {
    if (!v.is_object() || IsWellKnown(d)) return Plain(v, depth, out);
    Object(v, depth, out, [&](const std::string& key, const JsonValue& val, std::string* o) {
      const FieldDescriptor* f = d->FindFieldByName(key);
      if (f == nullptr) return Plain(val, depth + 1, o);
      Field(val, f, depth + 1, o);
    });
  }

 private:
  static bool IsWellKnown(const Descriptor* d) {
    // Timestamp, Duration, Struct, wrappers...: printed in forms of their own.
    return d->file()->package() == "google.protobuf";
  }
  static bool Is64(const FieldDescriptor* f) {
    return f->cpp_type() == FieldDescriptor::CPPTYPE_INT64 ||
           f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
  }
  static bool IsInteger(const std::string& s) {
    size_t i = s[0] == '-' ? 1 : 0;
    if (i >= s.size()) return false;
    for (; i < s.size(); ++i)
      if (s[i] < '0' || s[i] > '9') return false;
    return true;
  }

  void Field(const JsonValue& v, const FieldDescriptor* f, int depth, std::string* out) const {
    if (f->is_map() && v.is_object()) {
      const FieldDescriptor* value = f->message_type()->map_value();
      Object(v, depth, out, [&](const std::string&, const JsonValue& val, std::string* o) {
        Element(val, value, depth + 1, o);
      });
    } else if (f->is_repeated() && v.is_array()) {
      if (v.array.empty()) {
        *out += "[]";
        return;
      }
      *out += "[\n";
      for (size_t i = 0; i < v.array.size(); ++i) {
        Indent(depth + 1, out);
        Element(v.array[i], f, depth + 1, out);
        *out += i + 1 < v.array.size() ? ",\n" : "\n";
      }
      Indent(depth, out);
      *out += "]";
    } else {
      Element(v, f, depth, out);
    }
  }

  void Element(const JsonValue& v, const FieldDescriptor* f, int depth, std::string* out) const {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) return Message(v, f->message_type(), depth, out);
    if (Is64(f) && v.is_string() && IsInteger(v.string)) {
      *out += v.string;
      return;
    }
    Plain(v, depth, out);
  }

  template <typename Member>
  void Object(const JsonValue& v, int depth, std::string* out, const Member& member) const {
    if (v.object.empty()) {
      *out += "{}";
      return;
    }
    *out += "{\n";
    for (size_t i = 0; i < v.object.size(); ++i) {
      Indent(depth + 1, out);
      AppendJsonString(v.object[i].first, out);
      *out += ": ";
      member(v.object[i].first, v.object[i].second, out);
      *out += i + 1 < v.object.size() ? ",\n" : "\n";
    }
    Indent(depth, out);
    *out += "}";
  }

  // Anything without a descriptor to go by, as it was printed.
  void Plain(const JsonValue& v, int depth, std::string* out) const {
    switch (v.type) {
      case JsonValue::Type::kNull: *out += "null"; return;
      case JsonValue::Type::kBool: *out += v.boolean ? "true" : "false"; return;
      case JsonValue::Type::kString: AppendJsonString(v.string, out); return;
      case JsonValue::Type::kNumber: *out += NumberText(v); return;
      case JsonValue::Type::kArray: {
        if (v.array.empty()) {
          *out += "[]";
          return;
        }
        *out += "[\n";
        for (size_t i = 0; i < v.array.size(); ++i) {
          Indent(depth + 1, out);
          Plain(v.array[i], depth + 1, out);
          *out += i + 1 < v.array.size() ? ",\n" : "\n";
        }
        Indent(depth, out);
        *out += "]";
        return;
      }
      case JsonValue::Type::kObject:
        Object(v, depth, out, [&](const std::string&, const JsonValue& val, std::string* o) {
          Plain(val, depth + 1, o);
        });
        return;
    }
  }

  // The number as protobuf printed it (no round trip through a double).
  std::string NumberText(const JsonValue& v) const {
    size_t end = static_cast<size_t>(v.offset);
    while (end < src_.size() && std::strchr("+-0123456789.eE", src_[end]) != nullptr) ++end;
    return std::string(src_.substr(static_cast<size_t>(v.offset), end - v.offset));
  }
  static void Indent(int depth, std::string* out) { out->append(2 * depth, ' '); }

  std::string_view src_;
};

}  // namespace

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  std::string printed;
  auto st = google::protobuf::util::MessageToJsonString(m, &printed, o);
  if (!st.ok()) return "{}\n";
  auto parsed = ParseJson(printed, "protobuf's JSON");
  if (!parsed.ok()) return printed + "\n";  // cannot happen: protobuf printed it
  std::string out;
  Int64AsNumbers(printed).Message(*parsed, m.GetDescriptor(), 0, &out);
  out += "\n";
  return out;
}

std::string ClockTime(int64_t unix_ms) {
  time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[16];
  strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  return buf;
}

std::string ShortTime(int64_t unix_ms, int64_t now_unix_ms) {
  if (unix_ms <= 0) return "-";
  time_t t = static_cast<time_t>(unix_ms / 1000), now = static_cast<time_t>(now_unix_ms / 1000);
  struct tm tm, today;
  gmtime_r(&t, &tm);
  gmtime_r(&now, &today);
  const bool same_day = tm.tm_year == today.tm_year && tm.tm_yday == today.tm_yday;
  char buf[32];
  strftime(buf, sizeof(buf), same_day ? "%H:%M" : "%m-%d %H:%M", &tm);
  return buf;
}

std::string FullTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[40];
  strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string LossCell(const v1::Job& job) {
  if (job.has_final_loss()) return FinalLossValue(job.final_loss());
  if (job.step() > 0) return absl::StrFormat("%.4f*", job.loss());
  return "-";
}

std::string ElapsedCell(const v1::Job& job, int64_t now_unix_ms) {
  if (job.started_unix_ms() <= 0) return "-";
  const int64_t end = job.ended_unix_ms() > 0 ? job.ended_unix_ms() : now_unix_ms;
  return FormatDuration(std::max<double>(0, (end - job.started_unix_ms()) / 1000.0));
}

std::string SignalAbbrev(int sig) {
  static const std::pair<int, const char*> kNames[] = {
      {1, "SIGHUP"},   {2, "SIGINT"},   {3, "SIGQUIT"},  {4, "SIGILL"},   {5, "SIGTRAP"},
      {6, "SIGABRT"},  {7, "SIGBUS"},   {8, "SIGFPE"},   {9, "SIGKILL"},  {10, "SIGUSR1"},
      {11, "SIGSEGV"}, {12, "SIGUSR2"}, {13, "SIGPIPE"}, {14, "SIGALRM"}, {15, "SIGTERM"},
      {24, "SIGXCPU"}, {25, "SIGXFSZ"}, {31, "SIGSYS"}};  // Linux numbering
  for (const auto& [n, name] : kNames)
    if (n == sig) return name;
  return absl::StrCat("signal ", sig);
}

std::string ExitCell(const v1::Job& job) {
  if (!job.has_exit()) return "-";
  const v1::JobExit& e = job.exit();
  if (!e.failed()) return "0";
  if (e.rank() < 0) return "-";
  const std::string how = e.status_unknown() ? "unknown"
                          : e.signal() != 0  ? SignalAbbrev(e.signal())
                                             : absl::StrCat(e.code());
  return absl::StrCat(how, " (rank ", e.rank(), ")");
}

std::string HumanBytes(double bytes) {
  if (!(bytes > 0)) return "-";
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  if (u == 0) return absl::StrFormat("%.0f B", bytes);
  // 412 MiB, 1.5 GiB: three significant digits at most.
  return bytes < 9.95 ? absl::StrFormat("%.1f %s", bytes, kUnits[u])
                      : absl::StrFormat("%.0f %s", bytes, kUnits[u]);
}

std::string StatusRunLine(const v1::Job& job, int64_t now_unix_ms) {
  if (job.started_unix_ms() <= 0) {
    return job.ended_unix_ms() > 0 ? absl::StrCat("never started; ended ", FullTime(job.ended_unix_ms()))
                                   : "not started";
  }
  std::string out = absl::StrCat("started ", FullTime(job.started_unix_ms()));
  if (job.ended_unix_ms() > 0) {
    absl::StrAppend(&out, ", ended ", FullTime(job.ended_unix_ms()), " after ",
                    ElapsedCell(job, now_unix_ms));
  } else {
    absl::StrAppend(&out, ", running for ", ElapsedCell(job, now_unix_ms));
  }
  absl::StrAppend(&out, ", exit ", ExitCell(job), ", peak memory ", HumanBytes(job.peak_memory_bytes()));
  return out;
}

std::string StatusLossLine(const v1::Job& job) {
  if (job.has_final_loss()) {
    return absl::StrCat("final ", FinalLossText(job.final_loss(), job.final_loss_steps(),
                                                job.final_loss_ranks()));
  }
  if (job.step() <= 0) return "";
  return absl::StrFormat("%.4f at step %d: the last step's (mean over ranks); %s", job.loss(),
                         job.step(),
                         IsTerminal(job.state())
                             ? "no final loss: training did not finish"
                             : "the final loss (mean of the last 10 steps) comes when training ends");
}

std::string Age(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  double s = (static_cast<double>(std::time(nullptr)) * 1000 - unix_ms) / 1000.0;
  return FormatDuration(std::max(0.0, s)) + " ago";
}

std::string OneLine(const std::string& message, size_t width) {
  const size_t nl = message.find('\n');
  std::string line = message.substr(0, nl);
  bool cut = nl != std::string::npos;
  // Count characters, not bytes: a UTF-8 continuation byte is 10xxxxxx.
  size_t chars = 0, i = 0;
  for (; i < line.size(); ++i) {
    if ((static_cast<unsigned char>(line[i]) & 0xC0) == 0x80) continue;
    if (chars == width) break;
    ++chars;
  }
  if (i < line.size()) {
    line.resize(i);
    cut = true;
  }
  return cut ? line + "..." : line;
}

}  // namespace cli
}  // namespace dgca
