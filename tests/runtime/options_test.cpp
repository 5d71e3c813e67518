#define BOOST_TEST_MODULE runtime_options
#include <boost/test/unit_test.hpp>

#include "runtime/core/options.hpp"
#include "runtime/core/upload_url.hpp"
#include "tests/runtime/env.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace chorus;
namespace fs = std::filesystem;

namespace {

using test::env_of;
using test::Vars;

core::Settings resolve_ok(const Options& o, const Vars& vars = {}) {
  Result<core::Settings> s = core::resolve(o, env_of(vars));
  BOOST_TEST_REQUIRE(s.has_value(), "unexpected error: " << s.error().message());
  return std::move(*s);
}

/// The error for `o` in `vars`: `code`, and every one of `words` in the message.
std::string resolve_error(const Options& o, const Vars& vars, Errc code, const std::vector<std::string>& words) {
  const Error error = core::resolve(o, env_of(vars)).error();
  BOOST_TEST(bool(error), "no error");
  BOOST_TEST((error.code() == code), "code: " << to_string(error.code()) << ", message: " << error.message());
  for (const std::string& w : words)
    BOOST_TEST(error.message().find(w) != std::string::npos, "'" << w << "' not in: " << error.message());
  return error.message();
}

std::string env_error(const Vars& vars, const std::vector<std::string>& words) {
  return resolve_error(Options{}, vars, Errc::bad_environment, words);
}

std::string option_error(const Options& o, const std::vector<std::string>& words) {
  return resolve_error(o, {}, Errc::invalid_argument, words);
}

Vars torchrun(int rank, int world, int local_world, const std::string& run_id = "job-7") {
  Vars v{{"RANK", std::to_string(rank)},
         {"WORLD_SIZE", std::to_string(world)},
         {"LOCAL_RANK", std::to_string(rank % local_world)},
         {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
         {"GROUP_RANK", std::to_string(rank / local_world)},
         {"GROUP_WORLD_SIZE", std::to_string(world / local_world)},
         {"MASTER_ADDR", "10.0.0.1"},
         {"MASTER_PORT", "6000"}};
  if (!run_id.empty()) v["TORCHELASTIC_RUN_ID"] = run_id;
  return v;
}

// Rank `r` of a job of 4 ranks, 2 a node, as srun, Open MPI 4's mpirun and
// Cray's mpiexec start it: its job named by the launcher, no MASTER_PORT.
Vars slurm(int r, const std::string& job, const std::string& step = "0") {
  return {{"SLURM_PROCID", std::to_string(r)},  {"SLURM_LOCALID", std::to_string(r % 2)},
          {"SLURM_NTASKS", "4"},                {"SLURM_NODEID", std::to_string(r / 2)},
          {"SLURM_TASKS_PER_NODE", "2(x2)"},    {"SLURM_JOB_ID", job},
          {"SLURM_STEP_ID", step},              {"SLURM_JOB_NODELIST", "n[1-2]"}};
}
Vars open_mpi(int r, const std::string& job) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r % 2)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
          {"OMPI_MCA_ess_base_jobid", job},
          {"MASTER_ADDR", "n1"}};
}
Vars cray_pmi(int r, const std::string& job) {
  return {{"PMI_RANK", std::to_string(r)}, {"PMI_SIZE", "4"}, {"PMI_LOCAL_RANK", std::to_string(r % 2)},
          {"PMI_LOCAL_SIZE", "2"},         {"PMI_JOBID", job}};
}

// Rank `r` of a job of 4 ranks, `per_node` a node, as Hydra's mpiexec starts
// it: no job id, no MASTER_PORT; `proxy` is the hydra_pmi_proxy it
// descends from ("<pid>-<start ticks>").
Vars hydra(int r, int per_node, const std::string& proxy) {
  return {{"PMI_RANK", std::to_string(r)},
          {"PMI_SIZE", "4"},
          {"PMI_FD", "5"},
          {"MPI_LOCALRANKID", std::to_string(r % per_node)},
          {"MPI_LOCALNRANKS", std::to_string(per_node)},
          {std::string(core::hydra_proxy), proxy}};
}

Vars with(Vars base, const Vars& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

Options with_mode(Mode m, Scope s) {
  Options o;
  o.mode = m;
  o.scope = s;
  return o;
}

/// Every CHORUS_* variable, each with a valid value.
Vars all_chorus() {
  return {{"CHORUS_DIR", "/tmp/chorus-env"},
          {"CHORUS_PROJECT", "proj"},
          {"CHORUS_GROUP", "grp"},
          {"CHORUS_RUN_ID", "run-1"},
          {"CHORUS_NAME", "nice name"},
          {"CHORUS_MODE", "shared"},
          {"CHORUS_SCOPE", "worker"},
          {"CHORUS_RESUME", "allow"},
          {"CHORUS_UPLOAD", "mlflow://tracking:5000"},
          {"CHORUS_PORT", "40000"},
          {"CHORUS_INIT_TIMEOUT", "2.5"},
          {"CHORUS_FINISH_TIMEOUT", "7"},
          {"CHORUS_SYSTEM_INTERVAL", "0"},
          {"CHORUS_TLS_DIR", "/etc/chorus/tls"},
          {"CHORUS_INSECURE", "1"}};
}

} // namespace

// --- Defaults and the environment -------------------------------------------

