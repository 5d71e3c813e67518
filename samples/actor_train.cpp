// actor_train: an orchestrator built on CAF, whose actors train and log.
//
// The process owns its caf::actor_system; chorus runs in it
// (<chorus/caf.hpp>). Three actors per rank work on a linear regression:
//   trainer    takes SGD steps on its shard of the data and logs `loss` and
//              `lr` at each step;
//   evaluator  gets the weights every `eval_every` steps and logs
//              `eval/loss` on held-out data, at the trainer's step;
//   loader     makes the batches, and logs `data/batches` every step.
// Each logs by request to the rank's proxy and goes on once the reply comes,
// that is once the run host has the values on disk: the replies pace the
// actors, nothing is dropped. Each actor is a stream of its own, so their
// explicit steps never clash.
//
//   chorus launch -n 4 -- build/bin/actor_train --steps 300
//   chorus show <run dir printed at the end>
#include <chorus/caf.hpp>

#include <caf/all.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using chorus::actors::log_atom;
using chorus::actors::open_atom;
using chorus::actors::rank_proxy;
using chorus::actors::Values;

using batch_atom = caf::atom_constant<caf::atom("batch")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;

constexpr int features = 8;
constexpr int batch_size = 32;

/// The model the data comes from: y = w_true . x + noise.
std::vector<double> true_weights() {
  std::vector<double> w(features);
  for (int i = 0; i < features; ++i) w[i] = std::sin(1.0 + i);
  return w;
}

struct Batch {
  std::vector<double> x; // batch_size * features
  std::vector<double> y;
};

Batch make_batch(std::mt19937_64& gen, const std::vector<double>& w) {
  std::normal_distribution<double> normal;
  Batch b;
  b.x.resize(batch_size * features);
  b.y.resize(batch_size);
  for (int i = 0; i < batch_size; ++i) {
    double y = 0;
    for (int j = 0; j < features; ++j) {
      b.x[i * features + j] = normal(gen);
      y += w[j] * b.x[i * features + j];
    }
    b.y[i] = y + 0.1 * normal(gen);
  }
  return b;
}

/// Mean squared error of `w` on `b`; adds its gradient to `grad` where given.
double mse(const std::vector<double>& w, const Batch& b, std::vector<double>* grad) {
  double loss = 0;
  for (int i = 0; i < batch_size; ++i) {
    double pred = 0;
    for (int j = 0; j < features; ++j) pred += w[j] * b.x[i * features + j];
    const double err = pred - b.y[i];
    loss += err * err / batch_size;
    if (grad)
      for (int j = 0; j < features; ++j) (*grad)[j] += 2 * err * b.x[i * features + j] / batch_size;
  }
  return loss;
}

/// Says why a log failed.
void report(caf::local_actor*, const char* who, const caf::error& e) {
  const chorus::Error why = chorus::actors::to_error(e);
  std::fprintf(stderr, "actor_train: the %s's log failed: %s\n", who, why.message().c_str());
}

/// (open_atom) from main: the actor opens its stream at the proxy, and
/// answers once it is open. Every actor opens before the trainer's first
/// step, so that none joins behind steps the rank already committed.
caf::result<caf::ok_atom> open_stream(caf::event_based_actor* self, const rank_proxy& proxy, const char* who) {
  auto rp = self->make_response_promise<caf::ok_atom>();
  self->request(proxy, caf::infinite, open_atom::value)
      .then([=](caf::ok_atom) mutable { rp.deliver(caf::ok_atom::value); },
            [=](const caf::error& e) mutable {
              report(self, who, e);
              rp.deliver(e);
            });
  return rp;
}

struct LoaderState {
  std::mt19937_64 gen;
  std::vector<double> w;
  static inline const char* name = "loader";
};

/// Answers (batch_atom, step) with a batch, and logs how many it made.
caf::behavior loader(caf::stateful_actor<LoaderState>* self, rank_proxy proxy, unsigned seed) {
  self->state.gen.seed(seed);
  self->state.w = true_weights();
  return {
      [=](open_atom) { return open_stream(self, proxy, "loader"); },
      [=](batch_atom, std::int64_t step) -> caf::result<std::vector<double>, std::vector<double>> {
        Batch b = make_batch(self->state.gen, self->state.w);
        // Logged without waiting: the trainer's own reply paces the loop.
        self->request(proxy, caf::infinite, log_atom::value, step, Values{{"data/batches", double(step + 1)}})
            .then([](caf::ok_atom) {}, [=](const caf::error& e) { report(self, "loader", e); });
        return {std::move(b.x), std::move(b.y)};
      },
  };
}

struct EvaluatorState {
  Batch held_out;
  static inline const char* name = "evaluator";
};

/// Logs `eval/loss` of the weights it is sent, at the step they come from.
caf::behavior evaluator(caf::stateful_actor<EvaluatorState>* self, rank_proxy proxy, unsigned seed) {
  std::mt19937_64 gen(seed);
  self->state.held_out = make_batch(gen, true_weights());
  return {
      [=](open_atom) { return open_stream(self, proxy, "evaluator"); },
      [=](eval_atom, std::int64_t step, const std::vector<double>& w) -> caf::result<caf::ok_atom> {
        auto rp = self->make_response_promise<caf::ok_atom>();
        const double loss = mse(w, self->state.held_out, nullptr);
        self->request(proxy, caf::infinite, log_atom::value, step, Values{{"eval/loss", loss}})
            .then([=](caf::ok_atom) mutable { rp.deliver(caf::ok_atom::value); },
                  [=](const caf::error& e) mutable {
                    report(self, "evaluator", e);
                    rp.deliver(e);
                  });
        return rp;
      },
  };
}

