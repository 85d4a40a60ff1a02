// Tests of the CUDA emulator itself (emulator.h): that kernels compute what
// CUDA says they compute (thread/block indices, shared memory, barriers,
// warp shuffles and votes, atomics, dynamic shared memory), that the lazy
// streams keep every ordering CUDA promises and no other, and that each
// misuse a GPU punishes is caught here with a message: deadlocks, bad
// shuffle masks, launch configurations, host pointers passed to kernels,
// out-of-bounds and use-after-free accesses, host dereferences of device
// memory, missing synchronization.
//
// A fault is sticky (as on a GPU), so each fault test runs in a child
// process (a gtest death test) and exits with a status that says whether
// the emulator reported what it should have.
//
// Compiled like model/cuda/*.cu: launches rewritten, device.h included.
#include <gtest/gtest.h>

#include <cublasLt.h>
#include <cub/device/device_radix_sort.cuh>
#include <mma.h>

#include "model/cuda/mma_fragments.cuh"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

namespace {

// ------------------------------------------------------------------ kernels
__global__ void IndexKernel(int* out) {
  const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  out[b * threads + t] = b * 1000 + t;
}

// Reverses each block's slice through shared memory: needs the barrier.
__global__ void ReverseKernel(float* data) {
  __shared__ float tile[128];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = data[i];
  __syncthreads();
  data[i] = tile[blockDim.x - 1 - threadIdx.x];
}
// The same without the barrier: correct only by luck of ordering.
__global__ void ReverseNoBarrierKernel(float* data) {
  __shared__ float tile[128];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = data[i];
  data[i] = tile[blockDim.x - 1 - threadIdx.x];
}

__global__ void ShuffleKernel(int* xor_out, int* down_out, int* up_out, int* idx_out, int* width8_out) {
  const int lane = threadIdx.x & 31;
  const int v = 100 + threadIdx.x;
  xor_out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);
  down_out[threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 3);
  up_out[threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 2);
  idx_out[threadIdx.x] = __shfl_sync(0xffffffffu, v, 7);
  width8_out[threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 4, 8);
  (void)lane;
}

__global__ void WarpSumKernel(const float* in, float* out) {
  float x = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if ((threadIdx.x & 31) == 0) out[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = x;
}

__global__ void VoteKernel(int* any_out, int* all_out, unsigned* ballot_out) {
  const int pred = (threadIdx.x % 5) == 0;
  any_out[threadIdx.x] = __any_sync(0xffffffffu, threadIdx.x == 17);
  all_out[threadIdx.x] = __all_sync(0xffffffffu, pred);
  ballot_out[threadIdx.x] = __ballot_sync(0xffffffffu, pred);
}

__global__ void AtomicKernel(float* sum, int* count) {
  atomicAdd(sum, 0.5f);
  atomicAdd(count, 1);
}

__global__ void DynamicSharedKernel(float* out, int n) {
  extern __shared__ float buf[];
  buf[threadIdx.x] = float(threadIdx.x) * 2.0f;
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + 1) % n];
}

__global__ void SharedReadBeforeWriteKernel(float* out) {
  __shared__ float s[32];
  out[threadIdx.x] = s[threadIdx.x];  // undefined: never written
}

__global__ void WriteKernel(float* p, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + float(i);
}
__global__ void CopyKernel(float* dst, const float* src, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}
__global__ void OffByOneKernel(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) p[i] = 1.0f;  // the bug: <=
}
__global__ void DeadlockKernel(float* p) {
  // Thread 0 waits for its warp at a shuffle while the rest of the block
  // (lane 1 included) waits at the barrier: neither can complete.
  float x = 1.0f;
  if (threadIdx.x == 0) {
    x = __shfl_xor_sync(0xffffffffu, x, 1);
  } else {
    __syncthreads();
  }
  p[threadIdx.x] = x;
}
__global__ void BarrierInLoopKernel(float* p, int n) {
  // Thread 0 leaves the loop early and exits: exited threads count as
  // arrived at the remaining barriers (as on sm_70+).
  for (int it = 0; it < (threadIdx.x == 0 ? 1 : 3); ++it) __syncthreads();
  p[threadIdx.x] = float(n);
}
__global__ void ExitedLaneShuffleKernel(float* p) {
  if (threadIdx.x == 3) return;
  p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
__global__ void PartialMaskKernel(int* out) {
  // Lanes 0..15 shuffle among themselves with their own mask: fine.
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, int(threadIdx.x), 1);
}
__global__ void ShuffleOutsideMaskKernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, int(threadIdx.x), 16);
}

// One warp: c (16x16 fp32, row-major) = a (16x16 row-major) * b (16x16
// col-major) + c, through nvcuda::wmma (the emulated mma.h).
template <typename T>
__global__ void WmmaKernel(float* c, const T* a, const T* b) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= 2.0f;  // element-wise: any mapping
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}
// A load from a pointer that is not 32-byte aligned (a + 1 element).
__global__ void WmmaMisalignedKernel(const __half* a) {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major> fa;
  nvcuda::wmma::load_matrix_sync(fa, a + 1, 16);
}
// Half the warp skips the collective.
__global__ void WmmaHalfWarpKernel(const __half* a) {
  if (threadIdx.x >= 16) return;
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major> fa;
  nvcuda::wmma::load_matrix_sync(fa, a, 16);
}