BOOST_AUTO_TEST_CASE(defaults_for_one_process) {
  const core::Settings s = resolve_ok(Options{});
  BOOST_TEST(s.opts.project == "uncategorized");
  BOOST_TEST(s.opts.group == "default");
  BOOST_TEST(s.opts.run_id.empty());
  BOOST_TEST(s.opts.dir == (fs::current_path() / "chorus-runs").lexically_normal().string());
  BOOST_TEST((s.opts.mode == Mode::automatic));
  BOOST_TEST((s.opts.scope == Scope::global));
  BOOST_TEST(s.active);
  BOOST_TEST(s.is_host);
  BOOST_TEST(s.run_rank == 0);
  BOOST_TEST(s.run_world == 1);
  BOOST_TEST(s.port == 29501);
  BOOST_TEST(s.host_address == "127.0.0.1");
  BOOST_TEST(s.run_name.empty());
  BOOST_TEST(s.topo.launcher == "none");
  BOOST_TEST(s.opts.topology.has_value());
  BOOST_TEST(s.opts.init_timeout.count() == 30'000);
  BOOST_TEST(s.opts.finish_timeout.count() == 60'000);
}

BOOST_AUTO_TEST_CASE(environment_overrides_options) {
  Options o;
  o.project = "from-code";
  o.group = "g0";
  o.run_id = "r0";
  o.name = "n0";
  o.mode = Mode::per_rank;
  o.scope = Scope::global;
  o.dir = "/somewhere/else";
  o.port = 1111;
  o.init_timeout = std::chrono::seconds(5);
  o.finish_timeout = std::chrono::seconds(6);
  o.system_interval = 3;
  o.upload = "wandb://api.example";
  const core::Settings s = resolve_ok(o, all_chorus());
  BOOST_TEST(s.opts.dir == "/tmp/chorus-env");
  BOOST_TEST(s.opts.project == "proj");
  BOOST_TEST(s.opts.group == "grp");
  BOOST_TEST(s.opts.run_id == "run-1-node-0"); // shared within a node: the node's run
  BOOST_TEST(s.opts.name == "nice name");
  BOOST_TEST(s.run_name == "nice name-node-0");
  BOOST_TEST((s.opts.mode == Mode::shared));
  BOOST_TEST((s.opts.scope == Scope::node));
  BOOST_TEST((s.opts.resume == Resume::allow));
  BOOST_TEST(s.opts.upload == "mlflow://tracking:5000");
  BOOST_TEST(s.opts.port == 40000);
  BOOST_TEST(s.port == 40000);
  BOOST_TEST(s.opts.init_timeout.count() == 2'500);
  BOOST_TEST(s.opts.finish_timeout.count() == 7'000);
  BOOST_TEST(s.opts.system_interval == 0.0);
  BOOST_TEST(s.opts.tls_dir == "/etc/chorus/tls");
  BOOST_TEST(s.opts.insecure);
}

BOOST_AUTO_TEST_CASE(read_env_false_ignores_chorus_variables) {
  Options o;
  o.read_env = false;
  o.project = "from-code";
  o.dir = "/from/code";
  // Even malformed values are not read.
  Vars env = with(all_chorus(), {{"CHORUS_MODE", "sideways"}, {"CHORUS_PORT", "70000"}, {"CHORUS_RUN_ID", "../x"}});
  const core::Settings s = resolve_ok(o, env);
  BOOST_TEST(s.opts.project == "from-code");
  BOOST_TEST(s.opts.dir == "/from/code");
  BOOST_TEST(s.opts.run_id.empty());
  BOOST_TEST((s.opts.mode == Mode::automatic));
  BOOST_TEST(s.port == 29501);
  BOOST_TEST(!s.opts.insecure);
  BOOST_TEST(s.opts.init_timeout.count() == 30'000);
  // The launcher's variables are still where this process sits.
  const core::Settings r = resolve_ok(o, with(env, torchrun(1, 2, 2)));
  BOOST_TEST(r.topo.rank == 1);
  BOOST_TEST(!r.active);
}

BOOST_AUTO_TEST_CASE(empty_chorus_variables_count_as_unset) {
  Options o;
  o.project = "kept";
  Vars env;
  for (const auto& [k, v] : all_chorus()) env[k] = "";
  const core::Settings s = resolve_ok(o, env);
  BOOST_TEST(s.opts.project == "kept");
  BOOST_TEST((s.opts.mode == Mode::automatic));
  BOOST_TEST(s.port == 29501);
}

BOOST_AUTO_TEST_CASE(mode_and_scope_spellings) {
  const std::pair<const char*, Mode> modes[] = {{"auto", Mode::automatic},     {"shared", Mode::shared},
                                                {"new", Mode::per_rank},       {"automatic", Mode::automatic},
                                                {"per_rank", Mode::per_rank}};
  for (const auto& [text, mode] : modes) {
    BOOST_TEST_CONTEXT(text) { BOOST_TEST((resolve_ok(Options{}, {{"CHORUS_MODE", text}}).opts.mode == mode)); }
  }
  BOOST_TEST((resolve_ok(Options{}, {{"CHORUS_SCOPE", "global"}}).opts.scope == Scope::global));
  BOOST_TEST((resolve_ok(Options{}, {{"CHORUS_SCOPE", "worker"}}).opts.scope == Scope::node));
  BOOST_TEST((resolve_ok(Options{}, {{"CHORUS_SCOPE", "node"}}).opts.scope == Scope::node));
}

BOOST_AUTO_TEST_CASE(resume_spellings_and_default) {
  // Today's behaviour stays the default: a reused run id is refused.
  BOOST_TEST((resolve_ok(Options{}).opts.resume == Resume::never));
  for (Resume r : {Resume::never, Resume::allow, Resume::must}) {
    const std::string text(to_string(r));
    BOOST_TEST_CONTEXT(text) { BOOST_TEST((resolve_ok(Options{}, {{"CHORUS_RESUME", text}}).opts.resume == r)); }
  }
  Options code;
  code.resume = Resume::must;
  BOOST_TEST((resolve_ok(code).opts.resume == Resume::must));
  BOOST_TEST((resolve_ok(code, {{"CHORUS_RESUME", "never"}}).opts.resume == Resume::never));
}

BOOST_AUTO_TEST_CASE(accepted_edge_values) {
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_PORT", "1"}}).port == 1);
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_PORT", "65535"}}).port == 65535);
  // A positive timeout below a millisecond stays positive.
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_INIT_TIMEOUT", "0.0001"}}).opts.init_timeout.count() == 1);
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_FINISH_TIMEOUT", "0.5"}}).opts.finish_timeout.count() == 500);
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_SYSTEM_INTERVAL", "0.1"}}).opts.system_interval == 0.1);
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_SYSTEM_INTERVAL", "30"}}).opts.system_interval == 30.0);
  for (const char* yes : {"1", "true", "YES", "True"})
    BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_INSECURE", yes}}).opts.insecure, yes);
  Options insecure;
  insecure.insecure = true;
  for (const char* no : {"0", "false", "No"}) BOOST_TEST(!resolve_ok(insecure, {{"CHORUS_INSECURE", no}}).opts.insecure, no);
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_PROJECT", "résultats été"}}).opts.project == "résultats été");
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_RUN_ID", "a.b_c-D9"}}).opts.run_id == "a.b_c-D9");
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_RUN_ID", std::string(128, 'x')}}).opts.run_id.size() == 128u);
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_UPLOAD", "wandb://tracking.example"}}).opts.upload == "wandb://tracking.example");
}

// --- Malformed CHORUS_* values ----------------------------------------------

BOOST_AUTO_TEST_CASE(malformed_chorus_values_name_the_variable_and_what_it_takes) {
  struct Case {
    const char* var;
    std::vector<std::string> values;
    const char* takes;
  };
  const std::string long_name(129, 'n');
  const Case cases[] = {
      {"CHORUS_MODE", {"sideways", "Shared", "Automatic", "per-rank", "auto "}, "auto, shared or new (or automatic, per_rank)"},
      {"CHORUS_SCOPE", {"nodes", "local", "Global"}, "global or worker (or node)"},
      {"CHORUS_RESUME", {"yes", "auto", "Allow", "true", "1", "must "}, "never, allow or must"},
      {"CHORUS_PORT",
       {"70000", "65536", "0", "-1", "abc", "80x", " 80", "99999999999999999999"},
       "a port number in 1..65535"},
      {"CHORUS_INIT_TIMEOUT",
       {"-1", "ten", "0", "0.0", "1e3", "nan", "inf", "30s", "2000000000", "-0.5"},
       "seconds greater than 0"},
      {"CHORUS_FINISH_TIMEOUT", {"-1", "ten", "0", "1e3", "inf", "5m"}, "seconds greater than 0"},
      {"CHORUS_HEARTBEAT_INTERVAL", {"-1", "0", "1s", "nan"}, "seconds greater than 0"},
      {"CHORUS_CONNECTION_TIMEOUT", {"-1", "0", "10s", "inf"}, "seconds greater than 0"},
      {"CHORUS_SYSTEM_INTERVAL", {"-1", "0.01", "abc", "5m", "nan"}, "seconds, 0 (off) or at least 0.1"},
      {"CHORUS_INSECURE", {"maybe", "2", "on", "-1"}, "1, 0, true, false, yes or no"},
      {"CHORUS_RUN_ID", {"../x", "a/b", "..", ".", "/abs", "a b", "x:y", "ü", long_name}, "1 to 128 of the characters"},
      {"CHORUS_PROJECT", {"../x", "a/b", "..", ".", "/abs", "\xff", "\xc0\xaf", long_name}, "a directory name"},
      {"CHORUS_GROUP", {"../x", "a/b", "..", ".", "x/../../y"}, "a directory name"},
      {"CHORUS_NAME", {"../x", "a/b", "..", "."}, "a directory name"},
      {"CHORUS_UPLOAD", {"ftp://x", "mlflow://", "localhost:5000", "http://host"}, "mlflow://HOST:PORT, wandb://HOST[/ENTITY], tensorboard:DIR or webhook://HOST[:PORT]/PATH"},
  };
  for (const Case& c : cases) {
    for (const std::string& value : c.values) {
      BOOST_TEST_CONTEXT(c.var << "='" << value << "'") {
        const std::string shown = value.substr(0, 64);
        env_error({{c.var, value}}, {std::string(c.var) + "='" + shown, std::string(c.var) + " takes " + c.takes});
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_bad_chorus_value_is_an_error_even_with_a_launcher) {
  env_error(with(torchrun(1, 4, 2), {{"CHORUS_MODE", "sideways"}}), {"CHORUS_MODE='sideways'"});
}

// --- Options given in code ---------------------------------------------------

BOOST_AUTO_TEST_CASE(names_that_would_leave_the_run_directory_are_rejected) {
  struct Field {
    std::string Options::*field;
    const char* option;
  };
  const Field fields[] = {{&Options::project, "Options::project"},
                          {&Options::group, "Options::group"},
                          {&Options::run_id, "Options::run_id"},
                          {&Options::name, "Options::name"}};
  for (const Field& f : fields) {
    for (const char* value : {"../x", "a/b", "..", ".", "/etc", "x/.."}) {
      BOOST_TEST_CONTEXT(f.option << "='" << value << "'") {
        Options o;
        o.*f.field = value;
        option_error(o, {std::string(f.option) + "='" + value + "'", std::string(f.option) + " takes"});
      }
    }
  }
  // A name with a NUL byte would be cut short by the file system.
  Options nul;
  nul.project = std::string("a\0b", 3);
  option_error(nul, {"Options::project", "NUL"});
  // The project names a directory and has no default to fall back to.
  Options empty;
  empty.project = "";
  option_error(empty, {"Options::project=''", "is empty"});
}

BOOST_AUTO_TEST_CASE(environment_replaces_a_bad_option_before_it_is_checked) {
  Options o;
  o.project = "../bad";
  BOOST_TEST(resolve_ok(o, {{"CHORUS_PROJECT", "good"}}).opts.project == "good");
}

BOOST_AUTO_TEST_CASE(run_directory_stays_inside_dir) {
  // Whatever the launcher calls the job, the derived group is one directory.
  for (const char* job : {"../../etc", "/", "..", "a/b:c", "x\\y", "."}) {
    BOOST_TEST_CONTEXT(job) {
      Options o;
      o.dir = "/data/runs";
      o.run_id = "r";
      const core::Settings s = resolve_ok(o, torchrun(0, 2, 2, job));
      const fs::path run = fs::path(s.opts.dir) / s.opts.project / s.opts.group / s.opts.run_id;
      BOOST_TEST(run.lexically_normal().parent_path().parent_path().parent_path() == fs::path("/data/runs"),
                 run.string());
      BOOST_TEST(s.opts.group.find('/') == std::string::npos, s.opts.group);
      BOOST_TEST(s.opts.group != "..");
    }
  }
}

BOOST_AUTO_TEST_CASE(dir_is_made_absolute_and_normal) {
  Options o;
  o.dir = "runs/../x/";
  BOOST_TEST(resolve_ok(o).opts.dir == (fs::current_path() / "x").string());
  o.dir = "/tmp/a/";
  BOOST_TEST(resolve_ok(o).opts.dir == "/tmp/a");
  o.dir = "/";
  BOOST_TEST(resolve_ok(o).opts.dir == "/");
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_DIR", "rel"}}).opts.dir == (fs::current_path() / "rel").string());
}

BOOST_AUTO_TEST_CASE(bad_option_values) {
  const auto check = [](auto set, std::vector<std::string> words) {
    Options o;
    set(o);
    option_error(o, words);
  };
  check([](Options& o) { o.init_timeout = std::chrono::milliseconds(0); }, {"Options::init_timeout", "above 0"});
  check([](Options& o) { o.finish_timeout = std::chrono::milliseconds(-5); }, {"Options::finish_timeout"});
  check([](Options& o) { o.barrier_timeout = {}; }, {"Options::barrier_timeout"});
  check([](Options& o) { o.heartbeat_interval = {}; }, {"Options::heartbeat_interval"});
  check([](Options& o) { o.connection_timeout = o.heartbeat_interval; }, {"Options::connection_timeout", "heartbeat_interval"});
  check([](Options& o) { o.queue_capacity = 10; }, {"Options::queue_capacity", "1024"});
  check([](Options& o) { o.queue_capacity = std::size_t{1} << 30; }, {"Options::queue_capacity"});
  check([](Options& o) { o.system_interval = 0.05; }, {"Options::system_interval", "at least 0.1"});
  check([](Options& o) { o.system_interval = -1; }, {"Options::system_interval"});
  check([](Options& o) { o.system_interval = std::numeric_limits<double>::quiet_NaN(); }, {"Options::system_interval"});
  check([](Options& o) { o.mode = static_cast<Mode>(7); }, {"Options::mode"});
  check([](Options& o) { o.scope = static_cast<Scope>(7); }, {"Options::scope"});
  check([](Options& o) { o.resume = static_cast<Resume>(7); }, {"Options::resume", "Resume::never, allow or must"});
  check([](Options& o) { o.overflow = static_cast<Overflow>(7); }, {"Options::overflow"});
  check([](Options& o) { o.upload = "s3://bucket"; }, {"Options::upload='s3://bucket'", "mlflow://HOST:PORT"});
}

BOOST_AUTO_TEST_CASE(given_topology_replaces_the_launcher) {
  Options o;
  Topology t;
  t.rank = 2;
  t.world_size = 4;
  t.local_rank = 0;
  t.local_world_size = 2;
  t.node_rank = 1;
  t.num_nodes = 2;
  t.launcher = "custom";
  t.job_id = "j";
  t.master_addr = "h0";
  o.topology = t;
  o.mode = Mode::shared;
  const core::Settings s = resolve_ok(o, torchrun(0, 8, 4));
  BOOST_TEST(s.topo.rank == 2);
  BOOST_TEST(s.topo.launcher == "custom");
  BOOST_TEST(s.opts.group == "custom-j");
  BOOST_TEST(!s.is_host);
  BOOST_TEST(s.run_rank == 2);

  t.rank = 4;
  o.topology = t;
  option_error(o, {"Options::topology", "rank 4"});
  t.rank = 0;
  t.master_port = 70000;
  o.topology = t;
  option_error(o, {"Options::topology", "master_port 70000"});
  t.master_port = 0;
  t.num_nodes = 1;
  t.node_rank = 0;
  o.topology = t;
  option_error(o, {"Options::topology", "local_world_size 2 differs from world_size 4"});
  t.local_world_size = 4;
  o.topology = t;
  BOOST_TEST(resolve_ok(o).run_world == 4);
}

// --- Where each rank sits: mode x scope (README, "Modes and the environment") -------------------

BOOST_AUTO_TEST_CASE(mode_by_scope_matrix) {
  struct Expect {
    bool active, host;
    int run_rank, run_world;
    std::string run_id, run_name;
  };
  // Two nodes of two ranks each: rank r is local rank r % 2 on node r / 2.
  const auto expect = [](Mode m, Scope sc, int r) -> Expect {
    const int local = r % 2, node = r / 2;
    const std::string n = "-node-" + std::to_string(node), k = "-rank-" + std::to_string(r);
    const bool global = sc == Scope::global;
    switch (m) {
    case Mode::automatic:
      return global ? Expect{r == 0, r == 0, 0, 1, "exp", "nm"} : Expect{local == 0, local == 0, 0, 1, "exp" + n, "nm" + n};
    case Mode::shared:
      return global ? Expect{true, r == 0, r, 4, "exp", "nm"} : Expect{true, local == 0, local, 2, "exp" + n, "nm" + n};
    case Mode::per_rank: return {true, true, 0, 1, "exp" + k, "nm" + k};
    }
    return {};
  };
  for (Mode m : {Mode::automatic, Mode::shared, Mode::per_rank}) {
    for (Scope sc : {Scope::global, Scope::node}) {
      for (int r = 0; r < 4; ++r) {
        BOOST_TEST_CONTEXT(to_string(m) << " x " << to_string(sc) << ", rank " << r) {
          Options o = with_mode(m, sc);
          o.run_id = "exp";
          o.name = "nm";
          const core::Settings s = resolve_ok(o, torchrun(r, 4, 2));
          const Expect e = expect(m, sc, r);
          BOOST_TEST(s.active == e.active);
          BOOST_TEST(s.is_host == e.host);
          BOOST_TEST(s.run_rank == e.run_rank);
          BOOST_TEST(s.run_world == e.run_world);
          BOOST_TEST(s.opts.run_id == e.run_id);
          BOOST_TEST(s.run_name == e.run_name);
          BOOST_TEST(s.opts.group == "torchrun-job-7");
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(names_of_node_and_rank_runs_without_a_name) {
  // Without a name, a run per node or per rank is named after the group.
  BOOST_TEST(resolve_ok(with_mode(Mode::per_rank, Scope::global), torchrun(3, 4, 2)).run_name == "torchrun-job-7-rank-3");
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::node), torchrun(3, 4, 2)).run_name == "torchrun-job-7-node-1");
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::global), torchrun(3, 4, 2)).run_name.empty());
  // Without a run id, the host makes one up: nothing is appended to nothing.
  BOOST_TEST(resolve_ok(with_mode(Mode::per_rank, Scope::global), torchrun(3, 4, 2)).opts.run_id.empty());
}

BOOST_AUTO_TEST_CASE(mode_and_scope_from_the_environment_place_the_rank) {
  const core::Settings s =
      resolve_ok(Options{}, with(torchrun(3, 4, 2), {{"CHORUS_MODE", "shared"}, {"CHORUS_SCOPE", "worker"}}));
  BOOST_TEST(s.active);
  BOOST_TEST(!s.is_host);
  BOOST_TEST(s.run_rank == 1);
  BOOST_TEST(s.run_world == 2);
}

// --- The group every rank derives alike --------------------------------------

BOOST_AUTO_TEST_CASE(group_default_is_the_same_on_every_rank) {
  struct Job {
    const char* what;
    std::function<Vars(int rank)> env;
    std::string group; // empty: only the same on every rank
  };
  const Job jobs[] = {
      {"torchrun --rdzv-id", [](int r) { return torchrun(r, 4, 2, "abc"); }, "torchrun-abc"},
      {"slurm", [](int r) { return slurm(r, "4242"); }, "slurm-4242"},
      {"torchrun inside an allocation", [](int r) { return with(torchrun(r, 4, 2, ""), {{"SLURM_JOB_ID", "99"}}); },
       "torchrun-99"},
      {"open mpi", [](int r) { return open_mpi(r, "3735683073"); }, "openmpi-3735683073"},
      {"job id with path characters", [](int r) { return torchrun(r, 4, 2, "a/b:c"); }, "torchrun-a-b-c"},
      {"torchrun without --rdzv-id", [](int r) { return torchrun(r, 4, 2, "none"); }, ""},
      {"mpich", [](int r) { return Vars{{"PMI_RANK", std::to_string(r)}, {"PMI_SIZE", "4"}}; }, ""},
  };
  for (const Job& job : jobs) {
    BOOST_TEST_CONTEXT(job.what) {
      std::set<std::string> groups;
      for (int r = 0; r < 4; ++r) groups.insert(resolve_ok(Options{}, job.env(r)).opts.group);
      BOOST_TEST(groups.size() == 1u);
      const std::string& g = *groups.begin();
      BOOST_TEST(!g.empty());
      BOOST_TEST(g.size() <= 128u);
      if (!job.group.empty()) BOOST_TEST(g == job.group);
    }
  }
}

BOOST_AUTO_TEST_CASE(group_without_a_job_id_follows_where_the_job_meets) {
  const auto group = [](const Vars& v) { return resolve_ok(Options{}, v).opts.group; };
  const std::string a = group(torchrun(0, 4, 2, ""));
  BOOST_TEST(a.rfind("torchrun-", 0) == 0u, a); // the launcher, for a person to tell jobs apart
  BOOST_TEST(group(torchrun(3, 4, 2, "")) == a);
  BOOST_TEST(group(with(torchrun(0, 4, 2, ""), {{"MASTER_PORT", "6001"}})) != a);
  BOOST_TEST(group(with(torchrun(0, 4, 2, ""), {{"MASTER_ADDR", "10.0.0.2"}})) != a);
}

BOOST_AUTO_TEST_CASE(group_for_one_process) {
  BOOST_TEST(resolve_ok(Options{}).opts.group == "default");
  Options o;
  o.run_id = "r1";
  BOOST_TEST(resolve_ok(o).opts.group == "r1");
  BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_RUN_ID", "r2"}}).opts.group == "r2");
  o.group = "mine";
  BOOST_TEST(resolve_ok(o).opts.group == "mine");
  BOOST_TEST(resolve_ok(o, {{"CHORUS_GROUP", "env"}}).opts.group == "env");
}

BOOST_AUTO_TEST_CASE(long_job_ids_give_a_group_within_the_limit) {
  const std::string g = resolve_ok(Options{}, torchrun(0, 2, 2, std::string(300, 'j'))).opts.group;
  BOOST_TEST(g.size() == 128u);
  BOOST_TEST(g.rfind("torchrun-jjj", 0) == 0u);
}

BOOST_AUTO_TEST_CASE(given_run_id_is_the_same_on_every_rank_of_a_shared_run) {
  std::set<std::string> ids;
  for (int r = 0; r < 4; ++r)
    ids.insert(resolve_ok(Options{}, with(torchrun(r, 4, 2), {{"CHORUS_RUN_ID", "exp-1"}, {"CHORUS_MODE", "shared"}}))
                   .opts.run_id);
  BOOST_TEST(ids.size() == 1u);
  BOOST_TEST(*ids.begin() == "exp-1");
}

// --- The run host's port and address ------------------------------------------

BOOST_AUTO_TEST_CASE(port_default_order) {
  // CHORUS_PORT, else Options::port, else MASTER_PORT + 1, else one derived
  // from the launcher's job id (below), else 29501.
  BOOST_TEST(resolve_ok(Options{}).port == 29501);
  BOOST_TEST(resolve_ok(Options{}, torchrun(0, 2, 2)).port == 6001);
  BOOST_TEST(resolve_ok(Options{}, with(torchrun(0, 2, 2), {{"CHORUS_PORT", "7000"}})).port == 7000);
  Options o;
  o.port = 8000;
  BOOST_TEST(resolve_ok(o, torchrun(0, 2, 2)).port == 8000);
  BOOST_TEST(resolve_ok(o, with(torchrun(0, 2, 2), {{"CHORUS_PORT", "7000"}})).port == 7000);
  BOOST_TEST(resolve_ok(Options{}, {{"MASTER_PORT", "1234"}}).port == 1235);
}

// Without a port named, two jobs on one node would meet on 29501: each job's
// ranks derive one from its id instead, all alike, apart from other jobs'.
constexpr int job_ports_first = 20000, job_ports_end = 29397;

BOOST_AUTO_TEST_CASE(without_a_port_named_every_rank_derives_the_same_from_the_job_id) {
  struct Launcher {
    const char* what;
    std::function<Vars(int rank, const std::string& job)> env;
    std::string named; // how messages name the job "j-1"
  };
  const Launcher launchers[] = {
      {"slurm", [](int r, const std::string& j) { return slurm(r, j); }, "slurm job j-1 step 0"},
      {"open mpi", open_mpi, "openmpi job j-1"},
      {"cray pmi", cray_pmi, "mpich job j-1"},
      {"torchrun without MASTER_PORT",
       [](int r, const std::string& j) {
         Vars v = torchrun(r, 4, 2, j);
         v.erase("MASTER_PORT");
         return v;
       },
       "torchrun job j-1"},
  };
  for (const Launcher& l : launchers) {
    BOOST_TEST_CONTEXT(l.what) {
      std::set<int> ports;
      for (int r = 0; r < 4; ++r) {
        const core::Settings s = resolve_ok(Options{}, l.env(r, "j-1"));
        ports.insert(s.port);
        BOOST_TEST(s.port_job == l.named);
        BOOST_TEST(core::port_name(s, s.port) == "CHORUS_PORT " + std::to_string(s.port) + ", derived from the " + l.named);
      }
      BOOST_REQUIRE(ports.size() == 1u);
      // Below the kernel's ephemeral range (from 32768 by default) and torchrun's 29400 and 29500.
      BOOST_TEST(*ports.begin() >= job_ports_first);
      BOOST_TEST(*ports.begin() < job_ports_end);
      BOOST_TEST(resolve_ok(Options{}, l.env(0, "j-2")).port != *ports.begin());
    }
  }
}

BOOST_AUTO_TEST_CASE(jobs_numbered_one_after_another_and_their_steps_never_share_a_port) {
  // Slurm numbers jobs in order: those sharing a node are often close.
  std::map<int, std::string> owner;
  for (int job = 4200; job < 4300; ++job)
    for (int step : {0, 1, 2, 3}) {
      const std::string name = std::to_string(job) + "." + std::to_string(step);
      const int port = resolve_ok(Options{}, slurm(1, std::to_string(job), std::to_string(step))).port;
      BOOST_TEST((port >= job_ports_first && port < job_ports_end), name << ": " << port);
      const auto [at, alone] = owner.emplace(port, name);
      BOOST_TEST(alone, name << " and " << at->second << " share " << port);
    }
  // Open MPI's and PMIx's ids, torchrun's run ids: each its own.
  std::set<int> ports;
  const std::vector<Vars> jobs = {open_mpi(0, "1882980353"), open_mpi(0, "1882914817"),
                                  cray_pmi(0, "prterun-vm-7362@1"), cray_pmi(0, "prterun-vm-7363@1"),
                                  torchrun(0, 4, 2, "job-a"), torchrun(0, 4, 2, "job-b")};
  for (Vars v : jobs) {
    v.erase("MASTER_PORT");
    ports.insert(resolve_ok(Options{}, v).port);
  }
  BOOST_TEST(ports.size() == jobs.size());
}

BOOST_AUTO_TEST_CASE(a_named_port_wins_over_the_job_id) {
  const Vars job = slurm(0, "4242");
  const int derived = resolve_ok(Options{}, job).port;
  BOOST_TEST(derived != 29501);
  // torchrun's MASTER_PORT (the run host takes the next one), CHORUS_PORT, Options::port.
  for (const auto& [vars, port] : {std::pair{with(job, {{"MASTER_PORT", "6000"}}), 6001},
                                   std::pair{with(job, {{"CHORUS_PORT", "7000"}}), 7000},
                                   std::pair{with(job, {{"MASTER_PORT", "6000"}, {"CHORUS_PORT", "7000"}}), 7000}}) {
    const core::Settings s = resolve_ok(Options{}, vars);
    BOOST_TEST(s.port == port);
    BOOST_TEST(s.port_job.empty());
    BOOST_TEST(core::port_name(s, s.port) == "CHORUS_PORT " + std::to_string(port));
  }
  Options o;
  o.port = 8000;
  BOOST_TEST(resolve_ok(o, job).port == 8000);
  // A malformed CHORUS_PORT is still an error, not a reason to derive one.
  env_error(with(job, {{"CHORUS_PORT", "29501x"}}), {"CHORUS_PORT='29501x' is not a port", "1..65535"});
  env_error(with(job, {{"CHORUS_PORT", "0"}}), {"CHORUS_PORT='0' is not a port"});
  // Without a job id (Hydra's mpiexec, one process) the default stays.
  BOOST_TEST(resolve_ok(Options{}, {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}).port == 29501);
  BOOST_TEST(resolve_ok(Options{}, {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}).port_job.empty());
  // Node runs on one machine take the derived port plus the node's index.
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::node), slurm(3, "4242")).port == derived + 1);
}

BOOST_AUTO_TEST_CASE(master_port_65535_leaves_no_port) {
  resolve_error(Options{}, with(torchrun(0, 2, 2), {{"MASTER_PORT", "65535"}}), Errc::bad_environment,
                {"MASTER_PORT=65535", "CHORUS_PORT"});
  BOOST_TEST(resolve_ok(Options{}, with(torchrun(0, 2, 2), {{"MASTER_PORT", "65535"}, {"CHORUS_PORT", "5000"}})).port ==
             5000);
}

BOOST_AUTO_TEST_CASE(node_runs_on_one_machine_get_a_port_each) {
  const Options o = with_mode(Mode::shared, Scope::node);
  BOOST_TEST(resolve_ok(o, torchrun(0, 4, 2)).port == 6001);
  BOOST_TEST(resolve_ok(o, torchrun(1, 4, 2)).port == 6001);
  BOOST_TEST(resolve_ok(o, torchrun(2, 4, 2)).port == 6002);
  BOOST_TEST(resolve_ok(o, torchrun(3, 4, 2)).port == 6002);
  // Global and automatic runs keep the base port.
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::global), torchrun(2, 4, 2)).port == 6001);
  BOOST_TEST(resolve_ok(with_mode(Mode::automatic, Scope::node), torchrun(2, 4, 2)).port == 6001);
  resolve_error(o, with(torchrun(2, 4, 2), {{"CHORUS_PORT", "65535"}}), Errc::bad_environment,
                {"65536", "past 65535", "CHORUS_PORT"});
}

BOOST_AUTO_TEST_CASE(host_address) {
  // One node: the run host is on this machine.
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::global), torchrun(1, 2, 2)).host_address == "127.0.0.1");
  // Several nodes: global rank 0 is at MASTER_ADDR, unless the options say otherwise.
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::global), torchrun(3, 4, 2)).host_address == "10.0.0.1");
  Options o = with_mode(Mode::shared, Scope::global);
  o.host_address = "head";
  BOOST_TEST(resolve_ok(o, torchrun(3, 4, 2)).host_address == "head");
  // A node's run is hosted on the node.
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::node), torchrun(3, 4, 2)).host_address == "127.0.0.1");
  // Slurm names rank 0's node in its node list.
  const Vars slurm{{"SLURM_PROCID", "3"},      {"SLURM_LOCALID", "1"},     {"SLURM_NTASKS", "4"},
                   {"SLURM_NODEID", "1"},      {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_ID", "1"},
                   {"SLURM_JOB_NODELIST", "gpu[07-08]"}};
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::global), slurm).host_address == "gpu07");
}

