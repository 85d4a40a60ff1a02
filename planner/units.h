// Quantities as the planner writes them in reasons and in `dgca plan`:
// seconds, bytes (binary units), rates and shares. Pure functions.
#ifndef DGCA_PLANNER_UNITS_H_
#define DGCA_PLANNER_UNITS_H_

#include <string>

namespace dgca {

inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * kMiB;

// Bytes for people: "1.50 GiB", "12.0 MiB", "800 KiB" (binary units).
std::string FormatBytes(double bytes);

namespace planner_text {
// A number with as many digits as it deserves: "128", "12.5", "0.125", "0.012".
std::string Num(double x);
// "0 s", "250 us", "12.5 ms", "1.25 s".
std::string Sec(double s);
// Decimal units, as network, bus and memory speeds are quoted: "4.8 TB/s",
// "1.25 GB/s", "800 MB/s".
std::string Rate(double bytes_per_second);
// "12.5%".
std::string Pct(double share);
}  // namespace planner_text

}  // namespace dgca

#endif  // DGCA_PLANNER_UNITS_H_
