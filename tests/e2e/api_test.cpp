// The public API in one process: tickets, coroutines, bad input.
#define BOOST_TEST_MODULE e2e_api
#include "local_run.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <utility>

using namespace e2e;

namespace {

chorus::Options local_options(const TempDir& dir) { return e2e::local_options(dir, "api"); }

/// Finishes `run` and reads back its history, which must hold `rows` rows.
std::vector<Row> finish_and_read(chorus::Run& run, std::size_t rows) {
  const chorus::FinishResult r = run.finish().wait();
  BOOST_TEST(!r.error, r.error.message());
  std::vector<Row> out = read_history(r.run_dir);
  BOOST_REQUIRE_EQUAL(out.size(), rows);
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE(inactive_handle_is_a_cheap_no_op) {
  chorus::Run run;
  BOOST_TEST(!run);
  BOOST_TEST(!run.log({{"loss", 1.0}}).wait());
  BOOST_TEST(run.log({{"loss", 1.0}}).ready());
  BOOST_TEST(!run.barrier("x").wait());
  BOOST_TEST(!run.log_artifact("model.pt", "/nonexistent/model.pt").wait());
  auto r = run.finish().wait();
  BOOST_TEST(!r.error);
}

BOOST_AUTO_TEST_CASE(an_inactive_handle_knows_where_its_process_sits) {
  TempDir dir;
  chorus::Options opt = local_options(dir);
  opt.mode = chorus::Mode::automatic; // only global rank 0 logs
  opt.topology = chorus::Topology{.rank = 3,
                                  .local_rank = 1,
                                  .world_size = 4,
                                  .local_world_size = 2,
                                  .node_rank = 1,
                                  .num_nodes = 2,
                                  .master_addr = "10.0.0.1",
                                  .master_port = 6000,
                                  .launcher = "torchrun",
                                  .job_id = "j7"};
  chorus::Run run = chorus::init(opt);
  BOOST_TEST(!run);
  const chorus::Topology& t = run.topology();
  BOOST_TEST(t.rank == 3);
  BOOST_TEST(t.local_rank == 1);
  BOOST_TEST(t.world_size == 4);
  BOOST_TEST(t.node_rank == 1);
  BOOST_TEST(t.job_id == "j7");
  chorus::Run moved;
  moved = std::move(run);
  BOOST_TEST(moved.topology().rank == 3);
  // A handle init did not make answers with the launcher's view of this process.
  chorus::Error e;
  const chorus::Topology here = chorus::detect_topology(e);
  chorus::Run none;
  BOOST_TEST(none.topology().rank == here.rank);
  BOOST_TEST(none.topology().world_size == here.world_size);
}

BOOST_AUTO_TEST_CASE(a_forked_child_sees_the_inherited_run_as_inactive) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  BOOST_REQUIRE(run);
  std::fflush(stdout);
  const pid_t child = ::fork();
  // In the child the run is the parent's: false, while its topology still answers.
  if (child == 0) ::_exit(!run && run.topology().world_size == 1 ? 0 : 1);
  BOOST_REQUIRE(child > 0);
  int status = 0;
  BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "the child saw a live run (status " << status << ")");
  BOOST_TEST(bool(run)); // the parent's is its own
  BOOST_TEST(!run.finish().wait().error);
}

namespace {
/// How many of this process's open files are epoll instances (an event loop's).
int event_loops() {
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(f.path(), ec).string() == "anon_inode:[eventpoll]") ++n;
  }
  return n;
}
} // namespace

// A run of this process alone links to no other: it starts no middleman
// (CAF's network layer: its event loop, its thread, its look at the
// machine's network interfaces), which a run of several ranks needs.
BOOST_AUTO_TEST_CASE(a_run_of_one_process_starts_no_network_layer) {
  TempDir dir;
  const int before = event_loops();
  chorus::Run run = chorus::init(local_options(dir));
  BOOST_REQUIRE(run);
  BOOST_TEST(event_loops() == before);
  BOOST_TEST(!run.log({{"loss", 1.0}}).wait());
  BOOST_TEST(!run.finish().wait().error);
}