// One warp: lane l gives the address of row l % 8 of 8x8 matrix l / 8 of
// `m` (4 matrices of 16-bit values, row pitch 8 + pad elements, through
// shared memory) and stores what ldmatrix (.trans with kTrans) gives it:
// out[4 l + i] = r[i].
template <bool kTrans>
__global__ void LdMatrixKernel(uint32_t* out, const uint16_t* m, int pad) {
  __shared__ __align__(16) uint16_t tile[4 * 8 * 16];
  const int pitch = 8 + pad, lane = threadIdx.x;
  for (int i = lane; i < 4 * 8 * 8; i += 32) tile[(i / 8) * pitch + i % 8] = m[i];
  __syncwarp();
  uint32_t r[4];
  const uint16_t* row = tile + lane * pitch;  // matrix lane / 8, row lane % 8
  if constexpr (kTrans) {
    dgca::cuda::mma::LdMatrixX4Trans(r, row);
  } else {
    dgca::cuda::mma::LdMatrixX4(r, row);
  }
  for (int i = 0; i < 4; ++i) out[4 * lane + i] = r[i];
}
// One warp: c [16x8] (fp32, row-major) += a [16x16] * b [16x8] (row-major,
// T), the fragments gathered by hand from the layout mma_fragments.cuh
// documents (no ldmatrix), the result scattered by it.
template <typename T>
__global__ void MmaFragmentKernel(float* c, const T* a, const T* b) {
  namespace mma = dgca::cuda::mma;
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto pack = [](T lo, T hi) {
    uint16_t ul, uh;
    memcpy(&ul, &lo, 2);
    memcpy(&uh, &hi, 2);
    return uint32_t(ul) | uint32_t(uh) << 16;
  };
  mma::FragA fa;
  fa.x[0] = pack(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]);
  fa.x[1] = pack(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]);
  fa.x[2] = pack(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]);
  fa.x[3] = pack(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]);
  mma::FragB fb;
  fb.x[0] = pack(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
  fb.x[1] = pack(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
  mma::FragC fc;
  fc.x[0] = c[g * 8 + 2 * t];
  fc.x[1] = c[g * 8 + 2 * t + 1];
  fc.x[2] = c[(g + 8) * 8 + 2 * t];
  fc.x[3] = c[(g + 8) * 8 + 2 * t + 1];
  mma::Mma<T>(fc, fa, fb);
  c[g * 8 + 2 * t] = fc.x[0];
  c[g * 8 + 2 * t + 1] = fc.x[1];
  c[(g + 8) * 8 + 2 * t] = fc.x[2];
  c[(g + 8) * 8 + 2 * t + 1] = fc.x[3];
}
// ldmatrix with lane 5's row address 2 bytes off (not 16-byte aligned).
__global__ void LdMatrixMisalignedKernel() {
  __shared__ __align__(16) uint16_t tile[32 * 8 + 8];
  uint32_t r[4];
  dgca::cuda::mma::LdMatrixX4(r, tile + threadIdx.x * 8 + (threadIdx.x == 5 ? 1 : 0));
}
// Even lanes at ldmatrix, odd lanes at ldmatrix.trans: not one instruction.
__global__ void LdMatrixDivergentKernel() {
  __shared__ __align__(16) uint16_t tile[32 * 8];
  uint32_t r[4];
  if (threadIdx.x % 2 == 0) {
    dgca::cuda::mma::LdMatrixX4(r, tile + threadIdx.x * 8);
  } else {
    dgca::cuda::mma::LdMatrixX4Trans(r, tile + threadIdx.x * 8);
  }
}
// Half the warp skips the mma.
__global__ void MmaHalfWarpKernel() {
  if (threadIdx.x >= 16) return;
  dgca::cuda::mma::FragC c{};
  dgca::cuda::mma::Mma<__half>(c, dgca::cuda::mma::FragA{}, dgca::cuda::mma::FragB{});
}

// ------------------------------------------------------------------ helpers
bool Ok(cudaError_t e) { return e == cudaSuccess; }

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) std::abort();
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> Download(const T* d, size_t n) {
  std::vector<T> h(n);
  if (cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) std::abort();
  return h;
}
template <typename T>
void Upload(T* d, const std::vector<T>& h) {
  if (cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) std::abort();
  if (cudaDeviceSynchronize() != cudaSuccess) std::abort();
}

bool IsPoison(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b == 0x7FC07FC0u;
}

// ------------------------------------------------------------------ semantics
TEST(EmulatorKernels, IndicesCoverA3dGridOf3dBlocks) {
  const dim3 grid(3, 2, 2), block(4, 2, 3);
  const int threads = 24, blocks = 12;
  int* d = DeviceAlloc<int>(threads * blocks);
  IndexKernel<<<grid, block>>>(d);
  ASSERT_TRUE(Ok(cudaGetLastError()));
  std::vector<int> h = Download(d, threads * blocks);
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t) ASSERT_EQ(h[b * threads + t], b * 1000 + t) << b << " " << t;
  cudaFree(d);
}

