// Warp-level tensor-core primitives whose register layout is documented
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"
// and "Warp-level matrix load instruction: ldmatrix"), so a kernel can do
// per-row arithmetic on an accumulator in registers. nvcuda::wmma leaves
// its fragments' element-to-lane mapping unspecified, which forces a trip
// through shared memory for anything row-wise (a softmax); these do not.
//
// Lane l of a warp, g = l / 4 ("groupID"), t = l % 4 ("threadID_in_group"):
//
//   FragA, a 16x16 A tile (row-major, 16-bit T): x[0] = A(g, 2t..2t+1),
//     x[1] = A(g+8, 2t..), x[2] = A(g, 2t+8..), x[3] = A(g+8, 2t+8..);
//     the lower-numbered column in the low 16 bits.
//   FragB, a 16x8 B tile (k x n): x[0] = B(2t..2t+1, g), x[1] = B(2t+8.., g).
//   FragC, a 16x8 fp32 accumulator: x[0..1] = C(g, 2t..2t+1),
//     x[2..3] = C(g+8, 2t..2t+1).
//
// So two adjacent FragC tiles (columns 0..7 and 8..15) hold exactly the
// elements FragA wants for those 16 columns (PackA): a product's
// accumulator becomes the next product's A operand without leaving
// registers, the step flash attention is built on.
//
// LdMatrixX4 loads four 8x8 16-bit matrices from shared memory: lanes
// 8i..8i+7 give the addresses of matrix i's rows 0..7 (each 16-byte
// aligned), and lane l receives matrix i's row g, columns 2t..2t+1 in
// r[i]. LdMatrixX4Trans gives the transpose: column g, rows 2t..2t+1.
//
// Requires sm_80 or newer (bf16 mma). Under the CUDA emulator
// (DGCA_CUDA_EMULATOR) the same functions exchange the lanes' registers
// through a per-warp scratch and two warp barriers, computing what the PTX
// documentation says each lane receives. Device faults there: a lane of
// the warp that does not come (mma.sync and ldmatrix are .aligned warp
// collectives), lanes at different calls (another instruction or call
// site), an ldmatrix row address that is not 16-byte aligned. Not
// checked: that the address is in shared memory.
//
// Thread-safety: device functions; each is a warp collective.
#ifndef DGCA_MODEL_CUDA_MMA_FRAGMENTS_CUH_
#define DGCA_MODEL_CUDA_MMA_FRAGMENTS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "model/cuda/dtype.h"

namespace dgca {
namespace cuda {
namespace mma {

struct FragA {
  uint32_t x[4];
};
struct FragB {
  uint32_t x[2];
};
struct FragC {
  float x[4];
};

// Two fp32 values rounded to T (round to nearest even), `lo` in the low
// 16 bits: one register of a FragA / FragB.
template <typename T>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  const T a = FromF<T>(lo), b = FromF<T>(hi);
  uint16_t ua, ub;
  memcpy(&ua, &a, 2);
  memcpy(&ub, &b, 2);
  return uint32_t(ua) | (uint32_t(ub) << 16);
}

// The A operand for 16 columns from the accumulators of columns 0..7 (c0)
// and 8..15 (c1), rounded to T.
template <typename T>
__device__ __forceinline__ FragA PackA(const FragC& c0, const FragC& c1) {
  FragA a;
  a.x[0] = Pack<T>(c0.x[0], c0.x[1]);
  a.x[1] = Pack<T>(c0.x[2], c0.x[3]);
  a.x[2] = Pack<T>(c1.x[0], c1.x[1]);
  a.x[3] = Pack<T>(c1.x[2], c1.x[3]);
  return a;
}

__device__ __forceinline__ void Zero(FragC& c) { c.x[0] = c.x[1] = c.x[2] = c.x[3] = 0.0f; }

#if !defined(DGCA_CUDA_EMULATOR)

// d += a * b (fp32 accumulation; T = bf16 or __half).
template <typename T>
__device__ __forceinline__ void Mma(FragC& d, const FragA& a, const FragB& b) {
  static_assert(std::is_same<T, bf16>::value || std::is_same<T, __half>::value, "bf16 or fp16 operands");
  if constexpr (std::is_same<T, bf16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
  }
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

#else  // the CUDA emulator

namespace emu_detail {

// This thread's warp and lane in its block (blocks of up to 1024 threads).
inline int WarpOfThread() {
  return int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) / 32;
}
inline int LaneOfThread() { return int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32; }

// Per-warp exchange slots. A host thread runs one block at a time and a
// warp's lanes meet at __syncwarp between writing and reading, so each
// (warp, lane) slot has one writer and is read only after every lane of
// its warp wrote.
struct MmaSlot {
  uint32_t a[4];
  uint32_t b[2];
};
inline MmaSlot (&MmaSlots())[32][32] {
  static thread_local MmaSlot slots[32][32];
  return slots;
}
inline const void* (&RowSlots())[32][32] {
  static thread_local const void* slots[32][32];
  return slots;
}

template <typename T>
float Half(uint32_t reg, int which) {
  const uint16_t bits = uint16_t(which ? reg >> 16 : reg & 0xffffu);
  T v;
  memcpy(&v, &bits, 2);
  return ToF(v);
}

inline uint16_t Bits16(const void* row, int col) {
  uint16_t v;
  memcpy(&v, static_cast<const char*>(row) + 2 * col, 2);
  return v;
}

// A warp barrier that also requires every lane of the warp to be at the
// same call (the same instruction at the same call site), as .aligned
// does: lane 0's tag of (op, file, line) is shuffled to every lane.
inline void SameCall(const char* op, const char* file, int line) {
  namespace emu = ::dgca::cuda::emu;
  const uint64_t mine = uint64_t(reinterpret_cast<uintptr_t>(file)) * 1000003u ^ uint64_t(line) * 7919u ^
                        uint64_t(reinterpret_cast<uintptr_t>(op));
  const uint64_t lane0 = emu::WarpCollective(emu::WarpOp::kShflIdx, 0xffffffffu, mine, 0, 32, file, line);
  if (lane0 != mine) {
    emu::DeviceFault(cudaErrorLaunchFailure, std::string(file) + ":" + std::to_string(line) + ": " + op +
                                                 ": lane " + std::to_string(LaneOfThread()) +
                                                 " is at a different mma/ldmatrix call than lane 0 of its warp");
  }
}

// Every lane deposits its row address; returns after the warp's lanes all did.
inline void ShareRow(const void* row, const char* op, const char* file, int line) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
    ::dgca::cuda::emu::DeviceFault(cudaErrorMisalignedAddress,
                                   std::string(file) + ":" + std::to_string(line) + ": " + op +
                                       ": a row address is not 16-byte aligned (lane " +
                                       std::to_string(LaneOfThread()) + ")");
  }
  RowSlots()[WarpOfThread()][LaneOfThread()] = row;
  SameCall(op, file, line);
}

}  // namespace emu_detail

