#include "planner/units.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace dgca {

std::string FormatBytes(double b) {
  if (b >= kGiB) return absl::StrFormat("%.2f GiB", b / kGiB);
  if (b >= kMiB) return absl::StrFormat("%.1f MiB", b / kMiB);
  return absl::StrFormat("%.0f KiB", b / 1024);
}

namespace planner_text {

std::string Num(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return absl::StrFormat("%.0f", x);
  if (std::fabs(x) >= 100) return absl::StrFormat("%.0f", x);
  if (std::fabs(x) >= 10) return absl::StrFormat("%.1f", x);
  if (std::fabs(x) >= 0.1) return absl::StrFormat("%.3g", x);
  return absl::StrFormat("%.2g", x);
}

std::string Sec(double s) {
  if (s <= 0) return "0 s";
  if (s < 1e-3) return absl::StrFormat("%.0f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.3g ms", s * 1e3);
  return absl::StrFormat("%.3g s", s);
}

std::string Rate(double bytes_per_s) {
  if (bytes_per_s >= 1e12) return absl::StrFormat("%.3g TB/s", bytes_per_s / 1e12);
  if (bytes_per_s >= 1e9) return absl::StrFormat("%.3g GB/s", bytes_per_s / 1e9);
  return absl::StrFormat("%.3g MB/s", bytes_per_s / 1e6);
}

std::string Pct(double x) { return absl::StrFormat("%.1f%%", 100 * x); }

}  // namespace planner_text
}  // namespace dgca