TEST(EmulatorKernels, SharedMemoryAndBarrier) {
  std::vector<float> h(256);
  std::iota(h.begin(), h.end(), 0.0f);
  float* d = DeviceAlloc<float>(256);
  Upload(d, h);
  ReverseKernel<<<2, 128>>>(d);
  std::vector<float> got = Download(d, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(got[i], float((i / 128) * 128 + 127 - i % 128)) << i;
  cudaFree(d);
}

TEST(EmulatorKernels, ShufflesFollowCudaSemantics) {
  int* d = DeviceAlloc<int>(5 * 64);
  ShuffleKernel<<<1, 64>>>(d, d + 64, d + 128, d + 192, d + 256);
  std::vector<int> h = Download(d, 5 * 64);
  for (int t = 0; t < 64; ++t) {
    const int lane = t & 31, base = t - lane;
    EXPECT_EQ(h[t], 100 + base + (lane ^ 5)) << "xor " << t;
    EXPECT_EQ(h[64 + t], 100 + (lane + 3 < 32 ? t + 3 : t)) << "down " << t;
    EXPECT_EQ(h[128 + t], 100 + (lane >= 2 ? t - 2 : t)) << "up " << t;
    EXPECT_EQ(h[192 + t], 100 + base + 7) << "idx " << t;
    EXPECT_EQ(h[256 + t], 100 + ((lane & 7) + 4 < 8 ? t + 4 : t)) << "down width 8 " << t;
  }
  cudaFree(d);
}

TEST(EmulatorKernels, WarpReductionAndVotes) {
  std::vector<float> in(128);
  for (int i = 0; i < 128; ++i) in[i] = float(i % 7) - 2.5f;
  float* din = DeviceAlloc<float>(128);
  float* dout = DeviceAlloc<float>(4);
  Upload(din, in);
  WarpSumKernel<<<2, 64>>>(din, dout);
  std::vector<float> got = Download(dout, 4);
  for (int w = 0; w < 4; ++w) {
    float want = 0;
    for (int i = 0; i < 32; ++i) want += in[w * 32 + i];
    EXPECT_FLOAT_EQ(got[w], want) << w;
  }
  int* dv = DeviceAlloc<int>(64);
  unsigned* db = DeviceAlloc<unsigned>(32);
  VoteKernel<<<1, 32>>>(dv, dv + 32, db);
  std::vector<int> v = Download(dv, 64);
  std::vector<unsigned> b = Download(db, 32);
  unsigned want_ballot = 0;
  for (int l = 0; l < 32; l += 5) want_ballot |= 1u << l;
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(v[l], 1);       // lane 17 voted yes
    EXPECT_EQ(v[32 + l], 0);  // not all lanes
    EXPECT_EQ(b[l], want_ballot);
  }
  PartialMaskKernel<<<1, 32>>>(dv);
  v = Download(dv, 16);
  for (int l = 0; l < 16; ++l) EXPECT_EQ(v[l], l ^ 1);
  cudaFree(din);
  cudaFree(dout);
  cudaFree(dv);
  cudaFree(db);
}

TEST(EmulatorKernels, AtomicsAndDynamicSharedMemory) {
  float* s = DeviceAlloc<float>(1);
  int* c = DeviceAlloc<int>(1);
  ASSERT_TRUE(Ok(cudaMemset(s, 0, 4)));
  ASSERT_TRUE(Ok(cudaMemset(c, 0, 4)));
  AtomicKernel<<<7, 96>>>(s, c);
  EXPECT_EQ(Download(s, 1)[0], 7 * 96 * 0.5f);
  EXPECT_EQ(Download(c, 1)[0], 7 * 96);
  float* out = DeviceAlloc<float>(64);
  DynamicSharedKernel<<<1, 64, 64 * sizeof(float)>>>(out, 64);
  std::vector<float> h = Download(out, 64);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(h[t], float((t + 1) % 64) * 2.0f);
  cudaFree(s);
  cudaFree(c);
  cudaFree(out);
}

TEST(EmulatorKernels, ExitedThreadsCountAsArrivedAtBarriers) {
  float* d = DeviceAlloc<float>(64);
  BarrierInLoopKernel<<<1, 64>>>(d, 9);
  ASSERT_TRUE(Ok(cudaDeviceSynchronize()));
  for (float x : Download(d, 64)) EXPECT_EQ(x, 9.0f);
  cudaFree(d);
}

TEST(EmulatorKernels, FreshMemoryAndSharedMemoryArePoisoned) {
  float* d = DeviceAlloc<float>(32);
  std::vector<float> fresh = Download(d, 32);
  for (float x : fresh) EXPECT_TRUE(IsPoison(x));
  SharedReadBeforeWriteKernel<<<1, 32>>>(d);
  for (float x : Download(d, 32)) EXPECT_TRUE(std::isnan(x));
  cudaFree(d);
}