namespace {
/// The ids of this process's threads named `name`.
std::set<std::string> threads_named(const std::string& name) {
  std::set<std::string> out;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(t.path() / "comm");
    std::string n;
    if (std::getline(comm, n) && n == name) out.insert(t.path().filename().string());
  }
  return out;
}

/// `child`'s wait status, waited for at most 60 s; none where it had not
/// ended by then (it is killed).
std::optional<int> wait_bounded(pid_t child) {
  int status = 0;
  pid_t got = 0;
  for (int i = 0; i < 600 && got == 0; ++i) {
    got = ::waitpid(child, &status, WNOHANG);
    if (got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (got != 0) return status;
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  return std::nullopt;
}

/// Whether `child` exited with 0 within 60 s.
bool exited_cleanly(pid_t child) {
  const std::optional<int> status = wait_bounded(child);
  return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

/// One value logged into a new run of this process, and the run finished: the rows it holds.
std::uint64_t one_run(const TempDir& dir, std::set<std::string>* workers = nullptr) {
  chorus::Run run = chorus::init(local_options(dir));
  if (!run || run.log({{"loss", 1.0}}).wait()) return 0;
  if (workers != nullptr) *workers = threads_named("caf.multiplexer"); // CAF's scheduler threads
  const chorus::FinishResult r = run.finish().wait();
  return r.error ? 0 : r.rows;
}
} // namespace

// The runs of one process share an actor system that the process keeps:
// after the first, a run's start and end make and join no scheduler thread.
BOOST_AUTO_TEST_CASE(later_runs_of_one_process_keep_its_scheduler_threads) {
  TempDir dir;
  std::set<std::string> first;
  BOOST_REQUIRE_EQUAL(one_run(dir, &first), 1u);
  BOOST_REQUIRE(!first.empty());
  for (int i = 0; i < 3; ++i) {
    std::set<std::string> now;
    BOOST_TEST(one_run(dir, &now) == 1u);
    BOOST_TEST((now == first), "run " << i + 2 << " ran on scheduler threads of its own");
  }
}

#if defined(__SANITIZE_THREAD__)
constexpr bool under_tsan = true; // which cannot start threads in a fork's child of a process with threads
#else
constexpr bool under_tsan = false;
#endif

// A fork's child has none of its parent's threads, so not the actor system
// its parent keeps: its runs start one of their own, and work.
BOOST_AUTO_TEST_CASE(a_forked_child_of_a_process_that_ran_runs_starts_runs_of_its_own,
                     *boost::unit_test::enable_if<!under_tsan>()) {
  TempDir dir;
  BOOST_REQUIRE_EQUAL(one_run(dir), 1u); // the parent now keeps its system
  const pid_t child = ::fork();
  if (child == 0) ::_exit(one_run(dir) == 1 && one_run(dir) == 1 ? 0 : 1);
  BOOST_REQUIRE(child > 0);
  // Bounded: a child stuck on its parent's system (no threads) would hang.
  const std::optional<int> status = wait_bounded(child);
  if (!status) BOOST_FAIL("the forked child's runs did not end within 60 s");
  BOOST_TEST((WIFEXITED(*status) && WEXITSTATUS(*status) == 0), "the child's runs failed (status " << *status << ")");
  BOOST_TEST(one_run(dir) == 1u); // and the parent's system still serves the parent
}

// A process's first run makes its actor system on a thread of its own
// after init returned, under the lock of the system the process keeps: a
// child forked the moment init returns (a data loader's worker) must not
// inherit that lock held, and starts runs of its own.
BOOST_AUTO_TEST_CASE(a_child_forked_while_the_first_run_starts_its_actors_starts_runs_of_its_own,
                     *boost::unit_test::enable_if<!under_tsan>()) {
  TempDir dir;
  const pid_t child = ::fork(); // a process whose runs have made no actor system yet
  if (child == 0) {
    chorus::Error err;
    chorus::Run run = chorus::init(local_options(dir), err);
    const pid_t grandchild = ::fork();
    if (grandchild == 0) ::_exit(one_run(dir) == 1 && one_run(dir) == 1 ? 0 : 1);
    const bool mine = !err && run && !run.log({{"loss", 1.0}}).wait() && run.finish().wait().rows == 1u;
    ::_exit(grandchild > 0 && exited_cleanly(grandchild) && mine ? 0 : 1);
  }
  BOOST_REQUIRE(child > 0);
  BOOST_TEST(exited_cleanly(child), "the child's or the grandchild's runs failed or hung");
}

BOOST_AUTO_TEST_CASE(log_wait_finish_writes_the_run_directory) {
  TempDir dir;
  fs::path rd;
  {
    chorus::Run run = chorus::init(local_options(dir));
    BOOST_REQUIRE(run);
    BOOST_TEST(run.is_host());
    run.define_metric("loss", chorus::Reduce::mean);
    run.config({{"lr", 1e-3}, {"layers", 4}, {"opt", "adam"}, {"nesterov", true}});
    for (int s = 0; s < 100; ++s) run.log({{"loss", 1.0 / (s + 1)}, {"acc", s / 100.0}});
    BOOST_TEST(!run.log({{"extra", 7.0}}, {.step = 99}).wait());
    run.summary({{"best", 0.99}});
    chorus::FinishResult r = run.finish().wait();
    BOOST_TEST(!r.error, r.error.message());
    BOOST_TEST((r.state == chorus::RunState::finished));
    BOOST_TEST(r.rows == 100u);
    BOOST_TEST(r.run_id == std::string(run.id()));
    rd = r.run_dir;
  }
  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), 100u);
  for (std::size_t s = 0; s < rows.size(); ++s) {
    BOOST_TEST(rows[s].step() == static_cast<std::int64_t>(s));
    BOOST_TEST(rows[s].num.at("loss") == 1.0 / (s + 1));
  }
  BOOST_TEST(rows[99].num.at("extra") == 7.0);
  const std::string summary = slurp(rd / "summary.json");
  BOOST_TEST(summary.find("\"best\":0.99") != std::string::npos);
  BOOST_TEST(summary.find("\"acc\":0.99") != std::string::npos); // last value of a history key
  const std::string config = slurp(rd / "config.json");
  BOOST_TEST(config.find("\"opt\":\"adam\"") != std::string::npos);
  BOOST_TEST(config.find("\"layers\":4") != std::string::npos);
  BOOST_TEST(((fs::status(rd).permissions() & fs::perms::all) == fs::perms::owner_all));
  BOOST_TEST(((fs::status(rd / "history.jsonl").permissions() & fs::perms::all) ==
              (fs::perms::owner_read | fs::perms::owner_write)));
}

