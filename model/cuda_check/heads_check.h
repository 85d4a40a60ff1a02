// GPU-vs-CPU checks of the DGCA heads (cuda_heads.h against DgcaHeads) and
// the prompt encoder (cuda_prompt_encoder.h against PromptEncoder), in the
// form of op_check.h: each check appends CheckRow's (op | dtype | max rel
// err | tolerance) and dgca-model-check prints them in its table.
//
// Runs on the CUDA emulator in ctest (model/cuda_emu) and on an H200 (docs/benchmarks.md).
//
// Setup per check: a small config (hidden 32, vocab 200, top-k 4, 10 of at
// most 16 slots; candidate padding (-1), a duplicated candidate, targets
// outside the candidates, x != y on some slots), the CPU module Declared
// into a ParamStore, Finalize, Bind, InitParams, then every value redrawn
// at random (so no weight is a trivial 0 or 1), uploaded into a
// DeviceParams; grads, dh and dE start from the same random values on both
// sides (the backward ADDS). GPU outputs that are written (dz when not
// aliased, predictions, the prompt rows) and every internal buffer of the
// GPU module are poisoned with NaN first. Compared with MaxRelErr
// (op_check.h: max-abs-err / max-abs-ref): the four losses, dh, dz, dE and
// the gradient of every head parameter (one row each), predictions (exact:
// the row's error is the fraction of slots that differ).
//
// Tolerances: fp32 kF32Tol (1e-4). bf16 (h, z, E, W_c rounded to bf16 and
// the SAME rounded values fed to the CPU reference, so the error is the
// GPU's own roundings: dz and dh written in bf16, da rounded for the
// dense-layer GEMMs): kBf16Tol (1e-2) for gradients, 1e-3 for the losses
// (the fp32 loss path sees no rounding beyond its inputs).
//
// Cases: heads gated (detector + candidate), fp32 and bf16 (bf16 with dz
// aliasing z, fp32 with a separate dz); heads gated without detector,
// fp32; fusion none (detector + candidate on, predictions = argmax z),
// fp32 and bf16; prompt encoder lstm and mlp, fp32.
#ifndef DGCA_MODEL_CUDA_CHECK_HEADS_CHECK_H_
#define DGCA_MODEL_CUDA_CHECK_HEADS_CHECK_H_

#include <vector>

#include "model/cuda_check/op_check.h"

namespace dgca {
namespace cuda {

// The checks above, in a fixed order (names start "heads" or "prompt").
const std::vector<OpCheck>& HeadsChecks();

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CHECK_HEADS_CHECK_H_
