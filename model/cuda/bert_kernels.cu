// Kernels of CudaBert (bert_kernels.h). Straightforward grid-stride
// versions, one thread per element; checked on the CUDA emulator and on an H200 (docs/benchmarks.md).
#include "model/cuda/bert_kernels.h"

#include <cuda_bf16.h>

#include "model/cuda/cuda_context.h"
#include "model/cuda/dtype.h"

namespace dgca {
namespace cuda {
namespace {

int Blocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b > 65535 * 16 ? 65535 * 16 : b);  // grid-stride beyond
}

template <typename T>
__global__ void BertEmbedSumKernel(T* out, int32_t* pos_ids, int32_t* type_ids, int32_t* word_ids,
                                   int32_t* prompt_ids, const int32_t* ids, const int32_t* types,
                                   const int32_t* prompt_slot, const T* prompt_rows, const T* wte,
                                   const T* wpe, const T* wtt, int N, int L, int H) {
  const int64_t total = int64_t(N) * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / H), j = static_cast<int>(i % H);
    const int slot = prompt_rows != nullptr ? prompt_slot[r] : -1;
    const bool prompt = slot >= 0;
    const int pos = r % L, type = types[r];
    const T* w = prompt ? prompt_rows + int64_t(slot) * H : wte + int64_t(ids[r]) * H;
    out[i] = FromF<T>((ToF(w[j]) + ToF(wtt[int64_t(type) * H + j])) + ToF(wpe[int64_t(pos) * H + j]));
    if (j == 0) {
      pos_ids[r] = pos;
      type_ids[r] = type;
      word_ids[r] = prompt ? -1 : ids[r];
      prompt_ids[r] = prompt ? slot : -1;
    }
  }
}

template <typename T>
__global__ void ScatterRowsAddKernel(T* dst, const int32_t* rows, const T* src, const T* extra,
                                     int extra_rows, int R, int H) {
  const int64_t total = int64_t(R) * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / H), j = static_cast<int>(i % H);
    // dgca::Bert adds extra into the head gradient first, then adds that
    // into dhidden: the same two fp32 additions here.
    float s = ToF(src[i]);
    if (extra != nullptr && r < extra_rows) s += ToF(extra[i]);
    T* d = dst + int64_t(rows[r]) * H + j;
    *d = FromF<T>(ToF(*d) + s);
  }
}

}  // namespace

template <typename T>
Status BertEmbedSum(cudaStream_t stream, T* out, int32_t* pos_ids, int32_t* type_ids,
                    int32_t* word_ids, int32_t* prompt_ids, const int32_t* ids,
                    const int32_t* token_types, const int32_t* prompt_slot, const T* prompt_rows,
                    const T* word_table, const T* pos_table, const T* type_table, int B, int L,
                    int H) {
  const int N = B * L;
  if (N <= 0 || H <= 0) return OkStatus();
  if (prompt_rows != nullptr && prompt_slot == nullptr) {
    return InvalidArgumentError("BertEmbedSum: prompt_rows given without prompt_slot");
  }
  BertEmbedSumKernel<T><<<Blocks(int64_t(N) * H, 256), 256, 0, stream>>>(
      out, pos_ids, type_ids, word_ids, prompt_ids, ids, token_types, prompt_slot, prompt_rows,
      word_table, pos_table, type_table, N, L, H);
  return Launched("BertEmbedSum");
}

template <typename T>
Status ScatterRowsAdd(cudaStream_t stream, T* dst, const int32_t* rows, const T* src,
                      const T* extra, int extra_rows, int R, int H) {
  if (R <= 0 || H <= 0) return OkStatus();
  ScatterRowsAddKernel<T><<<Blocks(int64_t(R) * H, 256), 256, 0, stream>>>(dst, rows, src, extra,
                                                                          extra_rows, R, H);
  return Launched("ScatterRowsAdd");
}

#define DGCA_INSTANTIATE(T)                                                                       \
  template Status BertEmbedSum<T>(cudaStream_t, T*, int32_t*, int32_t*, int32_t*, int32_t*,       \
                                  const int32_t*, const int32_t*, const int32_t*, const T*,       \
                                  const T*, const T*, const T*, int, int, int);                   \
  template Status ScatterRowsAdd<T>(cudaStream_t, T*, const int32_t*, const T*, const T*, int,    \
                                    int, int);
DGCA_INSTANTIATE(float)
DGCA_INSTANTIATE(bf16)
DGCA_INSTANTIATE(__half)
#undef DGCA_INSTANTIATE

}  // namespace cuda
}  // namespace dgca
