// A stand-in training step on the GPU, for bench_gpu_step.
#pragma once

namespace bench_gpu {

struct Model {
  int n = 0;
  float *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
  float* scalars = nullptr; // [0] loss, [1] gnorm: device floats the step writes

  bool make(int size); // size: a multiple of 32
  void free();
  /// Three n x n SGEMMs and a reduction into `scalars`, enqueued on `stream`.
  void step(void* stream);
};

} // namespace bench_gpu