template <typename T>
void Mma(FragC& d, const FragA& a, const FragB& b, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(std::is_same<T, bf16>::value || std::is_same<T, __half>::value, "bf16 or fp16 operands");
  using namespace emu_detail;
  const int w = WarpOfThread(), l = LaneOfThread();
  MmaSlot(&s)[32] = MmaSlots()[w];
  memcpy(s[l].a, a.x, sizeof(a.x));
  memcpy(s[l].b, b.x, sizeof(b.x));
  SameCall("mma.sync", file, line);
  const int g = l / 4, t = l % 4;
  // A(row, k) is in lane 4 (row % 8) + (k % 8) / 2, register (row / 8) + 2 (k / 8),
  // half k % 2; B(k, col) in lane 4 col + (k % 8) / 2, register k / 8, half k % 2.
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + (i % 2);
    float acc = d.x[i];
    for (int k = 0; k < 16; ++k) {
      const float av = Half<T>(s[4 * (row % 8) + (k % 8) / 2].a[row / 8 + 2 * (k / 8)], k % 2);
      const float bv = Half<T>(s[4 * col + (k % 8) / 2].b[k / 8], k % 2);
      acc += av * bv;  // exact product of two 16-bit values, fp32 sum
    }
    d.x[i] = acc;
  }
  __syncwarp();
}

namespace emu_detail {
// ldmatrix .x4: lane l gets, in r[i], matrix i's row g, columns 2t and
// 2t+1 (rows[8i + g] holds that row's address); transposed, column g of
// rows 2t and 2t+1.
inline void LdMatrix(uint32_t (&r)[4], const void* row, bool trans, const char* file, int line) {
  ShareRow(row, trans ? "ldmatrix.trans" : "ldmatrix", file, line);
  const void* const* rows = RowSlots()[WarpOfThread()];
  const int l = LaneOfThread(), g = l / 4, t = l % 4;
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = trans ? Bits16(rows[8 * i + 2 * t], g) : Bits16(rows[8 * i + g], 2 * t);
    const uint16_t hi = trans ? Bits16(rows[8 * i + 2 * t + 1], g) : Bits16(rows[8 * i + g], 2 * t + 1);
    r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  __syncwarp();
}
}  // namespace emu_detail

inline void LdMatrixX4(uint32_t (&r)[4], const void* row, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  emu_detail::LdMatrix(r, row, false, file, line);
}

inline void LdMatrixX4Trans(uint32_t (&r)[4], const void* row, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  emu_detail::LdMatrix(r, row, true, file, line);
}

#endif  // DGCA_CUDA_EMULATOR

}  // namespace mma
}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_MMA_FRAGMENTS_CUH_
