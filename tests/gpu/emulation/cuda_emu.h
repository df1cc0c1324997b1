// Host emulation of the CUDA features csrc/cuda/quantize.cu and norm.cu use (see run.sh): each thread block
// runs as blockDim std::threads; __shared__ becomes static; std::barrier stands in for
// __syncthreads and warp shuffles (every kernel reaches its barriers uniformly).
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

namespace emu {
inline thread_local dim3 tid, bid;
inline dim3 grid_dim, block_dim;
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<uint32_t> shfl;
inline bool error = false;
}  // namespace emu
#define threadIdx emu::tid
#define blockIdx emu::bid
#define blockDim emu::block_dim
#define gridDim emu::grid_dim

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
namespace emu {
/*! Every lane of the calling thread's warp publishes v; returns the value of lane src(lane). */
template <typename Src>
inline float warp_exchange(float v, Src src) {
  const unsigned t = threadIdx.x, warp = t / 32, lane = t % 32;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  shfl[t] = bits;
  warp_barriers[warp]->arrive_and_wait();
  const uint32_t other = shfl[warp * 32 + src(lane)];
  warp_barriers[warp]->arrive_and_wait();
  float r;
  std::memcpy(&r, &other, 4);
  return r;
}
}  // namespace emu
inline float __shfl_xor_sync(unsigned, float v, int offset) {
  return emu::warp_exchange(v, [offset](unsigned lane) { return lane ^ offset; });
}
// Out-of-range source lanes return the caller's own value, as on the device.
inline float __shfl_down_sync(unsigned, float v, unsigned delta) {
  return emu::warp_exchange(v, [delta](unsigned lane) { return lane + delta < 32 ? lane + delta : lane; });
}
inline float __shfl_sync(unsigned, float v, int src_lane) {
  return emu::warp_exchange(v, [src_lane](unsigned) { return static_cast<unsigned>(src_lane) % 32; });
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  std::atomic_ref<unsigned> a(*p);
  unsigned old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {}
  return old;
}

typedef void* cudaStream_t;
typedef int cudaError_t;
constexpr int cudaSuccess = 0;
inline cudaError_t cudaGetLastError() { return emu::error ? 1 : 0; }
inline const char* cudaGetErrorName(cudaError_t) { return "emu"; }
inline const char* cudaGetErrorString(cudaError_t) { return "emu"; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) { std::memset(p, v, n); return 0; }
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(dst, src, n);  // host emulation: "device" memory is host memory
  return 0;
}
inline cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int v, size_t w, size_t h, cudaStream_t) {
  if (w > pitch) return 1;
  for (size_t r = 0; r < h; ++r) std::memset(static_cast<char*>(p) + r * pitch, v, w);
  return 0;
}

namespace emu {
template <typename K>
auto launch(K kernel, unsigned grid, unsigned block, size_t, cudaStream_t) {
  return [=](auto... args) {
    if (grid == 0 || block == 0 || block > 1024 || (block > 32 && block % 32)) { error = true; return; }
    grid_dim = {grid, 1, 1};
    block_dim = {block, 1, 1};
    shfl.assign(block, 0);
    std::barrier<> bar(block), end(block);
    block_barrier = &bar;
    warp_barriers.clear();
    for (unsigned w = 0; w * 32 < block; ++w) warp_barriers.push_back(std::make_unique<std::barrier<>>(block < 32 ? block : 32));
    // Control flow around barriers is uniform in every kernel, so threads persist across blocks.
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t) {
      threads.emplace_back([&, t] {
        tid = {t, 0, 0};
        for (unsigned b = 0; b < grid; ++b) {
          bid = {b, 0, 0};
          kernel(args...);
          end.arrive_and_wait();
        }
      });
    }
    for (auto& th : threads) th.join();
  };
}
/*! 2-D / 3-D launches (dim3 grid and block): blocks in x-fastest order, threads of a block
 *  numbered x-fastest, warps of 32 consecutive numbers, as on a device. */
template <typename K>
auto launch(K kernel, dim3 grid, dim3 block, size_t, cudaStream_t) {
  return [=](auto... args) {
    const unsigned threads_per_block = block.x * block.y * block.z;
    const unsigned blocks = grid.x * grid.y * grid.z;
    if (blocks == 0 || threads_per_block == 0 || threads_per_block > 1024) { error = true; return; }
    grid_dim = grid;
    block_dim = block;
    shfl.assign(threads_per_block, 0);
    std::barrier<> bar(threads_per_block), end(threads_per_block);
    block_barrier = &bar;
    warp_barriers.clear();
    for (unsigned w = 0; w * 32 < threads_per_block; ++w)
      warp_barriers.push_back(std::make_unique<std::barrier<>>(threads_per_block < 32 ? threads_per_block : 32));
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < threads_per_block; ++t) {
      threads.emplace_back([&, t] {
        tid = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
        for (unsigned b = 0; b < blocks; ++b) {
          bid = {b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)};
          kernel(args...);
          end.arrive_and_wait();
        }
      });
    }
    for (auto& th : threads) th.join();
  };
}
}  // namespace emu
