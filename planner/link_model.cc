#include "planner/link_model.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/fits.h"
#include "planner/units.h"

namespace dgca {

using planner_text::Num;
using planner_text::Rate;
using planner_text::Sec;

int PathRank(const std::string& p) {
  if (absl::StartsWith(p, "NV")) return 0;
  if (p == "PIX") return 1;
  if (p == "PXB") return 2;
  if (p == "PHB") return 3;
  if (p == "NODE") return 4;
  if (p == "SYS") return 5;
  return 6;  // unknown
}

double PcieBytesPerSecond(const v1::Gpu& g) {
  double gts = 16.0;
  std::string s = g.link_speed();
  double v = 0;
  if (!s.empty() && absl::SimpleAtod(s.substr(0, s.find(' ')), &v) && v > 0) gts = v;
  int w = g.link_width() > 0 ? g.link_width() : 16;
  // 128b/130b encoding (PCIe 3.0 and later).
  return gts * 1e9 * w * (128.0 / 130.0) / 8.0;
}

std::vector<int> RanksPerNode(const std::vector<v1::Topology>& nodes, int n, bool cuda) {
  int total_gpus = 0;
  for (const auto& t : nodes) total_gpus += t.gpus_size();
  std::vector<int> per_node(nodes.size(), 0);
  int left = n;
  for (size_t i = 0; i < nodes.size() && left > 0; ++i) {
    // CUDA: one rank per GPU, none on a node without GPUs while others
    // have them (as the placement).
    const int gpus = nodes[i].gpus_size();
    int cap = cuda ? (gpus > 0 || total_gpus == 0 ? std::max(gpus, 1) : 0) : left;
    if (i + 1 == nodes.size()) cap = left;
    per_node[i] = std::min(cap, left);
    left -= per_node[i];
  }
  return per_node;
}

LinkModel LinkPrior(const std::vector<v1::Topology>& nodes, const std::vector<int>& per_node,
                    bool cuda) {
  LinkModel link;
  int used_nodes = 0;
  for (int r : per_node) used_nodes += r > 0;
  // The path: worst GPU pair among the ranks of each node; the network
  // between nodes.
  std::string worst;
  int worst_rank = -1;
  double pcie = 0;
  bool wsl2 = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (per_node.size() <= i || per_node[i] == 0) continue;
    wsl2 |= nodes[i].wsl2();
    if (!cuda) continue;
    const int r = std::min(per_node[i], nodes[i].gpus_size());
    std::map<std::pair<int, int>, std::string> paths;
    for (const auto& l : nodes[i].links()) paths[{l.a(), l.b()}] = l.path();
    for (int a = 0; a < r; ++a) {
      double bw = PcieBytesPerSecond(nodes[i].gpus(a));
      if (pcie == 0 || bw < pcie) pcie = bw;
      for (int b = a + 1; b < r; ++b) {
        auto it = paths.find({a, b});
        std::string p = it == paths.end() ? "unknown" : it->second;
        if (PathRank(p) > worst_rank ||
            (PathRank(p) == 0 && worst_rank == 0 &&
             std::atoi(p.c_str() + 2) < std::atoi(worst.c_str() + 2))) {
          worst_rank = PathRank(p);
          worst = p;
        }
      }
    }
  }
  if (used_nodes > 1) {
    // Slowest node's network: an ACTIVE IB/RoCE port, else Ethernet sockets.
    double slowest = 0;
    std::string why;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (per_node.size() <= i || per_node[i] == 0) continue;
      double best = 0;
      std::string name;
      for (const auto& d : nodes[i].net_devices())
        if (d.state() == "ACTIVE" && d.rate_gbps() > best) {
          best = d.rate_gbps();
          name = d.name();
        }
      double bw = best > 0 ? best / 8.0 * 1e9 * 0.8 : 1.25e9 * 0.8;
      if (slowest == 0 || bw < slowest) {
        slowest = bw;
        why = best > 0 ? absl::StrCat(nodes[i].node(), " ", name, " ", Num(best), " Gb/s x 0.8")
                       : absl::StrCat(nodes[i].node(),
                                      " has no active IB/RoCE port: TCP sockets, "
                                      "assumed 10 Gb/s Ethernet x 0.8");
      }
    }
    link.busbw = slowest;
    link.latency = 50e-6;
    link.why = absl::StrCat("model (no measurement): ", why, " = ", Rate(slowest),
                            ", latency 50 us assumed");
    link.path = "net";
    return link;
  }
  link.path = cuda ? (worst.empty() ? "none" : worst) : "loopback";
  if (!cuda) {
    link.busbw = 2e9;
    link.latency = 100e-6;
    link.why = "model (no measurement): Gloo over loopback TCP, assumed 2 GB/s and 100 us";
    return link;
  }
  if (pcie == 0) pcie = 16e9 * 16 * (128.0 / 130.0) / 8.0;
  if (wsl2) {
    link.busbw = 1e9;
    link.latency = 500e-6;
    link.why = "model (no measurement): WSL2 stages NCCL traffic through host "
               "memory; such machines measure about 1 GB/s; latency 500 us assumed";
  } else if (PathRank(worst) == 0) {
    int links = std::max(1, std::atoi(worst.c_str() + 2));
    link.busbw = links * 25e9 * 0.8;
    link.latency = 10e-6;
    link.why = absl::StrFormat(
        "model (no measurement): %s = %d NVLinks x 25 GB/s x 0.8 = %s, latency 10 us", worst,
        links, Rate(link.busbw));
  } else {
    double eff = worst == "PIX" || worst == "PXB"    ? 0.7
                 : worst == "PHB" || worst == "NODE" ? 0.6
                                                     : 0.35;
    link.busbw = pcie * eff;
    link.latency = worst_rank >= 5 ? 30e-6 : 20e-6;
    link.why = absl::StrFormat(
        "model (no measurement): %s over PCIe %s x %.2f (%s) = %s, latency %s", worst,
        Rate(pcie), eff,
        eff == 0.7   ? "through PCIe switches"
        : eff == 0.6 ? "through the host bridge"
                     : "across sockets or unknown",
        Rate(link.busbw), Sec(link.latency));
  }
  return link;
}