// A missing __syncthreads is caught by one of the scheduling orders.
TEST(EmulatorKernels, MissingBarrierShowsUnderForwardOrder) {
  if (std::getenv("DGCA_EMU_ORDER") != nullptr) GTEST_SKIP() << "checks the default (forward) order";
  std::vector<float> h(128);
  std::iota(h.begin(), h.end(), 0.0f);
  float* d = DeviceAlloc<float>(128);
  Upload(d, h);
  ReverseNoBarrierKernel<<<1, 128>>>(d);
  std::vector<float> got = Download(d, 128);
  int wrong = 0;
  for (int i = 0; i < 128; ++i) wrong += got[i] != float(127 - i);
  EXPECT_GT(wrong, 0) << "the missing barrier went unnoticed";
  cudaFree(d);
}

TEST(EmulatorLaunch, BadConfigurationIsALaunchErrorNotAFault) {
  float* d = DeviceAlloc<float>(4);
  WriteKernel<<<1, 2048>>>(d, 4, 0.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  WriteKernel<<<dim3(1, 70000), 32>>>(d, 4, 0.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  DynamicSharedKernel<<<1, 32, 64 * 1024>>>(d, 4);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  WriteKernel<<<0, 32>>>(d, 4, 0.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  WriteKernel<<<1, 4>>>(d, 4, 1.0f);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(Download(d, 4)[3], 4.0f);
  cudaFree(d);
}

// ------------------------------------------------------------------ streams
TEST(EmulatorStreams, AsyncCopyIntoPinnedMemoryNeedsASync) {
  cudaStream_t s;
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  float* d = DeviceAlloc<float>(64);
  float* pinned = nullptr;
  ASSERT_TRUE(Ok(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64 * sizeof(float))));
  WriteKernel<<<1, 64, 0, s>>>(d, 64, 10.0f);
  ASSERT_TRUE(Ok(cudaMemcpyAsync(pinned, d, 64 * sizeof(float), cudaMemcpyDeviceToHost, s)));
  EXPECT_TRUE(IsPoison(pinned[5])) << "read before the stream was synchronized: must not see the result";
  ASSERT_TRUE(Ok(cudaStreamSynchronize(s)));
  EXPECT_EQ(pinned[5], 15.0f);
  cudaFreeHost(pinned);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST(EmulatorStreams, PinnedStagingReusedBeforeTheCopyRanIsCaught) {
  cudaStream_t s;
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  float* d = DeviceAlloc<float>(2);
  float* pinned = nullptr;
  ASSERT_TRUE(Ok(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(float))));
  *pinned = 1.0f;
  ASSERT_TRUE(Ok(cudaMemcpyAsync(d, pinned, sizeof(float), cudaMemcpyHostToDevice, s)));
  *pinned = 2.0f;  // the bug: the copy above may not have read it yet
  ASSERT_TRUE(Ok(cudaMemcpyAsync(d + 1, pinned, sizeof(float), cudaMemcpyHostToDevice, s)));
  ASSERT_TRUE(Ok(cudaStreamSynchronize(s)));
  std::vector<float> h = Download(d, 2);
  EXPECT_EQ(h[0], 2.0f) << "the lazy stream should expose the reused staging buffer";
  EXPECT_EQ(h[1], 2.0f);
  // Pageable memory is staged at the call, as CUDA documents.
  float pageable = 3.0f;
  ASSERT_TRUE(Ok(cudaMemcpyAsync(d, &pageable, sizeof(float), cudaMemcpyHostToDevice, s)));
  pageable = 4.0f;
  ASSERT_TRUE(Ok(cudaStreamSynchronize(s)));
  EXPECT_EQ(Download(d, 1)[0], 3.0f);
  cudaFreeHost(pinned);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST(EmulatorStreams, EventsOrderStreamsAndNothingElseDoes) {
  cudaStream_t a, b;
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking)));
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking)));
  float* src = DeviceAlloc<float>(32);
  float* dst = DeviceAlloc<float>(32);
  ASSERT_TRUE(Ok(cudaDeviceSynchronize()));
  // Without an event, b's copy may run before a's write: here it does.
  WriteKernel<<<1, 32, 0, a>>>(src, 32, 1.0f);
  CopyKernel<<<1, 32, 0, b>>>(dst, src, 32);
  ASSERT_TRUE(Ok(cudaStreamSynchronize(b)));
  EXPECT_TRUE(IsPoison(Download(dst, 1)[0]));
  ASSERT_TRUE(Ok(cudaStreamSynchronize(a)));
  // With an event, b waits for a.
  cudaEvent_t e;
  ASSERT_TRUE(Ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
  WriteKernel<<<1, 32, 0, a>>>(src, 32, 5.0f);
  ASSERT_TRUE(Ok(cudaEventRecord(e, a)));
  ASSERT_TRUE(Ok(cudaStreamWaitEvent(b, e, 0)));
  CopyKernel<<<1, 32, 0, b>>>(dst, src, 32);
  ASSERT_TRUE(Ok(cudaStreamSynchronize(b)));
  EXPECT_EQ(Download(dst, 32)[31], 36.0f);
  cudaEventDestroy(e);
  cudaFree(src);
  cudaFree(dst);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// cudaEventDestroy returns at once (CUDA defers the release until the
// record completes): it must neither run the recorded work early (that
// would hide a missing cudaStreamWaitEvent) nor break a wait made on it.
TEST(EmulatorStreams, EventDestroyedBeforeItsRecordRanStillOrders) {
  cudaStream_t a, b;
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking)));
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking)));
  float* pinned = nullptr;
  ASSERT_TRUE(Ok(cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(float))));
  float* dst = DeviceAlloc<float>(32);
  cudaEvent_t e;
  ASSERT_TRUE(Ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
  WriteKernel<<<1, 32, 0, a>>>(pinned, 32, 7.0f);
  ASSERT_TRUE(Ok(cudaEventRecord(e, a)));
  ASSERT_TRUE(Ok(cudaStreamWaitEvent(b, e, 0)));
  ASSERT_TRUE(Ok(cudaEventDestroy(e)));
  EXPECT_TRUE(IsPoison(pinned[0])) << "cudaEventDestroy ran the recorded work";
  CopyKernel<<<1, 32, 0, b>>>(dst, pinned, 32);
  ASSERT_TRUE(Ok(cudaStreamSynchronize(b)));
  EXPECT_EQ(Download(dst, 32)[31], 38.0f);
  cudaFreeHost(pinned);
  cudaFree(dst);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST(EmulatorStreams, LegacyStreamSynchronizesWithBlockingStreamsOnly) {
  cudaStream_t blocking, nonblocking;
  ASSERT_TRUE(Ok(cudaStreamCreate(&blocking)));
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking)));
  float* d = DeviceAlloc<float>(32);
  ASSERT_TRUE(Ok(cudaDeviceSynchronize()));
  WriteKernel<<<1, 32, 0, blocking>>>(d, 32, 7.0f);
  EXPECT_EQ(Download(d, 1)[0], 7.0f);  // cudaMemcpy (legacy) waits for the blocking stream
  WriteKernel<<<1, 32, 0, nonblocking>>>(d, 32, 20.0f);
  EXPECT_EQ(Download(d, 1)[0], 7.0f);  // ...but not for a non-blocking one
  ASSERT_TRUE(Ok(cudaStreamSynchronize(nonblocking)));
  EXPECT_EQ(Download(d, 1)[0], 20.0f);
  cudaFree(d);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
}

