// Where this process sits in the job, read from the launcher's environment.
//
// Each launcher names the same few counts differently; every launcher is read
// into one `Launch` (which variable holds which count), and one function
// derives what the launcher leaves out and checks that the counts agree, so
// every launcher gets the same rules and the same messages.
#include "runtime/core/options.hpp"

#include <charconv>
#include <climits>
#include <initializer_list>
#include <vector>

namespace chorus::core {

namespace {

constexpr std::string_view check_env = " Check the launcher's environment.";

/// A value as a message quotes it: long values are cut.
std::string quoted(std::string_view v) {
  // Built by appending: GCC 12's -Wrestrict misfires on "'" + std::string(...).
  std::string out(1, '\'');
  out.append(v.substr(0, 64)).append(v.size() > 64 ? "...'" : "'");
  return out;
}

std::string eq(std::string_view name, int value) { return std::string(name) + "=" + std::to_string(value); }

/// The launcher's variables, read through one checked path. An empty value
/// counts as unset (scripts export empty variables); the first malformed or
/// contradictory value becomes the error, and later reads see nothing.
class Vars {
public:
  explicit Vars(const Env& env) : env_(env) {}

  std::optional<std::string> text(std::string_view name) const {
    if (name.empty() || failed()) return std::nullopt;
    std::optional<std::string> v = env_(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  }
  bool has(std::string_view name) const { return text(name).has_value(); }

  /// The first of `names` that is set; else the first (messages name it).
  std::string_view first_set(std::initializer_list<std::string_view> names) const {
    for (std::string_view n : names)
      if (has(n)) return n;
    return *names.begin();
  }

  /// An integer in [min, max], or nothing if unset or malformed.
  std::optional<int> integer(std::string_view name, int min, int max, const std::string& takes) {
    const std::optional<std::string> v = text(name);
    if (!v) return std::nullopt;
    long long n = 0;
    const char* end = v->data() + v->size();
    const bool negative = (*v)[0] == '-';
    auto [p, ec] = std::from_chars(v->data() + (negative ? 1 : 0), end, n);
    const bool huge = ec == std::errc::result_out_of_range;
    const char* problem = nullptr;
    if (p == v->data() + (negative ? 1 : 0) || p != end || (ec != std::errc() && !huge))
      problem = "is not a number";
    else if (negative && (n != 0 || huge))
      problem = "is negative";
    else if (huge || n > max)
      problem = "is too large";
    else if (n < min)
      problem = "is too small";
    if (problem != nullptr) {
      fail(std::string(name) + "=" + quoted(*v) + " " + problem + ": " + std::string(name) + " " + takes + ".");
      return std::nullopt;
    }
    return static_cast<int>(n);
  }

  bool fail(const std::string& message) {
    if (!error_) error_ = Error(Errc::bad_environment, message + std::string(check_env));
    return false;
  }
  bool failed() const { return static_cast<bool>(error_); }
  /// The first malformed or contradictory value, named with its fix.
  const Error& error() const { return error_; }

private:
  const Env& env_;
  Error error_;
};

/// One count, with the variable it comes from.
struct Var {
  std::string_view name; // empty: this launcher has no such variable
  std::optional<int> value;
};

/// What one launcher says about where this process sits.
struct Launch {
  std::string_view launcher;
  Var rank, world, local_rank, local_world, node_rank, num_nodes;
  // Without a node index: how to start ranks so that they fill nodes in order.
  std::string_view in_order = "start the ranks so that they fill nodes in order of rank";
};

std::string nodes_name(const Launch& l) { return l.num_nodes.name.empty() ? "the number of nodes" : std::string(l.num_nodes.name); }

/// Reads the counts whose variables `l` names, except local_world when
/// `local_world_read` (Slurm spells it as a list).
void read_counts(Vars& v, Launch& l, bool local_world_read = false) {
  const std::string world(l.world.name), local_world(l.local_world.name);
  l.world.value = v.integer(l.world.name, 1, INT_MAX, "must be a positive integer: the number of ranks in the job");
  l.rank.value = v.integer(l.rank.name, 0, INT_MAX, "must be an integer in [0, " + world + ")");
  l.local_rank.value = v.integer(l.local_rank.name, 0, INT_MAX, "must be an integer in [0, " + local_world + ")");
  if (!local_world_read)
    l.local_world.value =
        v.integer(l.local_world.name, 1, INT_MAX, "must be a positive integer: the number of ranks on this node");
  l.num_nodes.value = v.integer(l.num_nodes.name, 1, INT_MAX, "must be a positive integer: the number of nodes");
  l.node_rank.value = v.integer(l.node_rank.name, 0, INT_MAX, "must be an integer in [0, " + nodes_name(l) + ")");
}

/// Fills `t` from `l`: derives what the launcher leaves out (no local
/// variables at all: one node, or ranks spread evenly over the nodes the
/// launcher names; no node index: ranks fill nodes in order) and rejects
/// counts that contradict each other.
bool place(Vars& v, const Launch& l, Topology& t) {
  if (v.failed()) return false;
  const std::string rank_n(l.rank.name), world_n(l.world.name), local_n(l.local_rank.name),
      lws_n(l.local_world.name), node_n(l.node_rank.name);
  if (!l.world.value)
    return v.fail(rank_n + " is set but " + world_n + " is not: a rank needs the size of the job it belongs to.");
  if (!l.rank.value) return v.fail(world_n + " is set but " + rank_n + " is not: each process needs its rank.");
  const int world = *l.world.value, rank = *l.rank.value;
  if (rank >= world)
    return v.fail(eq(rank_n, rank) + " is not below " + eq(world_n, world) + ": " + rank_n +
                  " must be an integer in [0, " + world_n + ").");
  if (l.num_nodes.value && *l.num_nodes.value > world)
    return v.fail(eq(l.num_nodes.name, *l.num_nodes.value) + " is more than " + eq(world_n, world) +
                  ": every node runs at least one rank.");

  int local = 0, lws = 0;
  if (!l.local_rank.value && !l.local_world.value) {
    const int nodes = l.num_nodes.value.value_or(1);
    if (world % nodes != 0)
      return v.fail(local_n + " and " + lws_n + " are not set, and " + eq(world_n, world) + " is not a multiple of " +
                    eq(l.num_nodes.name, nodes) + ": set both to say which ranks share a node.");
    lws = world / nodes;
    local = rank % lws;
  } else if (!l.local_rank.value) {
    return v.fail(lws_n + " is set but " + local_n + " is not: both are needed to know which ranks share a node.");
  } else if (!l.local_world.value) {
    return v.fail(local_n + " is set but " + lws_n + " is not: both are needed to know which ranks share a node.");
  } else {
    local = *l.local_rank.value;
    lws = *l.local_world.value;
    if (local >= lws)
      return v.fail(eq(local_n, local) + " is not below " + eq(lws_n, lws) + ": " + local_n +
                    " must be an integer in [0, " + lws_n + ").");
    if (lws > world)
      return v.fail(eq(lws_n, lws) + " is more than " + eq(world_n, world) + ": a node cannot run more ranks than "
                    "the job has.");
  }

  int nodes = 0;
  if (l.num_nodes.value) {
    nodes = *l.num_nodes.value;
  } else if (world % lws == 0) {
    nodes = world / lws;
  } else {
    return v.fail(eq(world_n, world) + " is not a multiple of " + eq(lws_n, lws) +
                  ", so the number of nodes is unknown" +
                  (l.num_nodes.name.empty() ? std::string(".") : ": set " + std::string(l.num_nodes.name) + "."));
  }
  if (nodes == 1 && lws != world)
    return v.fail(eq(lws_n, lws) + " differs from " + eq(world_n, world) + " in a job of one node: they must be " +
                  "equal.");

  int node = 0;
  if (l.node_rank.value) {
    node = *l.node_rank.value;
  } else if (nodes > 1) {
    if (world != static_cast<long long>(lws) * nodes)
      return v.fail("the ranks are not spread evenly over " + std::to_string(nodes) + " nodes (" + eq(world_n, world) +
                    ", " + eq(lws_n, lws) + "), so this node's index is unknown" +
                    (node_n.empty() ? std::string(".") : ": set " + node_n + "."));
    node = rank / lws;
    // A local rank the launcher gave must agree with ranks filling nodes in
    // order; otherwise (e.g. ranks dealt round-robin) the node index derived
    // here would be wrong and two ranks would both be one node's local rank 0.
    if (l.local_rank.value && rank % lws != local)
      return v.fail(eq(local_n, local) + " does not fit " + eq(rank_n, rank) + " with " + eq(lws_n, lws) +
                    " on each node and ranks filling nodes in order, so this node's index is unknown: " +
                    (node_n.empty() ? std::string(l.in_order) : "set " + node_n) + ".");
  }
  if (node >= nodes) // only a node index the launcher gave can be out of range
    return v.fail(eq(node_n, node) + " is not below " +
                  (l.num_nodes.value ? eq(l.num_nodes.name, nodes) : std::to_string(nodes) + " nodes") + ": " + node_n +
                  " must be an integer in [0, " + nodes_name(l) + ").");

  t.launcher = std::string(l.launcher);
  t.rank = rank;
  t.world_size = world;
  t.local_rank = local;
  t.local_world_size = lws;
  t.node_rank = node;
  t.num_nodes = nodes;
  return true;
}

bool from_torchrun(Vars& v, Launch& l, Topology& t) {
  if (!v.has("RANK") && !v.has("WORLD_SIZE")) return false;
  l = {"torchrun",           {"RANK", {}},       {"WORLD_SIZE", {}}, {"LOCAL_RANK", {}},
       {"LOCAL_WORLD_SIZE", {}}, {"GROUP_RANK", {}}, {"GROUP_WORLD_SIZE", {}}};
  read_counts(v, l);
  t.job_id = v.text("TORCHELASTIC_RUN_ID").value_or("");
  if (t.job_id == "none") t.job_id.clear(); // torchrun's placeholder without --rdzv-id
  return true;
}

bool from_openmpi(Vars& v, Launch& l, Topology& t) {
  if (!v.has("OMPI_COMM_WORLD_RANK") && !v.has("OMPI_COMM_WORLD_SIZE")) return false;
  // OMPI_COMM_WORLD_NODE_RANK is a rank among all of a node's jobs, not the
  // node's index: the index is derived (mpirun's default fills nodes in order).
  l = {"openmpi", {"OMPI_COMM_WORLD_RANK", {}}, {"OMPI_COMM_WORLD_SIZE", {}}, {"OMPI_COMM_WORLD_LOCAL_RANK", {}},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", {}}, {}, {},
       "map the ranks by slot, core or socket (mpirun --map-by slot), not by node"};
  read_counts(v, l);
  // Open MPI 4's mpirun names its job in OMPI_MCA_ess_base_jobid (and the
  // same number in PMIX_NAMESPACE), older ones in OMPI_MCA_orte_ess_jobid,
  // Open MPI 5 (PRRTE) in PMIX_NAMESPACE only.
  t.job_id =
      v.text(v.first_set({"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"})).value_or("");
  return true;
}

bool from_mpich(Vars& v, Launch& l, Topology& t) {
  if (!v.has("PMI_RANK") && !v.has("PMI_SIZE")) return false;
  // srun's PMI plugins set PMI_RANK and PMI_SIZE (Cray's also PMI_LOCAL_*)
  // but not the node index, which Slurm's own variables then give.
  if (!v.has("MPI_LOCALRANKID") && !v.has("MPI_LOCALNRANKS") && v.has("SLURM_PROCID")) return false;
  // Hydra names the node's counts MPI_LOCAL*, Cray PMI (PALS) PMI_LOCAL_*.
  l = {"mpich",
       {"PMI_RANK", {}},
       {"PMI_SIZE", {}},
       {v.first_set({"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}), {}},
       {v.first_set({"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}), {}},
       {},
       {},
       "place the ranks in blocks (mpiexec -ppn N), not round-robin (-rr)"};
  read_counts(v, l);
  // Cray PMI (PALS) and Slurm's PMI-2 name the job in PMI_JOBID, a PMIx
  // launcher in PMIX_NAMESPACE; Hydra names none (see hydra_job).
  t.job_id = v.text(v.first_set({"PMI_JOBID", "PMIX_NAMESPACE"})).value_or("");
  return true;
}

/// Slurm's tasks-per-node list, e.g. "4(x2),3": node 0 and 1 run 4 tasks,
/// node 2 runs 3. Returns the count for `node` and the number of nodes listed.
bool tasks_on_node(Vars& v, std::string_view name, std::optional<int> node, int& count, int& listed) {
  const std::string text = *v.text(name);
  const std::string takes = ": " + std::string(name) + " takes a list like '4(x2),3' (tasks on each node).";
  std::vector<std::pair<long long, long long>> runs; // (tasks, nodes)
  std::string_view s = text;
  long long total = 0;
  while (true) {
    long long tasks = 0, repeat = 1;
    auto r = std::from_chars(s.data(), s.data() + s.size(), tasks);
    if (r.ec != std::errc() || tasks < 1) return v.fail(std::string(name) + "=" + quoted(text) + " is malformed" + takes);
    s.remove_prefix(static_cast<std::size_t>(r.ptr - s.data()));
    if (s.starts_with("(x")) {
      s.remove_prefix(2);
      r = std::from_chars(s.data(), s.data() + s.size(), repeat);
      if (r.ec != std::errc() || repeat < 1 || r.ptr == s.data() + s.size() || *r.ptr != ')')
        return v.fail(std::string(name) + "=" + quoted(text) + " is malformed" + takes);
      s.remove_prefix(static_cast<std::size_t>(r.ptr - s.data()) + 1);
    }
    total += repeat;
    if (tasks > INT_MAX || total > INT_MAX) return v.fail(std::string(name) + "=" + quoted(text) + " is too large" + takes);
    runs.emplace_back(tasks, repeat);
    if (s.empty()) break;
    if (s[0] != ',') return v.fail(std::string(name) + "=" + quoted(text) + " is malformed" + takes);
    s.remove_prefix(1);
  }
  listed = static_cast<int>(total);
  const bool uniform = runs.size() == 1;
  if (!node && !uniform) return v.fail("SLURM_NODEID is not set, so " + std::string(name) + "=" + quoted(text) +
                                       " does not say how many tasks run on this node.");
  long long index = node.value_or(0);
  for (const auto& [tasks, repeat] : runs) {
    if (index < repeat) {
      count = static_cast<int>(tasks);
      return true;
    }
    index -= repeat;
  }
  return v.fail(eq("SLURM_NODEID", *node) + " is past the " + std::to_string(listed) + " nodes that " +
                std::string(name) + "=" + quoted(text) + " lists.");
}

/// The first host of a Slurm hostlist ("gpu[03-05,9],cpu1" -> "gpu03"): each
/// bracket gives its first number, padding kept. Empty if malformed.
std::string first_host(std::string_view list) {
  std::string host;
  std::size_t i = 0;
  while (i < list.size() && list[i] != ',') {
    if (list[i] == '[') {
      const std::size_t close = list.find(']', i);
      if (close == std::string_view::npos) return {};
      const std::string_view range = list.substr(i + 1, close - i - 1);
      host += range.substr(0, range.find_first_of("-,"));
      i = close + 1;
    } else {
      host += list[i++];
    }
  }
  return host;
}

/// The Slurm job this process runs in, and its step: two sruns of one
/// allocation may run side by side, each a job of its own ranks.
void slurm_job(const Vars& v, Topology& t) {
  t.job_id = v.text(v.first_set({"SLURM_JOB_ID", "SLURM_JOBID"})).value_or("");
  if (!t.job_id.empty()) t.job_step = v.text(v.first_set({"SLURM_STEP_ID", "SLURM_STEPID"})).value_or("");
}

bool from_slurm(Vars& v, Launch& l, Topology& t) {
  if (!v.has("SLURM_PROCID")) return false;
  // The step's counts (what srun started) come before the allocation's.
  l = {"slurm",
       {"SLURM_PROCID", {}},
       {v.first_set({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}), {}},
       {"SLURM_LOCALID", {}},
       {v.first_set({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}), {}},
       {"SLURM_NODEID", {}},
       {v.first_set({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}), {}}};
  read_counts(v, l, true);
  if (l.local_world.name == "SLURM_NTASKS_PER_NODE") {
    l.local_world.value = v.integer(l.local_world.name, 1, INT_MAX,
                                    "must be a positive integer: the number of tasks on each node");
  } else if (v.has(l.local_world.name)) {
    int count = 0, listed = 0;
    if (tasks_on_node(v, l.local_world.name, l.node_rank.value, count, listed)) {
      l.local_world.value = count;
      if (!l.num_nodes.value) l.num_nodes = {l.local_world.name, listed};
    }
  }
  slurm_job(v, t);
  // Task 0 runs on the step's first node under srun's block and cyclic layouts.
  for (std::string_view list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (!t.master_addr.empty()) break;
    if (auto nodes = v.text(list)) t.master_addr = first_host(*nodes);
  }
  if (t.master_addr.empty()) t.master_addr = v.text("SLURM_LAUNCH_NODE_IPADDR").value_or("");
  return true;
}

/// Hydra (MPICH's mpiexec) names no job id. On one node, every rank of a job
/// descends from the one proxy that started them (hydra_pmi_proxy, maybe
/// through a shell), so that proxy names the job: its pid, and its start
/// time against a later process given the pid. Across nodes each node has
/// its own proxy, and no id is the same on every rank (resolve() in
/// options.cpp refuses such a job where nothing names a port).
void hydra_job(const Vars& v, Topology& t) {
  if (t.launcher != "mpich" || !t.job_id.empty() || t.num_nodes != 1) return;
  if (auto proxy = v.text(hydra_proxy)) t.job_id = "hydra-" + *proxy;
}

} // namespace

Result<Topology> detect_topology(const Env& env) {
  Vars v(env);
  Topology t;
  t.launcher = "none";
  t.master_addr = v.text("MASTER_ADDR").value_or("");
  t.master_port = v.integer("MASTER_PORT", 1, 65535, "must be a port number in 1..65535").value_or(0);
  if (v.failed()) return v.error();

  Launch l;
  Topology found = t;
  const bool launched = from_torchrun(v, l, found) || from_openmpi(v, l, found) || from_mpich(v, l, found) ||
                        from_slurm(v, l, found);
  if (v.failed()) return v.error();
  if (!launched) return t;
  if (!place(v, l, found)) return v.failed() ? Result<Topology>(v.error()) : Result<Topology>(t);
  hydra_job(v, found);
  // An MPI job or torchrun without a run id inside a Slurm allocation is
  // still one job, and the allocation names it.
  if (found.job_id.empty() && found.launcher != "slurm") slurm_job(v, found);
  if (v.failed()) return v.error();
  return found;
}

} // namespace chorus::core
