// ddp_train — data-parallel training of a small MLP on CPU, logged with chorus.
//
// Every rank holds the same model, trains on its own shard of synthetic data,
// averages gradients with Gloo's allreduce every step and applies the same
// update, as PyTorch's DistributedDataParallel does. All ranks log into one
// shared chorus run: loss and accuracy are averaged across ranks by chorus,
// throughput is kept per rank, and each epoch ends on a chorus barrier.
//
//   chorus launch -n 4 -- build/bin/ddp_train --epochs 10
//   build/bin/ddp_train                      # one process, world size 1
#include "mlp.hpp"
#include "process_group.hpp"

#include <chorus/chorus.hpp>

#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <unistd.h>

namespace {

struct Args {
  int epochs = 10;
  int steps_per_epoch = 50;
  int batch = 128; // per rank
  double lr = 0.1;
  double momentum = 0.9;
  int hidden = 64;
  int val_size = 2048; // per rank
  int log_every = 10;  // steps between samples_per_sec values
  std::uint64_t seed = 1;
  std::string project = "chorus-demo";
  std::string iface;
  std::string store_dir;
  int gloo_timeout_s = 60;
};

constexpr const char* usage_text = R"(usage: ddp_train [options]

Data-parallel training of a small MLP (32 -> hidden -> 10) on synthetic data,
gradients averaged with Gloo, metrics logged into one shared chorus run.
Run it under a launcher (chorus launch -n 4 -- ddp_train, torchrun, or
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT by hand), or alone as world size 1.

options:
  --epochs N            epochs (default 10)
  --steps-per-epoch N   optimizer steps per epoch (default 50)
  --batch N             mini-batch per rank (default 128)
  --lr X                learning rate (default 0.1)
  --momentum X          SGD momentum, 0 for plain SGD (default 0.9)
  --hidden N            hidden units (default 64)
  --val-size N          held-out samples per rank (default 2048)
  --log-every N         steps between samples_per_sec values (default 10)
  --seed N              seed of the model, teacher and shards (default 1)
  --project NAME        chorus project (default chorus-demo)
  --iface NAME          network interface for Gloo (default: $GLOO_SOCKET_IFNAME,
                        else 127.0.0.1 on one node, this host's name on several)
  --store-dir DIR       Gloo rendezvous directory; must be shared by all nodes
                        (default: $TMPDIR, else /tmp)
  --gloo-timeout S      seconds a Gloo rendezvous or collective may wait (default 60)
  -h, --help            this text
)";

template <class T>
bool parse_number(std::string_view s, T& out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && ptr == s.data() + s.size();
}

enum class Parsed { ok, help, bad };

Parsed parse_args(int argc, char** argv, Args& a) {
  auto bad = [](std::string_view what) {
    std::fprintf(stderr, "ddp_train: %.*s\n\n%s", static_cast<int>(what.size()), what.data(), usage_text);
    return Parsed::bad;
  };
  for (int i = 1; i < argc; ++i) {
    std::string_view opt = argv[i];
    if (opt == "-h" || opt == "--help") return Parsed::help;
    std::string_view value;
    if (auto eq = opt.find('='); opt.starts_with("--") && eq != std::string_view::npos) {
      value = opt.substr(eq + 1);
      opt = opt.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return bad("missing value for " + std::string(opt));
    }
    auto positive = [&](int& out) { return parse_number(value, out) && out > 0; };
    bool ok = true;
    if (opt == "--epochs") ok = positive(a.epochs);
    else if (opt == "--steps-per-epoch") ok = positive(a.steps_per_epoch);
    else if (opt == "--batch") ok = positive(a.batch);
    else if (opt == "--hidden") ok = positive(a.hidden);
    else if (opt == "--val-size") ok = positive(a.val_size);
    else if (opt == "--log-every") ok = positive(a.log_every);
    else if (opt == "--gloo-timeout") ok = positive(a.gloo_timeout_s);
    else if (opt == "--lr") ok = parse_number(value, a.lr) && a.lr > 0;
    else if (opt == "--momentum") ok = parse_number(value, a.momentum) && a.momentum >= 0 && a.momentum < 1;
    else if (opt == "--seed") ok = parse_number(value, a.seed);
    else if (opt == "--project") a.project = value, ok = !value.empty();
    else if (opt == "--iface") a.iface = value, ok = !value.empty();
    else if (opt == "--store-dir") a.store_dir = value, ok = !value.empty();
    else return bad("unknown option " + std::string(opt));
    if (!ok) return bad("bad value '" + std::string(value) + "' for " + std::string(opt));
  }
  return Parsed::ok;
}

std::string env_or(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

/// Names this launch in the rendezvous directory: torchrun's run id (unless
/// it is torchrun's default "none") or the launcher's job id, and the port.
std::string job_key(const chorus::Topology& topo) {
  std::string id = env_or("TORCHELASTIC_RUN_ID", "");
  if (id.empty() || id == "none") id = topo.job_id.empty() ? "job" : topo.job_id;
  std::string key = id + "-" + std::to_string(topo.master_port);
  for (char& c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return key;
}

ddp::GroupOptions group_options(const Args& a, const chorus::Topology& topo) {
  ddp::GroupOptions g;
  g.store_dir = a.store_dir.empty() ? env_or("TMPDIR", "/tmp") : a.store_dir;
  g.job_key = job_key(topo);
  g.iface = a.iface.empty() ? env_or("GLOO_SOCKET_IFNAME", "") : a.iface;
  if (g.iface.empty() && topo.num_nodes > 1) {
    // Peers on other nodes must reach us: bind to what this host's name resolves to.
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    g.host = host;
  } else {
    g.host = "127.0.0.1";
  }
  g.timeout = std::chrono::seconds(a.gloo_timeout_s);
  return g;
}

void report(const chorus::Topology& topo, std::string_view what, const chorus::Error& e) {
  const std::string_view code = chorus::to_string(e.code());
  std::fprintf(stderr, "ddp_train: rank %d: %.*s failed (%.*s): %s\n", topo.rank, static_cast<int>(what.size()),
               what.data(), static_cast<int>(code.size()), code.data(), e.message().c_str());
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Purposes of the seed streams: one per thing drawn at random.
enum Stream : std::uint64_t { model_stream = 1, teacher_stream, train_stream, val_stream, shuffle_stream };

chorus::task<int> train(const Args& args) {
  chorus::Error error;
  const chorus::Topology topo = chorus::detect_topology(error);
  if (error) {
    report(topo, "reading the launcher's environment", error);
    co_return 1;
  }
  const bool lead = topo.rank == 0;
  const int world = topo.world_size;

  // The training's own collectives come first: if peers cannot be reached
  // there is nothing to log.
  std::unique_ptr<ddp::ProcessGroup> group;
  try {
    group = std::make_unique<ddp::ProcessGroup>(topo.rank, world, group_options(args, topo));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train: rank %d: Gloo rendezvous failed: %s\n", topo.rank, e.what());
    co_return 1;
  }

  chorus::Options opt;
  opt.project = args.project;
  opt.mode = chorus::Mode::shared; // every rank writes into one run hosted by rank 0
  opt.topology = topo;
  chorus::Run run = chorus::init(opt, error);
  if (error) {
    report(topo, "chorus::init", error);
    co_return 1;
  }

  const ddp::Shape shape{32, args.hidden, 10};
  // Tickets are trivially destructible and the braced Field lists die at the
  // end of each statement, before any co_await: GCC 12 destroys a non-trivial
  // temporary that lives across a co_await twice.
  const std::array<chorus::Pending, 6> setup = {
      run.config({{"model", "mlp"},
                  {"inputs", shape.inputs},
                  {"hidden", shape.hidden},
                  {"classes", shape.classes},
                  {"epochs", args.epochs},
                  {"steps_per_epoch", args.steps_per_epoch},
                  {"batch_per_rank", args.batch},
                  {"global_batch", args.batch * world},
                  {"lr", args.lr},
                  {"momentum", args.momentum},
                  {"seed", args.seed},
                  {"world_size", world},
                  {"collective", "gloo allreduce (tcp)"}}),
      run.define_metric("loss", chorus::Reduce::mean),
      run.define_metric("accuracy", chorus::Reduce::mean),
      run.define_metric("val_loss", chorus::Reduce::mean),
      run.define_metric("val_accuracy", chorus::Reduce::mean),
      // Rank 0 logs the learning rate alone (every rank holds the same one):
      // declared first, it is the column lr; undeclared, it would be lr/rank-0.
      run.define_metric("lr", chorus::Reduce::first),
  };
  // samples_per_sec gets no reduction: each rank's value lands as
  // samples_per_sec/rank-N (plain in a run of one rank), which shows a
  // straggler at a glance.
  int failures = 0;
  for (chorus::Pending p : setup) {
    chorus::Error e = co_await p;
    if (e) {
      report(topo, "run setup", e);
      ++failures;
    }
  }

  // Same seed for model and teacher on every rank; the shards differ by rank.
  ddp::Mlp model(shape, ddp::stream_seed(args.seed, model_stream));
  const ddp::Teacher teacher(shape.inputs, shape.classes, ddp::stream_seed(args.seed, teacher_stream));
  const ddp::Dataset shard =
      teacher.sample(args.steps_per_epoch * args.batch, ddp::stream_seed(args.seed, train_stream, topo.rank));
  const ddp::Dataset held_out = teacher.sample(args.val_size, ddp::stream_seed(args.seed, val_stream, topo.rank));
  ddp::Sgd sgd(model.params().size(), static_cast<float>(args.lr), static_cast<float>(args.momentum));
  ddp::BatchSampler batches(shard, args.batch);
  std::vector<float> grad(model.params().size());

  if (lead) {
    const std::string_view id = run.id();
    std::printf("ddp_train: %d rank(s), %zu parameters, global batch %d, run %.*s\n", world, model.params().size(),
                args.batch * world, static_cast<int>(id.size()), id.data());
  }

  // Built once and refilled every step: logging allocates nothing.
  std::array<chorus::Metric, 3> row = {{{"loss", 0}, {"accuracy", 0}, {"samples_per_sec", 0}}};
  chorus::Pending last_log;
  double final_val_accuracy = 0, final_val_loss = 0;
  const Clock::time_point started = Clock::now();

  try {
    for (int epoch = 0; epoch < args.epochs; ++epoch) {
      batches.shuffle(ddp::stream_seed(ddp::stream_seed(args.seed, shuffle_stream, topo.rank), epoch));
      ddp::Tally epoch_tally;
      const Clock::time_point epoch_start = Clock::now();
      Clock::time_point window_start = epoch_start;
      std::int64_t step = 0;

      for (int s = 0; s < args.steps_per_epoch; ++s) {
        step = std::int64_t(epoch) * args.steps_per_epoch + s;
        batches.load(s);
        const ddp::Tally t = model.loss_and_grad(batches.x(), batches.y(), batches.size(), grad);
        group->average(grad); // the data-parallel step: every rank now holds the global gradient
        sgd.step(model.params(), grad);
        epoch_tally.loss_sum += t.loss_sum, epoch_tally.correct += t.correct, epoch_tally.count += t.count;

        row[0].value = t.loss();
        row[1].value = t.accuracy();
        std::size_t n = 2;
        if ((s + 1) % args.log_every == 0) {
          row[2].value = double(args.log_every) * args.batch / seconds_since(window_start);
          window_start = Clock::now();
          n = 3;
        }
        last_log = run.log(std::span<const chorus::Metric>(row.data(), n), {.step = step});
      }
      const double epoch_seconds = seconds_since(epoch_start);

      // Held-out validation on each rank's own slice; chorus averages it.
      const ddp::Tally val = model.evaluate(held_out);
      const chorus::Pending val_log =
          run.log({{"val_loss", val.loss()}, {"val_accuracy", val.accuracy()}}, {.step = step});
      if (lead) run.log({{"lr", args.lr}}, {.step = step});

      // Global figures for the console (chorus reduces the logged ones itself).
      std::array<double, 7> totals = {epoch_tally.loss_sum, double(epoch_tally.correct), double(epoch_tally.count),
                                      val.loss_sum,         double(val.correct),         double(val.count),
                                      double(epoch_tally.count) / epoch_seconds};
      group->sum(totals);
      final_val_loss = totals[3] / totals[5];
      final_val_accuracy = totals[4] / totals[5];
      // Every rank learns the verdict; one of them says it.
      if (!group->all_equal(model.fingerprint())) {
        if (lead) std::fprintf(stderr, "ddp_train: weights differ across ranks after epoch %d\n", epoch);
        ++failures;
      }
      if (lead)
        std::printf("epoch %3d  loss %.4f  acc %.3f  val_loss %.4f  val_acc %.3f  %8.0f samples/s  (%.1f s)\n",
                    epoch, totals[0] / totals[2], totals[1] / totals[2], final_val_loss, final_val_accuracy,
                    totals[6], seconds_since(started));
      std::fflush(stdout);

      // Bind the name first: a std::string temporary must not live across co_await.
      const std::string barrier_name = "epoch-" + std::to_string(epoch);
      const chorus::Error reached = co_await run.barrier(barrier_name);
      if (reached) {
        // Training goes on: the logging's trouble is not the model's. The
        // rows still pending are settled by finish().
        report(topo, barrier_name + " barrier", reached);
        ++failures;
        continue;
      }
      // A passed barrier has committed everything logged before it, so these
      // tickets are complete: their results say whether the rows were taken.
      const chorus::Error logged = co_await last_log;
      const chorus::Error validated = co_await val_log;
      for (const chorus::Error* e : {&logged, &validated})
        if (*e) {
          report(topo, "log", *e);
          ++failures;
        }
    }
  } catch (const std::exception& ex) {
    // A collective failed (a peer died or timed out): stop training, but still
    // finish the run below so what was logged is committed.
    std::fprintf(stderr, "ddp_train: rank %d: training stopped: %s\n", topo.rank, ex.what());
    ++failures;
  }

  if (lead) {
    const chorus::Pending summarized =
        run.summary({{"final_val_accuracy", final_val_accuracy}, {"final_val_loss", final_val_loss}});
    const chorus::Error e = co_await summarized;
    if (e) {
      report(topo, "summary", e);
      ++failures;
    }
  }

  const chorus::FinishResult result = co_await run.finish();
  if (result.error) {
    report(topo, "finish", result.error);
    ++failures;
  }
  if (result.dropped || result.rejected)
    std::fprintf(stderr, "ddp_train: rank %d: %llu values dropped, %llu rejected by the run host\n", topo.rank,
                 static_cast<unsigned long long>(result.dropped), static_cast<unsigned long long>(result.rejected));
  if (lead) {
    const std::string_view state = chorus::to_string(result.state);
    std::printf("run %s %.*s: %llu rows, %d rank(s), %.1f s\n  %s\n", result.run_id.c_str(),
                static_cast<int>(state.size()), state.data(), static_cast<unsigned long long>(result.rows), world,
                seconds_since(started), result.run_dir.c_str());
    for (const chorus::RankResult& r : result.ranks)
      if (r.state != chorus::RunState::finished)
        std::printf("  rank %d %s at step %lld: %s\n", r.rank, std::string(chorus::to_string(r.state)).c_str(),
                    static_cast<long long>(r.last_step), r.message.c_str());
  }
  co_return failures ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  Args args;
  switch (parse_args(argc, argv, args)) {
  case Parsed::help: std::fputs(usage_text, stdout); return 0;
  case Parsed::bad: return 2;
  case Parsed::ok: break;
  }
  try {
    return chorus::sync_wait(train(args));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train: %s\n", e.what());
    return 1;
  }
}