TEST(EmulatorStreams, BadCopiesAreRejected) {
  float* d = DeviceAlloc<float>(8);
  float h[16] = {};
  EXPECT_EQ(cudaMemcpy(d, h, 16 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // overruns d
  EXPECT_EQ(cudaMemcpy(h, d, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // direction wrong
  EXPECT_EQ(cudaMemset(h, 0, 4), cudaErrorInvalidValue);                         // not device memory
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(d);
}

// ------------------------------------------------------------------ graphs
__global__ void AxpbKernel(float* out, const float* in, float a, float b, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i] + b;
}

TEST(EmulatorGraphs, CaptureAndReplayReadCurrentMemoryWithCapturedArguments) {
  cudaStream_t s;
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  const int n = 40;
  float* in = DeviceAlloc<float>(n);
  float* out = DeviceAlloc<float>(n);
  float* pinned = nullptr;
  ASSERT_TRUE(Ok(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float))));
  ASSERT_TRUE(Ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal)));
  cudaStreamCaptureStatus st;
  ASSERT_TRUE(Ok(cudaStreamIsCapturing(s, &st)));
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  float a = 2.0f;
  AxpbKernel<<<1, 64, 0, s>>>(out, in, a, 1.0f, n);
  a = 100.0f;  // the graph keeps the argument of the capture
  ASSERT_TRUE(Ok(cudaMemcpyAsync(pinned, out, n * sizeof(float), cudaMemcpyDeviceToHost, s)));
  cudaGraph_t graph;
  ASSERT_TRUE(Ok(cudaStreamEndCapture(s, &graph)));
  cudaGraphExec_t exec;
  ASSERT_TRUE(Ok(cudaGraphInstantiate(&exec, graph, 0)));
  EXPECT_TRUE(IsPoison(pinned[0])) << "a capture runs nothing";
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<float> h(n, float(rep + 1));
    ASSERT_TRUE(Ok(cudaMemcpyAsync(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s)));
    ASSERT_TRUE(Ok(cudaGraphLaunch(exec, s)));
    ASSERT_TRUE(Ok(cudaStreamSynchronize(s)));
    EXPECT_EQ(pinned[n - 1], 2.0f * (rep + 1) + 1.0f) << "replay " << rep;
  }
  EXPECT_TRUE(Ok(cudaGraphExecDestroy(exec)));
  EXPECT_TRUE(Ok(cudaGraphDestroy(graph)));
  cudaFreeHost(pinned);
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(s);
}