struct TrainerState {
  std::vector<double> w = std::vector<double>(features, 0.0);
  std::int64_t step = 0;
  std::int64_t steps = 0;
  int eval_every = 50;
  bool failed = false;
  static inline const char* name = "trainer";
};

/// One SGD step per (step_atom): fetch a batch, update, log, go on once logged.
caf::behavior trainer(caf::stateful_actor<TrainerState>* self, rank_proxy proxy, caf::actor load, caf::actor eval,
                      std::int64_t steps) {
  self->state.steps = steps;
  return {
      [=](open_atom) { return open_stream(self, proxy, "trainer"); },
      [=](step_atom) {
        auto& st = self->state;
        if (st.step >= st.steps) {
          self->quit();
          return;
        }
        self->request(load, caf::infinite, batch_atom::value, st.step)
            .then([=](std::vector<double>& x, std::vector<double>& y) {
              auto& st = self->state;
              const Batch b{std::move(x), std::move(y)};
              std::vector<double> grad(features, 0.0);
              const double lr = 0.05 / (1.0 + st.step / 100.0);
              const double loss = mse(st.w, b, &grad);
              for (int j = 0; j < features; ++j) st.w[j] -= lr * grad[j];
              const std::int64_t step = st.step++;
              if (step % st.eval_every == 0 || st.step == st.steps)
                self->request(eval, caf::infinite, eval_atom::value, step, st.w)
                    .then([](caf::ok_atom) {}, [=](const caf::error&) { self->quit(); });
              self->request(proxy, caf::infinite, log_atom::value, step, Values{{"loss", loss}, {"lr", lr}})
                  .then([=](caf::ok_atom) { self->send(self, step_atom::value); },
                        [=](const caf::error& e) {
                          report(self, "trainer", e);
                          self->state.failed = true;
                          self->quit(e);
                        });
            });
      },
  };
}

} // namespace

int main(int argc, char** argv) {
  std::int64_t steps = 300;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::strtoll(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: actor_train [--steps N]\n");
      return 2;
    }
  }
  if (steps <= 0) {
    std::fprintf(stderr, "actor_train: --steps must be positive\n");
    return 2;
  }

  caf::actor_system_config cfg;
  chorus::Options opts;
  opts.project = "actor-train";
  opts.mode = chorus::Mode::shared; // one run that every rank logs into
  if (chorus::Error e = chorus::actors::configure(cfg, opts)) {
    std::fprintf(stderr, "actor_train: %s\n", e.message().c_str());
    return 1;
  }
  caf::actor_system sys{cfg};
  chorus::Error err;
  chorus::Run run = chorus::actors::init(sys, opts, err);
  if (err) {
    std::fprintf(stderr, "actor_train: %s\n", err.message().c_str());
    return 1;
  }
  const int rank = run.topology().rank;
  if (run) {
    (void)run.define_metric("loss", chorus::Reduce::mean);
    (void)run.define_metric("eval/loss", chorus::Reduce::mean);
    (void)run.define_metric("lr", chorus::Reduce::first);
    (void)run.define_metric("data/batches", chorus::Reduce::sum);
    (void)run.config({{"features", std::to_string(features)}, {"batch_size", std::to_string(batch_size)},
                      {"steps", std::to_string(steps)}});
  }
  const rank_proxy proxy = chorus::actors::proxy(run);
  int code = 0;
  if (proxy) {
    caf::scoped_actor self{sys};
    const auto seed = static_cast<unsigned>(1000 + rank);
    auto load = sys.spawn(loader, proxy, seed);
    auto eval = sys.spawn(evaluator, proxy, seed + 500);
    auto train = sys.spawn(trainer, proxy, load, eval, steps);
    // Every actor opens its stream before any of them logs (see <chorus/caf.hpp>).
    bool opened = true;
    for (const caf::actor& who : {load, eval, train})
      self->request(who, caf::infinite, open_atom::value).receive([](caf::ok_atom) {}, [&](const caf::error&) {
        opened = false;
      });
    if (opened) self->send(train, step_atom::value);
    else self->send_exit(train, caf::exit_reason::user_shutdown);
    self->wait_for(train);
    self->send_exit(load, caf::exit_reason::user_shutdown);
    self->send_exit(eval, caf::exit_reason::user_shutdown);
    self->wait_for(load, eval);
  }
  const chorus::FinishResult r = run.finish().wait();
  if (r.error) {
    std::fprintf(stderr, "actor_train: finish: %s\n", r.error.message().c_str());
    code = 1;
  }
  if (run.is_host())
    std::printf("actor_train: run %s in %s: %lld steps, %llu rows rejected\n", r.run_id.c_str(), r.run_dir.c_str(),
                static_cast<long long>(steps), static_cast<unsigned long long>(r.rejected));
  return code;
}
