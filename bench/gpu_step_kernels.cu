// The GPU half of bench_gpu_step: a stand-in training step (three SGEMMs and
// a loss reduction into device scalars), behind plain C++ functions so that
// the bench itself is compiled by the host compiler.
#include "bench/gpu_step_kernels.hpp"

#include <cuda_runtime.h>

namespace {

constexpr int tile = 32;

__global__ void sgemm(const float* a, const float* b, float* c, int n) {
  __shared__ float as[tile][tile];
  __shared__ float bs[tile][tile];
  const int row = blockIdx.y * tile + threadIdx.y;
  const int col = blockIdx.x * tile + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += tile) {
    as[threadIdx.y][threadIdx.x] = a[row * n + k0 + threadIdx.x];
    bs[threadIdx.y][threadIdx.x] = b[(k0 + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < tile; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
    __syncthreads();
  }
  c[row * n + col] = acc * (1.0f / static_cast<float>(n));
}

// loss = mean of squares, gnorm = max |x|, each into one device float.
__global__ void reduce_loss(const float* x, int count, float* loss, float* gnorm) {
  float sq = 0.0f, mx = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    sq += x[i] * x[i];
    mx = fmaxf(mx, fabsf(x[i]));
  }
  for (int off = 16; off > 0; off /= 2) {
    sq += __shfl_down_sync(0xffffffffu, sq, off);
    mx = fmaxf(mx, __shfl_down_sync(0xffffffffu, mx, off));
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(loss, sq / static_cast<float>(count));
    atomicMax(reinterpret_cast<int*>(gnorm), __float_as_int(mx)); // non-negative floats order as ints
  }
}

__global__ void fill(float* x, int count, float seed) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    x[i] = sinf(seed + 0.001f * static_cast<float>(i));
}

} // namespace

namespace bench_gpu {

bool Model::make(int size) {
  n = size;
  const std::size_t bytes = static_cast<std::size_t>(n) * n * sizeof(float);
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
      cudaMalloc(&c, bytes) != cudaSuccess || cudaMalloc(&d, bytes) != cudaSuccess ||
      cudaMalloc(&scalars, 2 * sizeof(float)) != cudaSuccess)
    return false;
  fill<<<256, 256>>>(a, n * n, 1.0f);
  fill<<<256, 256>>>(b, n * n, 2.0f);
  return cudaDeviceSynchronize() == cudaSuccess;
}

void Model::free() {
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(d);
  cudaFree(scalars);
}

void Model::step(void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const dim3 grid(n / tile, n / tile), block(tile, tile);
  sgemm<<<grid, block, 0, stream>>>(a, b, c, n);
  sgemm<<<grid, block, 0, stream>>>(c, b, d, n);
  sgemm<<<grid, block, 0, stream>>>(d, a, c, n);
  cudaMemsetAsync(scalars, 0, 2 * sizeof(float), stream);
  reduce_loss<<<132, 256, 0, stream>>>(c, n * n, scalars, scalars + 1);
}

} // namespace bench_gpu