BOOST_AUTO_TEST_CASE(a_finished_run_frees_its_disk_reserve_while_its_handle_is_still_held) {
  // The room a run holds for its end (.reserve) goes once finish has
  // answered, not when the handle is freed: a run held to its process's exit
  // (a Python module's global) never frees its handle, and its directory
  // would keep 256 KiB that nothing reads.
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  BOOST_REQUIRE(run);
  const fs::path rd(std::string(run.dir()));
  for (int s = 0; s < 10; ++s) run.log({{"loss", 1.0 / (s + 1)}});
  BOOST_REQUIRE(!run.log({{"loss", 0.0}}, {.step = 10}).wait()); // the run's actors are up
  BOOST_TEST(fs::exists(rd / ".reserve"));                          // and hold the room while it is live
  const chorus::FinishResult r = run.finish().wait();
  BOOST_REQUIRE(!r.error);
  // Freed beside the trainer's next steps, after the answer: wait for it (bounded).
  for (int i = 0; i < 1000 && fs::exists(rd / ".reserve"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  BOOST_TEST(!fs::exists(rd / ".reserve"));
  BOOST_TEST(slurp(rd / "run.json").find("\"state\":\"finished\"") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_input_is_a_clear_error_and_loses_nothing_else) {
  TempDir dir;
  fs::path rd;
  {
    chorus::Run run = chorus::init(local_options(dir));
    BOOST_TEST(!run.log({{"x", 1.0}}, {.step = 10}).wait());
    // A backwards step is refused with the reason.
    chorus::Error back = run.log({{"x", 2.0}}, {.step = 5}).wait();
    BOOST_TEST((back.code() == chorus::Errc::backwards_step));
    BOOST_TEST(back.message().find("5") != std::string::npos);
    // NaN and infinities are kept.
    BOOST_TEST(!run.log({{"nan", std::nan("")}, {"inf", INFINITY}, {"ninf", -INFINITY}}, {.step = 11}).wait());
    // Bad keys: refused at once, the call's good values still logged.
    const std::string huge(10'000, 'k');
    const std::string not_utf8 = "bad\xff\xfekey";
    for (std::string_view bad : {std::string_view(), std::string_view(huge), std::string_view(not_utf8),
                                 std::string_view("_step")}) {
      chorus::Pending p = run.log({{bad, 1.0}, {"good", 3.0}}, {.step = 12});
      chorus::Error e = p.wait();
      BOOST_TEST((e.code() == chorus::Errc::invalid_key));
      BOOST_TEST(e.message().find("(the call's one valid value was logged)") != std::string::npos, e.message());
    }
    // The error says what became of the rest of the call, in words that fit its count.
    const chorus::Error alone = run.log({{"", 1.0}}).wait();
    BOOST_TEST((alone.code() == chorus::Errc::invalid_key));
    BOOST_TEST(alone.message().find("valid value") == std::string::npos, alone.message()); // refused whole
    const chorus::Error two = run.log({{"good", 4.0}, {"", 1.0}, {"also", 5.0}}, {.step = 13}).wait();
    BOOST_TEST(two.message().find("(the call's 2 valid values were logged)") != std::string::npos, two.message());
    // A config over 16 MiB would not fit a link between nodes: refused, saying what to do.
    const std::string blob(17u << 20, 'x');
    chorus::Error big = run.config({{"blob", std::string_view(blob)}}).wait();
    BOOST_TEST((big.code() == chorus::Errc::invalid_argument));
    BOOST_TEST(big.message().find("16 MiB") != std::string::npos, big.message());
    BOOST_TEST(big.message().find("log_artifact") != std::string::npos, big.message());
    chorus::FinishResult first = run.finish().wait();
    BOOST_TEST(!first.error, first.error.message());
    // After finish: refused, and finish again gives the same result.
    BOOST_TEST((run.log({{"late", 1.0}}).wait().code() == chorus::Errc::finished));
    chorus::FinishResult second = run.finish().wait();
    BOOST_TEST(second.run_dir == first.run_dir);
    BOOST_TEST((second.state == first.state));
    rd = first.run_dir;
  }
  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), 4u);
  BOOST_TEST(rows[0].num.at("x") == 1.0);
  BOOST_TEST(rows[1].str.at("nan") == "NaN");
  BOOST_TEST(rows[1].str.at("inf") == "Infinity");
  BOOST_TEST(rows[1].str.at("ninf") == "-Infinity");
  BOOST_TEST(rows[2].num.at("good") == 3.0);
  BOOST_TEST(rows[3].num.at("also") == 5.0);
  const std::string rejected = slurp(rd / "rejected.jsonl");
  BOOST_TEST(rejected.find("backwards_step") != std::string::npos);
}

// define_metric's summary and step metric through the public API: what a
// call leaves unset stays as declared, summary.json takes the declared
// summary, metrics.json every declaration; a bad step metric is refused.
BOOST_AUTO_TEST_CASE(metric_options_declare_a_summary_and_a_step_metric) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  BOOST_TEST(!run.define_metric("loss", {.reduce = chorus::Reduce::mean, .summary = chorus::Summary::min}).wait());
  BOOST_TEST(!run.define_metric("acc", {.summary = chorus::Summary::max}).wait()); // no step metric given
  BOOST_TEST(!run.define_metric("loss", {.step_metric = "epoch"}).wait());         // the summary stays min
  const chorus::Error bad = run.define_metric("acc", {.step_metric = "_step"}).wait();
  BOOST_TEST((bad.code() == chorus::Errc::invalid_key), bad.message());
  BOOST_TEST(bad.message().find("step_metric") != std::string::npos, bad.message());
  for (int s = 0; s < 4; ++s) run.log({{"loss", 4.0 - (s == 2 ? 3 : s)}, {"acc", 0.1 * s}, {"epoch", s / 2.0}});
  (void)finish_and_read(run, 4);
  const fs::path rd(std::string(run.dir()));
  simdjson::dom::parser p;
  simdjson::dom::element summary;
  BOOST_REQUIRE(p.load((rd / "summary.json").string()).get(summary) == simdjson::SUCCESS);
  BOOST_TEST(double(summary["loss"]) == 1.0);          // the smallest: 4, 3, 1, 1
  BOOST_TEST(double(summary["acc"]) == 0.1 * 3);       // the largest
  BOOST_TEST(double(summary["epoch"]) == 1.5);         // undeclared: its last
  simdjson::dom::parser q;
  simdjson::dom::element metrics;
  BOOST_REQUIRE(q.load((rd / "metrics.json").string()).get(metrics) == simdjson::SUCCESS);
  BOOST_TEST(std::string_view(metrics["loss"]["summary"]) == "min");
  BOOST_TEST(std::string_view(metrics["loss"]["reduce"]) == "mean");
  BOOST_TEST(std::string_view(metrics["loss"]["step_metric"]) == "epoch");
  BOOST_TEST(std::string_view(metrics["acc"]["summary"]) == "max");
  BOOST_TEST(metrics["acc"]["step_metric"].is_null());
}

// Reduce::first through the public API: accepted by define_metric, one
// column with its count; refused by reduce_device (NCCL has no such
// operation) before any device is touched, and an unknown value is named.
BOOST_AUTO_TEST_CASE(reduce_first_is_a_declaration_and_no_device_reduction) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  BOOST_TEST(!run.define_metric("lr", chorus::Reduce::first).wait());
  const chorus::Error unknown = run.define_metric("lr", static_cast<chorus::Reduce>(7)).wait();
  BOOST_TEST((unknown.code() == chorus::Errc::invalid_argument));
  BOOST_TEST(unknown.message().find("use none, mean, sum, min, max, first or merge") != std::string::npos,
             unknown.message());
  const float* any = reinterpret_cast<const float*>(0x1000);
  const chorus::Error device = run.reduce_device({{"lr", any}}, chorus::Reduce::first, nullptr).wait();
  BOOST_TEST((device.code() == chorus::Errc::invalid_argument));
  BOOST_TEST(device.message().find("define_metric(key, Reduce::first)") != std::string::npos, device.message());
  BOOST_TEST(!run.log({{"lr", 0.5}}).wait());
  const auto rows = finish_and_read(run, 1);
  BOOST_TEST(rows[0].num.at("lr") == 0.5);
  BOOST_TEST(rows[0].count.at("lr") == 1.0);
}

