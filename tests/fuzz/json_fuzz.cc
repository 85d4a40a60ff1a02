// model/core/json.h: the JSON reader behind checkpoints' state files,
// safetensors headers and confusion sets.
#include "model/core/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)dgca::ParseJson(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  return 0;
}
