#include "model/comm/gloo_kv_store.h"

#include <exception>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace dgca {
namespace {

class GlooKeyValueStore : public KeyValueStore {
 public:
  explicit GlooKeyValueStore(std::shared_ptr<gloo::rendezvous::Store> s) : s_(std::move(s)) {}

  Status Set(const std::string& key, const std::string& value) override {
    try {
      s_->set(key, std::vector<char>(value.begin(), value.end()));
      return OkStatus();
    } catch (const std::exception& e) {
      return UnavailableError("store set '" + key + "': " + e.what());
    }
  }

  StatusOr<std::string> Wait(const std::string& key,
                             std::chrono::milliseconds timeout) override {
    try {
      s_->wait({key}, timeout);
    } catch (const std::exception& e) {
      return DeadlineExceededError("store wait for '" + key + "' (" +
                                   std::to_string(timeout.count()) + " ms): " + e.what());
    }
    try {
      std::vector<char> v = s_->get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return UnavailableError("store get '" + key + "': " + e.what());
    }
  }

 private:
  std::shared_ptr<gloo::rendezvous::Store> s_;
};

}  // namespace

std::shared_ptr<KeyValueStore> MakeGlooKeyValueStore(
    std::shared_ptr<gloo::rendezvous::Store> store) {
  return std::make_shared<GlooKeyValueStore>(std::move(store));
}

}  // namespace dgca