BOOST_AUTO_TEST_CASE(shared_run_across_nodes_needs_rank_0s_address) {
  const Vars mpi{{"OMPI_COMM_WORLD_RANK", "3"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  resolve_error(with_mode(Mode::shared, Scope::global), mpi, Errc::bad_environment,
                {"2 nodes", "MASTER_ADDR", "Options::host_address", "openmpi"});
  // Runs that no other node joins need no address.
  BOOST_TEST(resolve_ok(with_mode(Mode::per_rank, Scope::global), mpi).active);
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::node), mpi).host_address == "127.0.0.1");
}

BOOST_AUTO_TEST_CASE(two_hydra_jobs_on_one_node_derive_their_own_port_and_identity) {
  // Each job's ranks descend from its own hydra_pmi_proxy: the ranks of a
  // job agree on port, group and identity, and two jobs of one size differ.
  const auto job = [](const std::string& proxy) {
    std::set<int> ports;
    std::set<std::string> identities;
    core::Settings s;
    for (int r = 0; r < 4; ++r) {
      s = resolve_ok(with_mode(Mode::shared, Scope::global), hydra(r, 4, proxy));
      ports.insert(s.port);
      identities.insert(core::job_identity(s));
    }
    BOOST_TEST(ports.size() == 1u);
    BOOST_TEST(identities.size() == 1u);
    BOOST_TEST(s.opts.group == "mpich-hydra-" + proxy);
    BOOST_TEST(s.port_job == "mpich job hydra-" + proxy);
    BOOST_TEST((s.port >= job_ports_first && s.port < job_ports_end));
    return s;
  };
  const core::Settings a = job("4321-987654"), b = job("4388-987700");
  BOOST_TEST(a.port != b.port);
  BOOST_TEST(core::job_identity(a) != core::job_identity(b));
  // A port named still wins.
  BOOST_TEST(resolve_ok(Options{}, with(hydra(1, 4, "4321-987654"), {{"CHORUS_PORT", "7000"}})).port == 7000);
}

