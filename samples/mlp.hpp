// A small multi-layer perceptron (inputs -> hidden -> classes, ReLU, softmax
// cross-entropy), the synthetic data it learns and SGD, in plain loops.
//
// Everything is derived from seeds, so every rank builds the same initial
// weights and the same teacher without sending a byte, and data-parallel
// training keeps the weights bit-identical across ranks.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace ddp {

/// Independent, reproducible streams from one user seed: a different
/// `purpose` or `rank` gives an unrelated stream (splitmix64 finaliser).
inline std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t purpose, std::uint64_t rank = 0) {
  std::uint64_t z = seed ^ (purpose * 0x9e3779b97f4a7c15ull) ^ (rank * 0xbf58476d1ce4e5b9ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Shape {
  int inputs = 32;
  int hidden = 64;
  int classes = 10;
};

/// Labelled samples, row-major: x is size() x inputs.
struct Dataset {
  int inputs = 0;
  std::vector<float> x;
  std::vector<int> y;
  [[nodiscard]] int size() const noexcept { return static_cast<int>(y.size()); }
};

/// Loss summed over samples and correct predictions, to be averaged by the caller
/// (summing first keeps per-rank results additive across ranks).
struct Tally {
  double loss_sum = 0;
  long correct = 0;
  long count = 0;
  [[nodiscard]] double loss() const noexcept { return count ? loss_sum / static_cast<double>(count) : 0.0; }
  [[nodiscard]] double accuracy() const noexcept {
    return count ? static_cast<double>(correct) / static_cast<double>(count) : 0.0;
  }
};

/// A fixed random two-layer tanh network whose argmax is the label: a
/// non-linear task the student can learn but not trivially.
class Teacher {
public:
  Teacher(int inputs, int classes, std::uint64_t seed) : inputs_(inputs), classes_(classes) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Pre-activations of unit variance: tanh bends the class boundaries
    // without flattening them into a task too hard for a few seconds of SGD.
    const float scale1 = 1.0f / std::sqrt(static_cast<float>(inputs));
    w1_.resize(static_cast<std::size_t>(hidden_) * inputs);
    for (float& w : w1_) w = normal(rng) * scale1;
    w2_.resize(static_cast<std::size_t>(classes) * hidden_);
    for (float& w : w2_) w = normal(rng);
  }

  [[nodiscard]] int label(const float* x) const {
    std::array<float, hidden_> h;
    for (int j = 0; j < hidden_; ++j) {
      float a = 0;
      for (int k = 0; k < inputs_; ++k) a += w1_[j * inputs_ + k] * x[k];
      h[j] = std::tanh(a);
    }
    int best = 0;
    float best_logit = -INFINITY;
    for (int c = 0; c < classes_; ++c) {
      float a = 0;
      for (int j = 0; j < hidden_; ++j) a += w2_[c * hidden_ + j] * h[j];
      if (a > best_logit) best_logit = a, best = c;
    }
    return best;
  }

  /// `n` fresh samples: standard normal inputs labelled by the teacher.
  [[nodiscard]] Dataset sample(int n, std::uint64_t seed) const {
    Dataset d;
    d.inputs = inputs_;
    d.x.resize(static_cast<std::size_t>(n) * inputs_);
    d.y.resize(n);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : d.x) v = normal(rng);
    for (int i = 0; i < n; ++i) d.y[i] = label(&d.x[static_cast<std::size_t>(i) * inputs_]);
    return d;
  }

private:
  static constexpr int hidden_ = 16;
  int inputs_;
  int classes_;
  std::vector<float> w1_, w2_;
};

