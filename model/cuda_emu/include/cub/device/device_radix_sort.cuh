// The CUDA emulator's stand-in for CUB's DeviceRadixSort (model/cuda_emu/
// emulator.h): SortPairs with CUB's contract — the size query with null
// temp storage, a stable sort of (key, value) pairs by the key bits
// [begin_bit, end_bit), signed keys ordered as numbers — run in stream
// order like every emulated kernel. The temp storage must be device memory
// of at least the queried size (checked: too little is a launch error).
#ifndef DGCA_MODEL_CUDA_EMU_INCLUDE_CUB_DEVICE_DEVICE_RADIX_SORT_CUH_
#define DGCA_MODEL_CUDA_EMU_INCLUDE_CUB_DEVICE_DEVICE_RADIX_SORT_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "model/cuda_emu/emulator.h"

namespace cub {

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out,
                               NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                               cudaStream_t stream = 0) {
    static_assert(std::is_integral<KeyT>::value, "the emulated SortPairs sorts integer keys");
    namespace emu = ::dgca::cuda::emu;
    const size_t n = static_cast<size_t>(num_items);
    // About what CUB asks for: the alternate key/value buffers plus histograms.
    const size_t need = n * (sizeof(KeyT) + sizeof(ValueT)) + 1024;
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = need;
      return cudaSuccess;
    }
    if (temp_storage_bytes < need || !emu::FindAllocation(d_temp_storage, need, nullptr)) {
      return emu::ApiError(cudaErrorInvalidValue, "cub::DeviceRadixSort::SortPairs: temp storage of " +
                                                      std::to_string(temp_storage_bytes) + " bytes, " +
                                                      std::to_string(need) + " needed in device memory");
    }
    if (n == 0) return cudaSuccess;
    return emu::Enqueue(stream, "cub::DeviceRadixSort::SortPairs of " + std::to_string(n) + " pairs",
                        [=] {
                          using U = typename std::make_unsigned<KeyT>::type;
                          const int bits = int(sizeof(KeyT) * 8);
                          const U sign = std::is_signed<KeyT>::value ? U(U(1) << (bits - 1)) : U(0);
                          const U mask = end_bit - begin_bit >= bits
                                             ? U(~U(0))
                                             : U(((U(1) << (end_bit - begin_bit)) - 1) << begin_bit);
                          auto radix = [&](KeyT k) { return U(U(k) ^ sign) & mask; };
                          std::vector<size_t> order(n);
                          std::iota(order.begin(), order.end(), size_t{0});
                          std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
                            return radix(d_keys_in[a]) < radix(d_keys_in[b]);
                          });
                          std::vector<KeyT> keys(n);
                          std::vector<ValueT> values(n);
                          for (size_t i = 0; i < n; ++i) {
                            keys[i] = d_keys_in[order[i]];
                            values[i] = d_values_in[order[i]];
                          }
                          std::copy(keys.begin(), keys.end(), d_keys_out);
                          std::copy(values.begin(), values.end(), d_values_out);
                        });
  }
};

}  // namespace cub

#endif  // DGCA_MODEL_CUDA_EMU_INCLUDE_CUB_DEVICE_DEVICE_RADIX_SORT_CUH_