TEST(EmulatorGraphs, UnsafeCallsInvalidateTheCapture) {
  cudaStream_t s;
  ASSERT_TRUE(Ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  float* d = DeviceAlloc<float>(8);
  cudaGraph_t graph = nullptr;
  // An allocation inside the capture.
  ASSERT_TRUE(Ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal)));
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  // Waiting for the capturing stream (a host sync inside the capture).
  ASSERT_TRUE(Ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal)));
  AxpbKernel<<<1, 8, 0, s>>>(d, d, 1.0f, 0.0f, 8);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  // A copy from pageable memory.
  float h[8] = {};
  ASSERT_TRUE(Ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal)));
  EXPECT_EQ(cudaMemcpyAsync(d, h, sizeof(h), cudaMemcpyHostToDevice, s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  // The stream works normally afterwards.
  cudaGetLastError();
  ASSERT_TRUE(Ok(cudaMemsetAsync(d, 0, 8 * sizeof(float), s)));  // fresh memory is NaN: 0 x NaN = NaN
  AxpbKernel<<<1, 8, 0, s>>>(d, d, 0.0f, 3.0f, 8);
  ASSERT_TRUE(Ok(cudaStreamSynchronize(s)));
  EXPECT_EQ(Download(d, 8)[7], 3.0f);
  cudaFree(d);
  cudaStreamDestroy(s);
}

// ------------------------------------------------------------------ libraries
TEST(EmulatorLibraries, CubSortPairsIsStableAndOrdersSignedKeys) {
  const std::vector<int> keys = {3, -1, 3, 0, -7, 3, 0};
  const std::vector<int> vals = {0, 1, 2, 3, 4, 5, 6};
  int *dk = DeviceAlloc<int>(7), *dv = DeviceAlloc<int>(7), *dko = DeviceAlloc<int>(7), *dvo = DeviceAlloc<int>(7);
  Upload(dk, keys);
  Upload(dv, vals);
  size_t bytes = 0;
  ASSERT_TRUE(Ok(cub::DeviceRadixSort::SortPairs(nullptr, bytes, dk, dko, dv, dvo, 7)));
  char* temp = DeviceAlloc<char>(bytes);
  size_t small = bytes - 1;
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(temp, small, dk, dko, dv, dvo, 7), cudaErrorInvalidValue);
  ASSERT_TRUE(Ok(cub::DeviceRadixSort::SortPairs(temp, bytes, dk, dko, dv, dvo, 7)));
  EXPECT_EQ(Download(dko, 7), (std::vector<int>{-7, -1, 0, 0, 3, 3, 3}));
  EXPECT_EQ(Download(dvo, 7), (std::vector<int>{4, 1, 3, 6, 0, 2, 5}));
  for (void* p : {static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(dko), static_cast<void*>(dvo),
                  static_cast<void*>(temp)})
    cudaFree(p);
}

