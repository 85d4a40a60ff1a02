// The link model: how long one all-reduce among a job's ranks takes.
//
// A prior from the topology alone (NVLink count, PCIe path type and link
// width, WSL2, InfiniBand/RoCE or Ethernet between nodes, loopback TCP for
// CPU ranks), replaced by measurements when there are any (`dgca diagnose
// comm`, PlannerMeasurements): a measured bus bandwidth and latency, or a
// line fitted through measured (bytes, seconds) points, between which a
// bucket's time is then interpolated.
//
//   f    = 2(n-1)/n                      ring all-reduce factor
//   t(S) = latency + S * f / busbw       one all-reduce of S bytes
//
// Pure functions; safe from any thread.
#ifndef DGCA_PLANNER_LINK_MODEL_H_
#define DGCA_PLANNER_LINK_MODEL_H_

#include <string>
#include <utility>
#include <vector>

#include "dgca/v1/topology.pb.h"
#include "planner/measurements.h"

namespace dgca {

struct LinkModel {
  double busbw = 0;    // bytes/s
  double latency = 0;  // s
  std::string path;    // worst path among the ranks ("NV18", "SYS", "net", ...)
  std::string why;     // how busbw/latency were obtained
  bool measured = false;
  // Measured (bytes, seconds) of one all-reduce among the job's ranks, by
  // size; when there are two or more, a bucket's time is interpolated
  // between them instead of latency + bytes f / busbw (small sizes on a
  // shared host are far from that line).
  std::vector<std::pair<double, double>> points;
};

// Rank of an `nvidia-smi topo -m` path type: higher is worse. NV# best (0),
// then PIX, PXB, PHB, NODE, SYS (5); anything else 6.
int PathRank(const std::string& path);

// A GPU's PCIe bandwidth in bytes/s from its link speed ("16.0 GT/s PCIe")
// and width (128b/130b encoding); 16 GT/s x16 when unknown.
double PcieBytesPerSecond(const v1::Gpu& gpu);

// How n ranks spread over `nodes`, filling node 0 first: CUDA ranks one per
// GPU (none on a GPU-less node while others have GPUs), the last node
// taking what is left.
std::vector<int> RanksPerNode(const std::vector<v1::Topology>& nodes, int n, bool cuda);

// The prior for n ranks placed `per_node` (RanksPerNode): the worst GPU pair
// path of each node, the slowest node's network when several nodes are used.
LinkModel LinkPrior(const std::vector<v1::Topology>& nodes, const std::vector<int>& per_node,
                    bool cuda);

// Measured figures replace the prior's (an unmeasured latency keeps the
// prior's and says so); `why` cites meas.allreduce_source.
void ApplyLinkMeasurements(const PlannerMeasurements& meas, int n, LinkModel* link);

// LinkPrior (its busbw replaced by meas.link_prior_busbw when set) +
// ApplyLinkMeasurements for n ranks on `nodes`.
LinkModel ModelLink(const std::vector<v1::Topology>& nodes, int n, bool cuda,
                    const PlannerMeasurements& meas);

// Seconds of one all-reduce of `bytes` among n ranks: interpolated between
// measured points when there are two or more (past the largest, at busbw),
// else t(S) above.
double AllReduceSeconds(const LinkModel& link, double bytes, int n);

}  // namespace dgca

#endif  // DGCA_PLANNER_LINK_MODEL_H_