BOOST_AUTO_TEST_CASE(a_hydra_job_across_nodes_needs_a_port_named) {
  // Each node has its own proxy, so nothing names the job alike on every
  // rank: where its processes meet, a port must be named.
  const std::vector<std::string> words = {"Hydra", "names no job id", "2 nodes",
                                          "set CHORUS_PORT to the same free port on every rank", "MASTER_ADDR"};
  const Vars node1 = with(hydra(3, 2, "200-6000"), {{"MASTER_ADDR", "n1"}});
  for (const Options& o : {with_mode(Mode::shared, Scope::global), with_mode(Mode::shared, Scope::node),
                           with_mode(Mode::per_rank, Scope::global), with_mode(Mode::automatic, Scope::node)}) {
    BOOST_TEST_CONTEXT(to_string(o.mode) << " " << to_string(o.scope)) {
      resolve_error(o, node1, Errc::bad_environment, words);
      resolve_error(o, hydra(0, 2, "100-5000"), Errc::bad_environment, words);
      // Named by CHORUS_PORT, Options::port or MASTER_PORT, the job goes on.
      BOOST_TEST(resolve_ok(o, with(node1, {{"CHORUS_PORT", "7000"}})).port >= 7000);
      Options given = o;
      given.port = 8000;
      BOOST_TEST(resolve_ok(given, node1).port >= 8000);
      BOOST_TEST(resolve_ok(o, with(node1, {{"MASTER_PORT", "6000"}})).port >= 6001);
      // Inside a Slurm allocation, the allocation names the job.
      BOOST_TEST(resolve_ok(o, with(node1, {{"SLURM_JOB_ID", "4242"}})).port_job == "mpich job 4242");
    }
  }
  // Where no process meets another (global rank 0 alone logs), there is nothing to mix.
  BOOST_TEST(resolve_ok(with_mode(Mode::automatic, Scope::global), node1).port == 29501);
  // A job named by its launcher (Cray PMI's PMI_JOBID) needs no port named.
  BOOST_TEST(resolve_ok(with_mode(Mode::per_rank, Scope::global), cray_pmi(3, "j-1")).port_job == "mpich job j-1");
}