BOOST_AUTO_TEST_CASE(braced_lists_keep_every_entry_even_after_a_bad_key) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  // A null key in the middle is refused alone; what follows it is logged.
  chorus::Error e = run.log({{"a", 1.0}, {std::string_view(), 2.0}, {"b", 3.0}}, {.step = 0}).wait();
  BOOST_TEST((e.code() == chorus::Errc::invalid_key));
  // The longest braced list: 16 entries.
  BOOST_TEST(!run.log({{"k0", 0}, {"k1", 1}, {"k2", 2}, {"k3", 3}, {"k4", 4}, {"k5", 5}, {"k6", 6}, {"k7", 7},
                       {"k8", 8}, {"k9", 9}, {"k10", 10}, {"k11", 11}, {"k12", 12}, {"k13", 13}, {"k14", 14},
                       {"k15", 15}},
                      {.step = 1})
                  .wait());
  const auto rows = finish_and_read(run, 2);
  BOOST_TEST(rows[0].num.at("a") == 1.0);
  BOOST_TEST(rows[0].num.at("b") == 3.0);
  for (int i = 0; i < 16; ++i) BOOST_TEST(rows[1].num.at("k" + std::to_string(i)) == i);
}

namespace {

/// A braced list of N entries (each length is a constructor of its own)
/// gives exactly those entries, in order, for host and device values.
template <std::size_t N>
void check_braced_list_of(std::size_t& checked) {
  static const std::array<std::string, 16> names = {"k0", "k1", "k2",  "k3",  "k4",  "k5",  "k6",  "k7",
                                                    "k8", "k9", "k10", "k11", "k12", "k13", "k14", "k15"};
  static const float device[16] = {};
  std::array<chorus::Metric, N> host;
  std::array<chorus::DeviceMetric, N> dev;
  for (std::size_t i = 0; i < N; ++i) {
    host[i] = {names[i], static_cast<double>(i) + 0.5};
    dev[i] = {names[i], device + i};
  }
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const chorus::Metrics list{host[I]...};
    const chorus::DeviceMetrics device_list{dev[I]...};
    const std::span<const chorus::Metric> s = list;
    const std::span<const chorus::DeviceMetric> d = device_list;
    BOOST_REQUIRE_EQUAL(s.size(), N);
    BOOST_REQUIRE_EQUAL(d.size(), N);
    for (std::size_t i = 0; i < N; ++i) {
      BOOST_TEST(s[i].key == names[i]);
      BOOST_TEST(s[i].value == static_cast<double>(i) + 0.5);
      BOOST_TEST(d[i].key == names[i]);
      BOOST_TEST(d[i].value == device + i);
    }
  }(std::make_index_sequence<N>{});
  ++checked;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_braced_list_of_each_length_gives_its_entries_and_no_more) {
  std::size_t checked = 0;
  [&]<std::size_t... N>(std::index_sequence<N...>) { (check_braced_list_of<N + 1>(checked), ...); }(
      std::make_index_sequence<chorus::Metrics::capacity>{});
  BOOST_TEST(checked == 16u);
}

