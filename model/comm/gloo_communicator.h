// Gloo communicator: CPU collectives over Gloo's TCP transport.
//
// The rendezvous store is injected: the worker passes a gloo::rendezvous::Store
// backed by the coordinator's key-value store (over gRPC); tests pass a
// gloo::rendezvous::FileStore in a temp dir. Use ONE store object per rank
// (FileStore is not thread-safe) and a fresh key space per communicator
// (e.g. a gloo::rendezvous::PrefixStore per job attempt): the keys written
// here ("rank_N" by Gloo's connectFullMesh, "dgca/..." by this file) must not
// collide with an earlier communicator's.
//
// Operations run in the order they were started, on one background thread.
// A collective that fails (a peer died, timeout) turns into a Status naming
// the lost peer rank ("lost peer rank N"): from the port in Gloo's message
// (each rank publishes the ports of its sockets at connect time, read from
// /proc on Linux), else the other rank when there are two, else the only
// rank that left no failure report in the store within min(timeout, 2 s).
// The communicator is then broken and every later operation fails at once
// with the same error. Gloo exceptions never escape.
//
// Store keys written here: "rank_N" and friends (Gloo), "dgca/ports/N",
// "dgca/failed/N", "dgca/teardown/N".
//
// Teardown: the destructor waits for queued operations, then barriers on the
// store (so no rank closes its sockets while a peer is still in a collective;
// docs/build.md, "Gloo's FileStore"), bounded by the timeout, and is skipped when broken.
//
// Thread-safety: as Communicator: Start*/Wait/Broadcast/Barrier from one
// (the training) thread.
#ifndef DGCA_MODEL_COMM_GLOO_COMMUNICATOR_H_
#define DGCA_MODEL_COMM_GLOO_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <string>

#include "model/comm/communicator.h"
#include "model/core/status.h"

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace dgca {

struct GlooOptions {
  // Bound on connecting and on every collective; a lost peer fails within it.
  std::chrono::milliseconds timeout{60000};
  // Address to bind and advertise. Set one of them; iface wins when set.
  std::string hostname = "127.0.0.1";
  std::string iface;
  // How long a waiting thread polls before blocking (Wait() on a handle, and
  // the op thread between the ops of a burst). Futex wake-ups on a VM cost
  // about as much as a small all-reduce; 0 = always block.
  int spin_us = 200;
};

// Connects the full mesh (blocks until every rank joined or the timeout).
// Errors: UNAVAILABLE / DEADLINE_EXCEEDED with Gloo's message and this rank.
// Sets SIGPIPE to SIG_IGN for the process (a dead peer must fail the
// collective with an error, not kill this process).
StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(
    std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size,
    const GlooOptions& options = GlooOptions());

}  // namespace dgca

#endif  // DGCA_MODEL_COMM_GLOO_COMMUNICATOR_H_