// --- The group of a job with several runs ---------------------------------------

BOOST_AUTO_TEST_CASE(a_job_with_several_runs_has_a_group_kept_by_global_rank_0) {
  // A run per rank: every rank is a member, its index its rank; the group
  // listens on the base port (no run of the job listens).
  for (int rank : {0, 3}) {
    const auto s = resolve_ok(with_mode(Mode::per_rank, Scope::global), torchrun(rank, 4, 2));
    BOOST_TEST(s.group_size == 4);
    BOOST_TEST(s.group_index == rank);
    BOOST_TEST(s.group_port == 6001);
    BOOST_TEST(s.group_address == "10.0.0.1"); // several nodes: global rank 0's
  }
  // A run per node: its index is the node; shared node runs take the base
  // port plus the node index, so the group takes the one after them.
  auto node_run = resolve_ok(with_mode(Mode::shared, Scope::node), torchrun(2, 6, 2));
  BOOST_TEST(node_run.group_size == 3);
  BOOST_TEST(node_run.group_index == 1);
  BOOST_TEST(node_run.group_port == 6001 + 3);
  auto auto_node = resolve_ok(with_mode(Mode::automatic, Scope::node), torchrun(2, 6, 2));
  BOOST_TEST(auto_node.group_size == 3);
  BOOST_TEST(auto_node.group_port == 6001);
  // One node: the group is on this machine.
  BOOST_TEST(resolve_ok(with_mode(Mode::per_rank, Scope::node), torchrun(1, 2, 2)).group_address == "127.0.0.1");
  Options o = with_mode(Mode::per_rank, Scope::global);
  o.host_address = "head";
  BOOST_TEST(resolve_ok(o, torchrun(3, 4, 2)).group_address == "head");
  // One run, no group: a global run, node runs of one node, a job of one process.
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::global), torchrun(3, 4, 2)).group_size == 0);
  BOOST_TEST(resolve_ok(with_mode(Mode::automatic, Scope::global), torchrun(0, 4, 2)).group_size == 0);
  BOOST_TEST(resolve_ok(with_mode(Mode::shared, Scope::node), torchrun(1, 2, 2)).group_size == 0);
  BOOST_TEST(resolve_ok(with_mode(Mode::per_rank, Scope::global)).group_size == 0);
  resolve_error(with_mode(Mode::shared, Scope::node), with(torchrun(0, 4, 2), {{"CHORUS_PORT", "65534"}}),
                Errc::bad_environment, {"group", "65536", "CHORUS_PORT"});
}

