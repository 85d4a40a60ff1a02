// GlooKeyValueStore: a KeyValueStore over a gloo::rendezvous::Store (the
// worker's GrpcStore, or a FileStore in tests), so the NCCL communicator can
// bootstrap through the same store the Gloo communicator uses. Gloo's
// exceptions become UNAVAILABLE / DEADLINE_EXCEEDED statuses.
//
// Thread-safety: as the wrapped store (GrpcStore is thread-safe; FileStore
// is not: one per rank).
#ifndef DGCA_MODEL_COMM_GLOO_KV_STORE_H_
#define DGCA_MODEL_COMM_GLOO_KV_STORE_H_

#include <chrono>
#include <memory>
#include <string>

#include "model/comm/kv_store.h"

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace dgca {

std::shared_ptr<KeyValueStore> MakeGlooKeyValueStore(
    std::shared_ptr<gloo::rendezvous::Store> store);

}  // namespace dgca

#endif  // DGCA_MODEL_COMM_GLOO_KV_STORE_H_
