// Reading and writing the safetensors format (Hugging Face): 8-byte little
// endian header length N, N bytes of JSON header {"name": {"dtype": "F32",
// "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {...}}, then
// the raw little-endian data.
//
// Reading converts F32, F16 and BF16 to float. Every malformed file (short
// read, bad JSON, offsets outside the data, shape*dtype != byte range,
// unsupported dtype) is a DATA_LOSS / INVALID_ARGUMENT error naming the file
// and the tensor or header byte where it went wrong.
//
// Thread-safety: free functions; no shared state.
#ifndef DGCA_MODEL_CORE_SAFETENSORS_H_
#define DGCA_MODEL_CORE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/core/status.h"

namespace dgca {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;   // row-major, numel = product(shape)
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;   // "__metadata__"
};

StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// Writes F32 tensors (names sorted, as safetensors requires offsets in order).
// Writes to path + ".tmp" and renames, so a crash never leaves a torn file.
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};
Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_SAFETENSORS_H_