// --- Any environment -----------------------------------------------------------

BOOST_AUTO_TEST_CASE(any_environment_resolves_to_usable_settings_or_an_error) {
  const std::vector<std::pair<const char*, std::vector<const char*>>> choices = {
      {"CHORUS_MODE", {"auto", "shared", "new", "x"}},
      {"CHORUS_SCOPE", {"global", "worker", "x"}},
      {"CHORUS_PORT", {"1", "65535", "65534", "0", "x"}},
      {"CHORUS_RUN_ID", {"r", "../r", "r.1"}},
      {"CHORUS_GROUP", {"g", "..", "g h"}},
      {"CHORUS_PROJECT", {"p", "a/b"}},
      {"CHORUS_INIT_TIMEOUT", {"1", "0", "x"}},
      {"MASTER_PORT", {"6000", "65535", "65534"}},
      {"MASTER_ADDR", {"h", ""}},
      {"TORCHELASTIC_RUN_ID", {"none", "../j", "j"}},
  };
  std::uint64_t state = 0x2545f4914f6cdd1dull;
  const auto next = [&](std::size_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::size_t>((state >> 33) % n);
  };
  const auto name_ok = [](const std::string& s) {
    return !s.empty() && s.size() <= 140 && s.find('/') == std::string::npos && s != "." && s != "..";
  };
  int resolved = 0;
  for (int i = 0; i < 5000; ++i) {
    const int nodes = 1 + static_cast<int>(next(3)), per_node = 1 + static_cast<int>(next(3));
    const int world = nodes * per_node, rank = static_cast<int>(next(static_cast<std::size_t>(world)));
    Vars v = next(4) == 0 ? Vars{} : torchrun(rank, world, per_node, "");
    for (const auto& [name, values] : choices)
      if (next(2) == 0) v[name] = values[next(values.size())];
    const Result<core::Settings> outcome = core::resolve(Options{}, env_of(v));
    if (!outcome) {
      BOOST_TEST((outcome.error().code() == Errc::bad_environment), outcome.error().message());
      continue;
    }
    const core::Settings& s = *outcome;
    ++resolved;
    std::string env;
    for (const auto& [k, val] : v) env += k + "=" + val + " ";
    BOOST_TEST_CONTEXT(env) {
      BOOST_TEST(s.port >= 1);
      BOOST_TEST(s.run_world >= 1);
      BOOST_TEST((s.run_rank >= 0 && s.run_rank < s.run_world));
      BOOST_TEST((!s.is_host || s.run_rank == 0));
      BOOST_TEST((!s.is_host || s.active));
      BOOST_TEST(name_ok(s.opts.project));
      BOOST_TEST(name_ok(s.opts.group));
      BOOST_TEST((s.opts.run_id.empty() || name_ok(s.opts.run_id)));
      BOOST_TEST(fs::path(s.opts.dir).is_absolute());
      if (s.run_world > 1 && !s.is_host) BOOST_TEST(!s.host_address.empty());
    }
  }
  BOOST_TEST(resolved > 100);
}