namespace {

chorus::task<std::thread::id> await_on_loop(chorus::Run& run) {
  // Temporaries in the awaited expression (GCC 12's hazard): a braced list
  // and the ticket itself.
  chorus::Error e = co_await run.log({{"k", 1.0}, {"j", 2.0}});
  BOOST_TEST(!e);
  std::string name = "sync";
  e = co_await run.barrier(name);
  BOOST_TEST(!e);
  co_return std::this_thread::get_id();
}

chorus::task<chorus::FinishResult> nested(chorus::Run& run) {
  auto id = co_await await_on_loop(run);
  BOOST_TEST((id == std::this_thread::get_id()));
  co_return co_await run.finish();
}

} // namespace

BOOST_AUTO_TEST_CASE(coroutines_resume_on_the_awaiting_executor) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  const auto me = std::this_thread::get_id();
  chorus::FinishResult r = chorus::sync_wait(nested(run));
  BOOST_TEST(!r.error, r.error.message());
  BOOST_TEST((std::this_thread::get_id() == me));
  auto rows = read_history(r.run_dir);
  BOOST_REQUIRE_EQUAL(rows.size(), 1u);
  BOOST_TEST(rows[0].num.at("j") == 2.0);
}

BOOST_AUTO_TEST_CASE(drop_newest_counts_what_it_drops) {
  TempDir dir;
  auto opt = local_options(dir);
  opt.overflow = chorus::Overflow::drop_newest;
  opt.queue_capacity = 1024;
  chorus::Run run = chorus::init(opt);
  std::uint64_t refused = 0;
  for (int i = 0; i < 200'000; ++i) {
    chorus::Pending p = run.log({{"v", static_cast<double>(i)}});
    if (p.ready() && p.wait().code() == chorus::Errc::dropped) ++refused;
  }
  auto r = run.finish().wait();
  BOOST_TEST(!r.error);
  BOOST_TEST(run.dropped() == refused);
  BOOST_TEST(r.dropped == refused);
  BOOST_TEST(read_history(r.run_dir).size() == 200'000u - refused);
}

BOOST_AUTO_TEST_CASE(block_waits_for_room_and_loses_nothing) {
  // A small queue and four threads logging flat out: they wait (asleep once
  // spinning gives nothing) until the RankProxy frees room, and every value lands.
  TempDir dir;
  auto opt = local_options(dir);
  opt.queue_capacity = 1024;
  chorus::Run run = chorus::init(opt);
  constexpr int threads = 4, calls = 30'000;
  std::vector<std::thread> producers;
  for (int t = 0; t < threads; ++t)
    producers.emplace_back([&run, t] {
      const std::string key = "t" + std::to_string(t);
      for (int i = 0; i < calls; ++i) (void)run.log({{key, static_cast<double>(i)}});
    });
  for (auto& p : producers) p.join();
  auto r = run.finish().wait();
  BOOST_TEST(!r.error, r.error.message());
  BOOST_TEST(run.dropped() == 0u);
  const auto rows = read_history(r.run_dir);
  BOOST_TEST(rows.size() == static_cast<std::size_t>(threads * calls));
  std::map<std::string, double> sums;
  for (const auto& row : rows)
    for (const auto& [k, v] : row.num)
      if (!k.starts_with("_")) sums[k] += v;
  for (int t = 0; t < threads; ++t) BOOST_TEST(sums["t" + std::to_string(t)] == double(calls) * (calls - 1) / 2);
}

BOOST_AUTO_TEST_CASE(environment_errors_name_the_variable) {
  TempDir dir;
  ::setenv("CHORUS_MODE", "sideways", 1);
  chorus::Error e;
  auto opt = local_options(dir);
  opt.read_env = true;
  chorus::Run run = chorus::init(opt, e);
  ::unsetenv("CHORUS_MODE");
  BOOST_TEST(!run);
  BOOST_TEST((e.code() == chorus::Errc::bad_environment));
  BOOST_TEST(e.message().find("CHORUS_MODE") != std::string::npos);
  BOOST_CHECK_THROW((void)chorus::init(opt.read_env ? [&] {
    ::setenv("CHORUS_MODE", "sideways", 1);
    return opt;
  }() : opt), chorus::InitError);
  ::unsetenv("CHORUS_MODE");
}

// Device calls without a CUDA device: an error that says what is missing,
// and the run goes on. (On a machine with a GPU, e2e_device_test covers them.)
BOOST_AUTO_TEST_CASE(device_calls_without_cuda_say_what_is_missing) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  const float* not_on_a_gpu = reinterpret_cast<const float*>(0x1000);
  chorus::Error e = run.log_device({{"loss", not_on_a_gpu}, {"gnorm", not_on_a_gpu + 1}}, nullptr).wait();
  chorus::Error r = chorus::sync_wait([&]() -> chorus::task<chorus::Error> {
    co_return co_await run.reduce_device({{"loss", not_on_a_gpu}}, chorus::Reduce::mean, nullptr);
  }());
  if (e.message().find("needs CUDA") == std::string::npos && e.message().find("needs a CUDA device") == std::string::npos) {
    BOOST_TEST_MESSAGE("this machine has CUDA: " << e.message());
    BOOST_TEST((e.code() == chorus::Errc::invalid_argument)); // still refused: not device memory
  } else {
    BOOST_TEST((e.code() == chorus::Errc::invalid_argument));
    BOOST_TEST(r.message() == e.message());
    BOOST_TEST((e.message().find("libcudart") != std::string::npos || e.message().find("CUDA_VISIBLE_DEVICES") != std::string::npos),
               e.message());
  }
  BOOST_TEST(!run.log({{"after", 1.0}}).wait());
  BOOST_TEST(!run.finish().wait().error);
}