TEST(EmulatorLibraries, CublasLtRejectsMisalignedOperandsAndBadShapes) {
  cublasLtHandle_t h;
  ASSERT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t op;
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t a, b, c, bad;
  cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 4, 3, 4);  // m x k
  cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 3, 2, 3);  // k x n
  cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 4, 2, 4);  // m x n
  cublasLtMatrixLayoutCreate(&bad, CUDA_R_32F, 5, 2, 5);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t r;
  int n = 0;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, bad, bad, pref, 1, &r, &n), CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &r, &n), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(n, 1);
  // A = [[1..]] column-major 4x3, B 3x2: D = A B.
  std::vector<float> ha(12), hb(6);
  std::iota(ha.begin(), ha.end(), 1.0f);
  std::iota(hb.begin(), hb.end(), -2.0f);
  float* buf = DeviceAlloc<float>(192);  // three 256-byte-aligned operands
  float *da = buf, *db = buf + 64, *dd = buf + 128;
  Upload(da, ha);
  Upload(db, hb);
  const float one = 1.0f, zero = 0.0f;
  ASSERT_EQ(cublasLtMatmul(h, op, &one, da, a, db, b, &zero, dd, c, dd, c, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> got = Download(dd, 8);
  for (int j = 0; j < 2; ++j)
    for (int i = 0; i < 4; ++i) {
      float want = 0;
      for (int p = 0; p < 3; ++p) want += ha[i + p * 4] * hb[p + j * 3];
      EXPECT_EQ(got[i + j * 4], want) << i << "," << j;
    }
  // The algorithm was chosen for 256-byte alignment; A 4 bytes off is not.
  EXPECT_EQ(cublasLtMatmul(h, op, &one, da + 1, a, db, b, &zero, dd, c, dd, c, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  cudaFree(buf);
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto l : {a, b, c, bad}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(h);
}

TEST(EmulatorLibraries, WmmaComputesTheTileProduct) {
  const int n = 16;
  std::vector<float> fa(n * n), fb(n * n), fc(n * n);
  for (int i = 0; i < n * n; ++i) {
    fa[i] = float((i * 7) % 11 - 5) / 4.0f;  // exact in bf16 and fp16
    fb[i] = float((i * 5) % 13 - 6) / 8.0f;
    fc[i] = float(i % 9) - 4.0f;
  }
  std::vector<__nv_bfloat16> ha(n * n), hb(n * n);
  for (int i = 0; i < n * n; ++i) {
    ha[i] = __float2bfloat16(fa[i]);
    hb[i] = __float2bfloat16(fb[i]);
  }
  auto* a = DeviceAlloc<__nv_bfloat16>(n * n);
  auto* b = DeviceAlloc<__nv_bfloat16>(n * n);
  float* c = DeviceAlloc<float>(n * n);
  Upload(a, ha);
  Upload(b, hb);
  Upload(c, fc);
  WmmaKernel<__nv_bfloat16><<<1, 32>>>(c, a, b);
  std::vector<float> got = Download(c, n * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      float want = 2.0f * fc[i * n + j];
      for (int k = 0; k < n; ++k) want += fa[i * n + k] * fb[j * n + k];  // b col-major: (k, j) at j*16 + k
      ASSERT_EQ(got[i * n + j], want) << i << "," << j;
    }
}

// What PTX documents for ldmatrix .m8n8.x4.b16: lane l receives, in r[i],
// row l / 4 of matrix i, columns 2 (l % 4) and 2 (l % 4) + 1 (the lower
// column in the low half); with .trans, column l / 4, rows 2 (l % 4) and
// 2 (l % 4) + 1. Element (matrix i, row r, column c) holds 64 i + 8 r + c.
TEST(EmulatorLibraries, LdMatrixGivesEachLaneThePtxDocumentedElements) {
  std::vector<uint16_t> hm(256);
  std::iota(hm.begin(), hm.end(), uint16_t{0});
  auto* m = DeviceAlloc<uint16_t>(256);
  auto* out = DeviceAlloc<uint32_t>(128);
  Upload(m, hm);
  for (bool trans : {false, true}) {
    for (int pad : {0, 8}) {
      if (trans) {
        LdMatrixKernel<true><<<1, 32>>>(out, m, pad);
      } else {
        LdMatrixKernel<false><<<1, 32>>>(out, m, pad);
      }
      const std::vector<uint32_t> got = Download(out, 128);
      for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i) {
          const int g = l / 4, t = l % 4;
          const uint32_t lo = trans ? 64 * i + 8 * (2 * t) + g : 64 * i + 8 * g + 2 * t;
          const uint32_t hi = trans ? lo + 8 : lo + 1;
          ASSERT_EQ(got[4 * l + i], lo | hi << 16) << "trans " << trans << " pad " << pad << " lane " << l << " r" << i;
        }
    }
  }
}

// mma.m16n8k16 with the fragments built by the documented layout gives
// C + A B, element for element (sums of exact products: inputs chosen so
// that every sum is exact in fp32).
template <typename T>
void CheckMmaFragments() {
  std::vector<float> fa(256), fb(128), fc(128);
  for (int i = 0; i < 256; ++i) fa[i] = float((i * 7) % 11 - 5) / 4.0f;
  for (int i = 0; i < 128; ++i) fb[i] = float((i * 5) % 13 - 6) / 8.0f;
  for (int i = 0; i < 128; ++i) fc[i] = float(i % 9) - 4.0f;
  std::vector<T> ha(256), hb(128);
  for (int i = 0; i < 256; ++i) ha[i] = dgca::cuda::FromF<T>(fa[i]);
  for (int i = 0; i < 128; ++i) hb[i] = dgca::cuda::FromF<T>(fb[i]);
  T* a = DeviceAlloc<T>(256);
  T* b = DeviceAlloc<T>(128);
  float* c = DeviceAlloc<float>(128);
  Upload(a, ha);
  Upload(b, hb);
  Upload(c, fc);
  MmaFragmentKernel<T><<<1, 32>>>(c, a, b);
  const std::vector<float> got = Download(c, 128);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      float want = fc[i * 8 + j];
      for (int k = 0; k < 16; ++k) want += fa[i * 16 + k] * fb[k * 8 + j];
      ASSERT_EQ(got[i * 8 + j], want) << i << "," << j;
    }
}
TEST(EmulatorLibraries, MmaM16N8K16ComputesTheDocumentedFragmentProduct) {
  CheckMmaFragments<__nv_bfloat16>();
  CheckMmaFragments<__half>();
}

// ------------------------------------------------------------------ faults
// Each runs in a child process: a device fault is sticky.
int DeadlockChild() {
  float* d = DeviceAlloc<float>(64);
  DeadlockKernel<<<1, 64>>>(d);
  const cudaError_t e = cudaDeviceSynchronize();
  const cudaError_t again = cudaMemset(d, 0, 4);  // sticky: later calls fail too
  return (e == cudaErrorLaunchFailure && again == cudaErrorLaunchFailure) ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, DeadlockIsAStickyFaultNamingTheSite) {
  EXPECT_EXIT(std::exit(DeadlockChild()), ::testing::ExitedWithCode(0),
              "device fault \\(cudaErrorLaunchFailure\\): kernel launched at .*emulator_test.cu:[0-9]+.*deadlock: 64 of 64 "
              "threads wait.*thread \\(0,0,0\\) at __shfl_xor_sync mask 0xffffffff; thread \\(1,0,0\\) at __syncthreads");
}

int ExitedLaneChild() {
  float* d = DeviceAlloc<float>(32);
  ExitedLaneShuffleKernel<<<1, 32>>>(d);
  return cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, ShuffleMaskNamingAnExitedLane) {
  EXPECT_EXIT(std::exit(ExitedLaneChild()), ::testing::ExitedWithCode(0), "names lane 3, which has exited");
}

int OutsideMaskChild() {
  int* d = DeviceAlloc<int>(32);
  ShuffleOutsideMaskKernel<<<1, 32>>>(d);
  return cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, ShuffleReadingALaneOutsideTheMask) {
  EXPECT_EXIT(std::exit(OutsideMaskChild()), ::testing::ExitedWithCode(0), "which is not in the mask");
}

int HostPointerArgChild() {
  static float host[4];
  WriteKernel<<<1, 4>>>(host, 4, 0.0f);
  return cudaDeviceSynchronize() == cudaErrorIllegalAddress ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, HostPointerPassedToAKernel) {
  EXPECT_EXIT(std::exit(HostPointerArgChild()), ::testing::ExitedWithCode(0),
              "argument 0 .* is neither device nor pinned host memory");
}

int WmmaMisalignedChild() {
  __half* a = DeviceAlloc<__half>(512);
  WmmaMisalignedKernel<<<1, 32>>>(a);
  return cudaDeviceSynchronize() == cudaErrorMisalignedAddress ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, WmmaPointerMustBe256BitAligned) {
  EXPECT_EXIT(std::exit(WmmaMisalignedChild()), ::testing::ExitedWithCode(0),
              "emulator_test.cu:[0-9]+: wmma::load_matrix_sync: the pointer is not 256-bit aligned");
}

int WmmaHalfWarpChild() {
  __half* a = DeviceAlloc<__half>(256);
  WmmaHalfWarpKernel<<<1, 32>>>(a);
  return cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, WmmaIsAWarpCollective) {
  EXPECT_EXIT(std::exit(WmmaHalfWarpChild()), ::testing::ExitedWithCode(0), "names lane 16, which has exited");
}

int LdMatrixMisalignedChild() {
  LdMatrixMisalignedKernel<<<1, 32>>>();
  return cudaDeviceSynchronize() == cudaErrorMisalignedAddress ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, LdMatrixRowAddressesMustBe16ByteAligned) {
  EXPECT_EXIT(std::exit(LdMatrixMisalignedChild()), ::testing::ExitedWithCode(0),
              "emulator_test.cu:[0-9]+: ldmatrix: a row address is not 16-byte aligned \\(lane 5\\)");
}

int LdMatrixDivergentChild() {
  LdMatrixDivergentKernel<<<1, 32>>>();
  return cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, LdMatrixLanesMustBeAtTheSameCall) {
  EXPECT_EXIT(std::exit(LdMatrixDivergentChild()), ::testing::ExitedWithCode(0),
              "emulator_test.cu:[0-9]+: ldmatrix.*: lane [0-9]+ is at a different mma/ldmatrix call than lane 0");
}

int MmaHalfWarpChild() {
  MmaHalfWarpKernel<<<1, 32>>>();
  return cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, MmaIsAWarpCollective) {
  EXPECT_EXIT(std::exit(MmaHalfWarpChild()), ::testing::ExitedWithCode(0), "names lane 16, which has exited");
}

TEST(EmulatorFaultsDeathTest, KernelWritingOnePastTheEndFaults) {
  // 1024 floats: the allocation ends exactly at the inaccessible page.
  EXPECT_DEATH(
      {
        float* d = DeviceAlloc<float>(1024);
        OffByOneKernel<<<4, 256 + 1>>>(d, 1024);
        cudaDeviceSynchronize();
      },
      "SIGSEGV while running kernel launched at .*emulator_test.cu:[0-9]+.*: address .* is 0 bytes past the end "
      "of a device allocation of 4096 bytes");
}

TEST(EmulatorFaultsDeathTest, HostCodeDereferencingDevicePointerFaults) {
  if (const char* p = std::getenv("DGCA_EMU_PROTECT"); p != nullptr && std::strcmp(p, "0") == 0)
    GTEST_SKIP() << "DGCA_EMU_PROTECT=0";
  EXPECT_DEATH(
      {
        float* d = DeviceAlloc<float>(16);
        volatile float x = d[3];
        (void)x;
      },
      "touched by HOST code");
}

struct Holder {
  float* p;
};
__global__ void ThroughStructKernel(Holder h) { h.p[threadIdx.x] = 1.0f; }

int FreedPointerArgChild() {
  float* d = DeviceAlloc<float>(16);
  cudaFree(d);
  WriteKernel<<<1, 16>>>(d, 16, 0.0f);
  return cudaDeviceSynchronize() == cudaErrorIllegalAddress ? 0 : 1;
}
TEST(EmulatorFaultsDeathTest, UseAfterFreeIsCaught) {
  // As a direct argument: at the launch.
  EXPECT_EXIT(std::exit(FreedPointerArgChild()), ::testing::ExitedWithCode(0),
              "neither device nor pinned host memory");
  // Hidden in a struct: at the access.
  EXPECT_DEATH(
      {
        float* d = DeviceAlloc<float>(16);
        cudaFree(d);
        ThroughStructKernel<<<1, 16>>>(Holder{d});
        cudaDeviceSynchronize();
      },
      "inside a FREED device allocation of 64 bytes .*: use after free");
}

TEST(EmulatorFaultsDeathTest, WriteIntoTheRoundingSlackIsReportedAtFree) {
  EXPECT_EXIT(
      {
        float* d = DeviceAlloc<float>(10);  // 40 bytes in a 256-byte granule
        OffByOneKernel<<<1, 32>>>(d, 10);
        cudaDeviceSynchronize();
        std::exit(cudaFree(d) == cudaErrorIllegalAddress ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "bytes after the end of a device allocation of 40 bytes were written");
}

}  // namespace