BOOST_AUTO_TEST_CASE(link_liveness_from_the_environment) {
  const auto s = resolve_ok(Options{}, {{"CHORUS_HEARTBEAT_INTERVAL", "0.25"}, {"CHORUS_CONNECTION_TIMEOUT", "45"}});
  BOOST_TEST(s.opts.heartbeat_interval.count() == 250);
  BOOST_TEST(s.opts.connection_timeout.count() == 45'000);
  BOOST_TEST(resolve_ok(Options{}).opts.heartbeat_interval.count() == 1'000);
  BOOST_TEST(resolve_ok(Options{}).opts.connection_timeout.count() == 10'000);
  // A peer probed less often than the silence allowed would be dropped between probes.
  (void)env_error({{"CHORUS_CONNECTION_TIMEOUT", "0.5"}},
                  {"CHORUS_CONNECTION_TIMEOUT='0.5'", "CHORUS_HEARTBEAT_INTERVAL, 1 s", "more than the heartbeat"});
  (void)env_error({{"CHORUS_HEARTBEAT_INTERVAL", "20"}}, {"CHORUS_CONNECTION_TIMEOUT='10'", "CHORUS_HEARTBEAT_INTERVAL, 20 s"});
  Options o;
  o.connection_timeout = std::chrono::milliseconds(500);
  BOOST_TEST(resolve_ok(o, {{"CHORUS_CONNECTION_TIMEOUT", "2"}}).opts.connection_timeout.count() == 2'000);
}

// --- Upload settings --------------------------------------------------------

BOOST_AUTO_TEST_CASE(upload_settings_from_the_environment) {
  const auto s = resolve_ok(Options{}, {{"CHORUS_UPLOAD_TIMEOUT", "2.5"}, {"CHORUS_UPLOAD_BUFFER", "8"}});
  BOOST_TEST(s.opts.upload_timeout.count() == 2500);
  BOOST_TEST(s.opts.upload_buffer == std::size_t{8} << 20);
  BOOST_TEST(resolve_ok(Options{}).opts.upload_timeout.count() == 30'000);
  BOOST_TEST(resolve_ok(Options{}).opts.upload_buffer == std::size_t{4} << 20);
  for (const char* url : {"mlflow://h:5000", "mlflow+https://h:443", "mlflow+http://h:80", "wandb://api.wandb.ai",
                          "wandb+http://h:8080/team", "wandb+https://h/team"})
    BOOST_TEST(resolve_ok(Options{}, {{"CHORUS_UPLOAD", url}}).opts.upload == url, url);
  for (const char* v : {"0", "-1", "0.01", "2048", "4M", "abc"}) {
    BOOST_TEST_CONTEXT(v) { (void)env_error({{"CHORUS_UPLOAD_BUFFER", v}}, {"CHORUS_UPLOAD_BUFFER", "MiB"}); }
  }
  for (const char* v : {"0", "-3", "soon"}) {
    BOOST_TEST_CONTEXT(v) { (void)env_error({{"CHORUS_UPLOAD_TIMEOUT", v}}, {"CHORUS_UPLOAD_TIMEOUT", "seconds"}); }
  }
  // Credentials in the URL would land in run.json: refused, and not echoed.
  const std::string m = env_error({{"CHORUS_UPLOAD", "wandb://user:hunter2@h"}}, {"credentials", "WANDB_API_KEY"});
  BOOST_TEST(m.find("hunter2") == std::string::npos, m);
  (void)option_error([] {
    Options o;
    o.upload_buffer = 1000;
    return o;
  }(), {"Options::upload_buffer", "64 KiB"});
}

BOOST_AUTO_TEST_CASE(a_mistyped_upload_url_is_named_without_its_path) {
  // A webhook's path is its secret: a scheme typed wrong must not print it.
  const std::string secret = "T000/B000/XXXXsecretXXXX";
  for (const std::string& url : {"webhok://hooks.example.com/services/" + secret,
                                "hooks.example.com/services/" + secret, "webhok://user:pw@hooks.example.com/" + secret}) {
    BOOST_TEST_CONTEXT(url) {
      const std::string e = env_error({{"CHORUS_UPLOAD", url}}, {"hooks.example.com", "is not an upload target"});
      BOOST_TEST(e.find(secret) == std::string::npos, e);
      BOOST_TEST(e.find("pw") == std::string::npos, e);
    }
  }
  BOOST_TEST(core::shown_upload_url("webhook://hooks.example.com/services/" + secret) ==
             "webhook://hooks.example.com/\u2026");
  BOOST_TEST(core::shown_upload_url("mlflow://tracking:5000") == "mlflow://tracking:5000");
  BOOST_TEST(core::shown_upload_url("webhook://a:b@host:8443?x=1") == "webhook://***@host:8443/\u2026");
}