/// The student. Its parameters live in one flat buffer (w1, b1, w2, b2), so a
/// single allreduce averages every gradient and a single hash checks them all.
class Mlp {
public:
  Mlp(Shape s, std::uint64_t seed)
      : s_(s), params_(static_cast<std::size_t>(s.hidden) * (s.inputs + 1) +
                       static_cast<std::size_t>(s.classes) * (s.hidden + 1)),
        h_(s.hidden), p_(s.classes), dh_(s.hidden) {
    // PyTorch's nn.Linear default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)): small
    // initial logits, so the first loss is close to ln(classes).
    std::mt19937_64 rng(seed);
    auto fill = [&](float* p, std::size_t n, int fan_in) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
      std::uniform_real_distribution<float> u(-bound, bound);
      for (std::size_t i = 0; i < n; ++i) p[i] = u(rng);
    };
    fill(w1(params_.data()), static_cast<std::size_t>(s.hidden) * s.inputs, s.inputs);
    fill(b1(params_.data()), s.hidden, s.inputs);
    fill(w2(params_.data()), static_cast<std::size_t>(s.classes) * s.hidden, s.hidden);
    fill(b2(params_.data()), s.classes, s.hidden);
  }

  [[nodiscard]] const Shape& shape() const noexcept { return s_; }
  [[nodiscard]] std::span<float> params() noexcept { return params_; }
  [[nodiscard]] std::span<const float> params() const noexcept { return params_; }

  /// Adds the gradient of the mean loss over `n` samples to `grad` (zeroed
  /// first) and returns the batch's tally.
  Tally loss_and_grad(const float* x, const int* y, int n, std::span<float> grad) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    Tally t;
    const float inv_n = 1.0f / static_cast<float>(n);
    const float* P = params_.data();
    float* G = grad.data();
    for (int i = 0; i < n; ++i) {
      const float* xi = x + static_cast<std::size_t>(i) * s_.inputs;
      t.loss_sum += forward(xi, y[i], t);
      // d(loss)/d(logit c) = p_c - [c == y], scaled for the batch mean.
      for (int c = 0; c < s_.classes; ++c) p_[c] = (p_[c] - (c == y[i] ? 1.0f : 0.0f)) * inv_n;
      std::fill(dh_.begin(), dh_.end(), 0.0f);
      for (int c = 0; c < s_.classes; ++c) {
        const float d = p_[c];
        b2(G)[c] += d;
        float* gw = w2(G) + c * s_.hidden;
        const float* w = w2(P) + c * s_.hidden;
        for (int j = 0; j < s_.hidden; ++j) {
          gw[j] += d * h_[j];
          dh_[j] += d * w[j];
        }
      }
      for (int j = 0; j < s_.hidden; ++j) {
        if (h_[j] <= 0.0f) continue; // ReLU passes no gradient where it was off
        const float d = dh_[j];
        b1(G)[j] += d;
        float* gw = w1(G) + j * s_.inputs;
        for (int k = 0; k < s_.inputs; ++k) gw[k] += d * xi[k];
      }
    }
    return t;
  }

  /// Loss and accuracy over a dataset, without gradients.
  [[nodiscard]] Tally evaluate(const Dataset& d) {
    Tally t;
    for (int i = 0; i < d.size(); ++i) t.loss_sum += forward(&d.x[static_cast<std::size_t>(i) * s_.inputs], d.y[i], t);
    return t;
  }

  /// FNV-1a over the parameters' bytes: equal on every rank iff the weights
  /// are bit-identical, which is what data-parallel SGD promises.
  [[nodiscard]] std::uint64_t fingerprint() const noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (float v : params_) {
      std::uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      for (int b = 0; b < 4; ++b) h = (h ^ ((bits >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
    }
    return h;
  }

private:
  float* w1(float* p) const noexcept { return p; }
  float* b1(float* p) const noexcept { return p + static_cast<std::size_t>(s_.hidden) * s_.inputs; }
  float* w2(float* p) const noexcept { return b1(p) + s_.hidden; }
  float* b2(float* p) const noexcept { return w2(p) + static_cast<std::size_t>(s_.classes) * s_.hidden; }
  const float* w1(const float* p) const noexcept { return w1(const_cast<float*>(p)); }
  const float* b1(const float* p) const noexcept { return b1(const_cast<float*>(p)); }
  const float* w2(const float* p) const noexcept { return w2(const_cast<float*>(p)); }
  const float* b2(const float* p) const noexcept { return b2(const_cast<float*>(p)); }

  /// Fills h_ (hidden activations) and p_ (class probabilities) for one
  /// sample, counts it in `t` and returns its cross-entropy.
  double forward(const float* x, int y, Tally& t) {
    const float* P = params_.data();
    for (int j = 0; j < s_.hidden; ++j) {
      const float* w = w1(P) + j * s_.inputs;
      float a = b1(P)[j];
      for (int k = 0; k < s_.inputs; ++k) a += w[k] * x[k];
      h_[j] = a > 0.0f ? a : 0.0f;
    }
    float max_logit = -INFINITY;
    int best = 0;
    for (int c = 0; c < s_.classes; ++c) {
      const float* w = w2(P) + c * s_.hidden;
      float a = b2(P)[c];
      for (int j = 0; j < s_.hidden; ++j) a += w[j] * h_[j];
      p_[c] = a;
      if (a > max_logit) max_logit = a, best = c;
    }
    // Softmax shifted by the largest logit so exp() cannot overflow.
    float sum = 0;
    for (int c = 0; c < s_.classes; ++c) sum += p_[c] = std::exp(p_[c] - max_logit);
    for (int c = 0; c < s_.classes; ++c) p_[c] /= sum;
    ++t.count;
    if (best == y) ++t.correct;
    return -std::log(std::max(static_cast<double>(p_[y]), 1e-30));
  }

  Shape s_;
  std::vector<float> params_;
  std::vector<float> h_, p_, dh_; // per-sample scratch, reused: no allocation per step
};

/// SGD with (PyTorch-style) momentum: v = mu v + g; p -= lr v.
class Sgd {
public:
  Sgd(std::size_t n, float lr, float momentum) : lr_(lr), momentum_(momentum), velocity_(n, 0.0f) {}

  void step(std::span<float> params, std::span<const float> grad) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      velocity_[i] = momentum_ * velocity_[i] + grad[i];
      params[i] -= lr_ * velocity_[i];
    }
  }

private:
  float lr_;
  float momentum_;
  std::vector<float> velocity_;
};

/// Visits a rank's shard in a fresh order each epoch, one mini-batch at a
/// time, copied into contiguous buffers for the model.
class BatchSampler {
public:
  BatchSampler(const Dataset& d, int batch) : d_(d), batch_(batch), order_(d.size()),
      x_(static_cast<std::size_t>(batch) * d.inputs), y_(batch) {
    std::iota(order_.begin(), order_.end(), 0);
  }

  void shuffle(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::shuffle(order_.begin(), order_.end(), rng);
  }

  /// Batch `b` of this epoch (wraps around the shard).
  void load(int b) {
    for (int i = 0; i < batch_; ++i) {
      const int src = order_[(static_cast<std::size_t>(b) * batch_ + i) % order_.size()];
      std::memcpy(&x_[static_cast<std::size_t>(i) * d_.inputs], &d_.x[static_cast<std::size_t>(src) * d_.inputs],
                  sizeof(float) * d_.inputs);
      y_[i] = d_.y[src];
    }
  }

  [[nodiscard]] const float* x() const noexcept { return x_.data(); }
  [[nodiscard]] const int* y() const noexcept { return y_.data(); }
  [[nodiscard]] int size() const noexcept { return batch_; }

private:
  const Dataset& d_;
  int batch_;
  std::vector<int> order_;
  std::vector<float> x_;
  std::vector<int> y_;
};

} // namespace ddp
