// Kernels of CudaBert (model/cuda/cuda_bert.h) that have no counterpart in
// kernels.h: the embedding sum with the ReLM prompt scatter, and the
// scatter of the MLM head's row gradients into dhidden. Same conventions
// as kernels.h (T = float or bf16, fp32 arithmetic, launch status returned,
// everything on `stream`). Checked on the CUDA emulator; not yet
// run on a GPU.
//
// Thread-safety: launchers are stateless; ordering is the stream's.
#ifndef DGCA_MODEL_CUDA_BERT_KERNELS_H_
#define DGCA_MODEL_CUDA_BERT_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "model/core/status.h"

namespace dgca {
namespace cuda {

// For each row i of [B*L]: prompt = prompt_rows != null && prompt_slot[i] >= 0;
//   pos_ids[i] = i % L, type_ids[i] = token_types[i],
//   word_ids[i] = prompt ? -1 : ids[i], prompt_ids[i] = prompt ? prompt_slot[i] : -1,
//   out[i,:] = (w + type_table[types[i]]) + pos_table[i % L]   (fp32 sums,
//   HF's order, one rounding to T), w = prompt_rows[slot] or word_table[ids[i]].
// prompt_slot and prompt_rows may be null (no prompt encoder).
template <typename T>
Status BertEmbedSum(cudaStream_t stream, T* out, int32_t* pos_ids, int32_t* type_ids,
                    int32_t* word_ids, int32_t* prompt_ids, const int32_t* ids,
                    const int32_t* token_types, const int32_t* prompt_slot, const T* prompt_rows,
                    const T* word_table, const T* pos_table, const T* type_table, int B, int L,
                    int H);

// dst[rows[r],:] += src[r,:] (+ extra[r,:] when r < extra_rows; extra may be
// null) for r in [0,R). Rows must be distinct (no two threads add to one
// element), as dgca::Bert's head rows are.
template <typename T>
Status ScatterRowsAdd(cudaStream_t stream, T* dst, const int32_t* rows, const T* src,
                      const T* extra, int extra_rows, int R, int H);

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_BERT_KERNELS_H_