void ApplyLinkMeasurements(const PlannerMeasurements& meas, int n, LinkModel* link) {
  const double model_latency = link->latency;
  const std::string model_why = link->why;
  if (meas.allreduce_bus_bandwidth > 0) {
    link->busbw = meas.allreduce_bus_bandwidth;
    link->latency = meas.allreduce_latency_s;
    link->measured = true;
    if (link->latency <= 0) {
      link->latency = model_latency;
      link->why = absl::StrCat("measured busbw ", Rate(link->busbw),
                               "; latency not measured, the model's ", Sec(model_latency),
                               " from: ", model_why);
    } else {
      link->why = absl::StrCat("measured busbw ", Rate(link->busbw), ", latency ",
                               Sec(link->latency));
    }
  } else if (meas.allreduce_points.size() >= 2 && n > 1) {
    const AllReduceLine fit = FitAllReduceLine(meas.allreduce_points, n);
    if (fit.ok) {
      link->busbw = fit.busbw;
      link->latency = fit.latency;
      link->measured = true;
      link->why = absl::StrCat("fitted from ", meas.allreduce_points.size(),
                               " measured all-reduce sizes: busbw ", Rate(link->busbw),
                               ", latency ", Sec(link->latency));
    }
  }
  if (link->measured && n > 1 && meas.allreduce_points.size() >= 2) {
    link->points.clear();
    for (const auto& p : meas.allreduce_points)
      if (p.first > 0 && p.second > 0) link->points.push_back(p);
    std::sort(link->points.begin(), link->points.end());
    if (link->points.size() < 2) link->points.clear();
  }
  if (link->measured && !meas.allreduce_source.empty()) {
    link->why = absl::StrCat(meas.allreduce_source, ": ", link->why);
  }
}

LinkModel ModelLink(const std::vector<v1::Topology>& nodes, int n, bool cuda,
                    const PlannerMeasurements& meas) {
  LinkModel link = LinkPrior(nodes, RanksPerNode(nodes, n, cuda), cuda);
  if (meas.link_prior_busbw > 0) {
    link.why = absl::StrCat("busbw ", Rate(meas.link_prior_busbw),
                            " set by the operator (dgca-coordinator --link-prior-busbw; the "
                            "topology's prior: ",
                            Rate(link.busbw), ", ", link.why, ")");
    link.busbw = meas.link_prior_busbw;
  }
  ApplyLinkMeasurements(meas, n, &link);
  return link;
}

double AllReduceSeconds(const LinkModel& link, double bytes, int n) {
  const double f = 2.0 * (n - 1) / n;
  const auto& pts = link.points;
  if (pts.size() >= 2) {
    if (bytes <= pts.front().first) return pts.front().second;
    for (size_t i = 1; i < pts.size(); ++i) {
      if (bytes <= pts[i].first) {
        const auto& a = pts[i - 1];
        const auto& b = pts[i];
        return a.second + (b.second - a.second) * (bytes - a.first) / (b.first - a.first);
      }
    }
    return pts.back().second + (link.busbw > 0 ? (bytes - pts.back().first) * f / link.busbw : 0);
  }
  return link.latency + (link.busbw > 0 ? bytes * f / link.busbw : 0);
}

}  // namespace dgca
