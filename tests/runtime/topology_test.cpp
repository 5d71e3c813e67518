#define BOOST_TEST_MODULE runtime_topology
#include <boost/test/unit_test.hpp>

#include "runtime/core/options.hpp"
#include "tests/runtime/env.hpp"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

using namespace chorus;

namespace {

using test::env_of;
using test::Vars;

/// The topology `vars` give, and the error beside it (a default Topology where there is one).
Topology detect(const Vars& vars, Error& error) {
  Result<Topology> t = core::detect_topology(env_of(vars));
  error = t.error();
  return std::move(t).value_or(Topology{});
}

Topology detect_ok(const Vars& vars) {
  Error error;
  Topology t = detect(vars, error);
  BOOST_TEST(!error, "unexpected error: " << error.message());
  return t;
}

/// The error for `vars`; it must be Errc::bad_environment and mention every
/// one of `words` (the variable, the value, what it takes).
std::string detect_error(const Vars& vars, const std::vector<std::string>& words) {
  Error error;
  (void)detect(vars, error);
  BOOST_TEST(bool(error), "no error for a bad environment");
  BOOST_TEST((error.code() == Errc::bad_environment), "code: " << to_string(error.code()));
  for (const std::string& w : words)
    BOOST_TEST(error.message().find(w) != std::string::npos, "'" << w << "' not in: " << error.message());
  return error.message();
}

void check(const Topology& t, int rank, int world, int local, int local_world, int node, int nodes) {
  BOOST_TEST(t.rank == rank);
  BOOST_TEST(t.world_size == world);
  BOOST_TEST(t.local_rank == local);
  BOOST_TEST(t.local_world_size == local_world);
  BOOST_TEST(t.node_rank == node);
  BOOST_TEST(t.num_nodes == nodes);
}

Vars torchrun(int rank, int world, int local, int local_world, int group_rank) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"GROUP_RANK", std::to_string(group_rank)},
          {"GROUP_WORLD_SIZE", std::to_string(world / local_world)},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

Vars slurm_step() {
  return {{"SLURM_PROCID", "5"},         {"SLURM_LOCALID", "1"},          {"SLURM_NTASKS", "8"},
          {"SLURM_NODEID", "1"},         {"SLURM_NNODES", "2"},           {"SLURM_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_JOB_ID", "4242"},      {"SLURM_JOB_NODELIST", "gpu[03-04]"}};
}

Vars with(Vars base, const Vars& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

Vars without(Vars base, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names)
    if (auto it = base.find(n); it != base.end()) base.erase(it);
  return base;
}

} // namespace

// --- No launcher -----------------------------------------------------------

BOOST_AUTO_TEST_CASE(no_launcher_is_one_process) {
  const Topology t = detect_ok({{"PATH", "/usr/bin"}, {"HOME", "/root"}, {"LOCAL_RANK", "3"}});
  check(t, 0, 1, 0, 1, 0, 1);
  BOOST_TEST(t.launcher == "none");
  BOOST_TEST(t.job_id.empty());
  BOOST_TEST(t.master_addr.empty());
  BOOST_TEST(t.master_port == 0);
}

BOOST_AUTO_TEST_CASE(empty_launcher_variables_count_as_unset) {
  // Scripts export empty variables; an empty RANK and WORLD_SIZE start no job.
  const Topology t = detect_ok({{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_PORT", ""}, {"SLURM_PROCID", ""}});
  check(t, 0, 1, 0, 1, 0, 1);
  BOOST_TEST(t.launcher == "none");
}

BOOST_AUTO_TEST_CASE(master_address_without_a_launcher_is_kept) {
  const Topology t = detect_ok({{"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"}});
  BOOST_TEST(t.launcher == "none");
  BOOST_TEST(t.master_addr == "node7");
  BOOST_TEST(t.master_port == 1234);
}

// --- torchrun and Flyte Elastic ---------------------------------------------

BOOST_AUTO_TEST_CASE(torchrun_full_set) {
  Vars v = torchrun(5, 8, 1, 4, 1);
  v["TORCHELASTIC_RUN_ID"] = "job-17";
  const Topology t = detect_ok(v);
  check(t, 5, 8, 1, 4, 1, 2);
  BOOST_TEST(t.launcher == "torchrun");
  BOOST_TEST(t.master_addr == "10.0.0.1");
  BOOST_TEST(t.master_port == 29500);
  BOOST_TEST(t.job_id == "job-17");
}

BOOST_AUTO_TEST_CASE(torchrun_every_rank_of_two_nodes) {
  for (int rank = 0; rank < 8; ++rank) {
    BOOST_TEST_CONTEXT("rank " << rank) {
      const Topology t = detect_ok(torchrun(rank, 8, rank % 4, 4, rank / 4));
      check(t, rank, 8, rank % 4, 4, rank / 4, 2);
    }
  }
}

BOOST_AUTO_TEST_CASE(torchrun_without_a_run_id_has_no_job_id) {
  // torchrun's placeholder without --rdzv-id is the word "none".
  const Topology t = detect_ok(with(torchrun(0, 2, 0, 2, 0), {{"TORCHELASTIC_RUN_ID", "none"}}));
  BOOST_TEST(t.job_id.empty());
}

BOOST_AUTO_TEST_CASE(rank_and_world_size_alone_mean_one_node) {
  // What Flyte's PyTorch plugin and hand-written launchers often set.
  const Topology t = detect_ok({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
  check(t, 3, 4, 3, 4, 0, 1);
  BOOST_TEST(t.launcher == "torchrun");
}

BOOST_AUTO_TEST_CASE(torchrun_node_index_derived_when_group_rank_is_missing) {
  const Topology t = detect_ok(without(torchrun(6, 8, 2, 4, 1), {"GROUP_RANK", "GROUP_WORLD_SIZE"}));
  check(t, 6, 8, 2, 4, 1, 2);
}

BOOST_AUTO_TEST_CASE(torchrun_local_rank_that_does_not_fit_ranks_in_order_is_an_error) {
  // Without GROUP_RANK the node index is derived from ranks filling nodes in
  // order; RANK=5 with LOCAL_RANK=0 and 4 ranks a node contradicts that.
  Vars v = without(torchrun(5, 8, 0, 4, 1), {"GROUP_RANK", "GROUP_WORLD_SIZE"});
  detect_error(v, {"LOCAL_RANK=0", "RANK=5", "LOCAL_WORLD_SIZE=4", "GROUP_RANK"});
}

BOOST_AUTO_TEST_CASE(flyte_elastic_uses_torchrun_variables) {
  // Flyte's Elastic plugin runs torch.distributed.run: the same variables,
  // with the execution id as the rendezvous id.
  Vars v = torchrun(2, 4, 0, 2, 1);
  v["TORCHELASTIC_RUN_ID"] = "f1a2b3c4-n0-0";
  const Topology t = detect_ok(v);
  check(t, 2, 4, 0, 2, 1, 2);
  BOOST_TEST(t.job_id == "f1a2b3c4-n0-0");
}

// --- Slurm ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(slurm_srun_step) {
  const Topology t = detect_ok(slurm_step());
  check(t, 5, 8, 1, 4, 1, 2);
  BOOST_TEST(t.launcher == "slurm");
  BOOST_TEST(t.job_id == "4242");
  BOOST_TEST(t.master_addr == "gpu03"); // task 0 runs on the first node
  BOOST_TEST(t.master_port == 0);
}

BOOST_AUTO_TEST_CASE(slurm_step_of_the_job) {
  // Two sruns of one allocation run side by side: the step tells them apart.
  BOOST_TEST(detect_ok(slurm_step()).job_step.empty());
  BOOST_TEST(detect_ok(with(slurm_step(), {{"SLURM_STEP_ID", "3"}})).job_step == "3");
  BOOST_TEST(detect_ok(with(slurm_step(), {{"SLURM_STEPID", "4"}})).job_step == "4"); // the older spelling
  // An MPI job or torchrun without a run id inside an allocation is named
  // by the allocation and its step; with an id of its own, by that alone.
  const Vars mpi{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "2"}};
  BOOST_TEST(detect_ok(mpi).job_id == "4242");
  BOOST_TEST(detect_ok(mpi).job_step == "2");
  const Topology own = detect_ok(with(mpi, {{"PMIX_NAMESPACE", "prterun-vm-1@1"}}));
  BOOST_TEST(own.job_id == "prterun-vm-1@1");
  BOOST_TEST(own.job_step.empty());
}

BOOST_AUTO_TEST_CASE(slurm_uneven_tasks_per_node) {
  // 11 tasks: 4 on each of the first two nodes, 3 on the third; the node
  // count comes from the list when SLURM_NNODES is not set.
  const Topology t = detect_ok({{"SLURM_PROCID", "9"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NTASKS", "11"},
                                {"SLURM_NODEID", "2"},
                                {"SLURM_TASKS_PER_NODE", "4(x2),3"},
                                {"SLURM_JOBID", "77"}});
  check(t, 9, 11, 1, 3, 2, 3);
  BOOST_TEST(t.job_id == "77");
}

BOOST_AUTO_TEST_CASE(slurm_step_counts_come_before_the_allocation) {
  // srun -n 2 inside an allocation of 8 tasks on 2 nodes.
  Vars v = with(slurm_step(), {{"SLURM_PROCID", "1"},
                               {"SLURM_LOCALID", "1"},
                               {"SLURM_NODEID", "0"},
                               {"SLURM_STEP_NUM_TASKS", "2"},
                               {"SLURM_STEP_NUM_NODES", "1"},
                               {"SLURM_STEP_TASKS_PER_NODE", "2"},
                               {"SLURM_STEP_NODELIST", "gpu04"}});
  const Topology t = detect_ok(v);
  check(t, 1, 2, 1, 2, 0, 1);
  BOOST_TEST(t.master_addr == "gpu04");
}

BOOST_AUTO_TEST_CASE(slurm_without_tasks_per_node_spreads_ranks_evenly) {
  const Topology t = detect_ok({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_NNODES", "2"}});
  check(t, 6, 8, 2, 4, 1, 2);
}

BOOST_AUTO_TEST_CASE(slurm_ntasks_per_node) {
  const Topology t = detect_ok({{"SLURM_PROCID", "3"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NTASKS", "4"},
                                {"SLURM_NODEID", "1"},
                                {"SLURM_NTASKS_PER_NODE", "2"}});
  check(t, 3, 4, 1, 2, 1, 2);
}

BOOST_AUTO_TEST_CASE(master_addr_overrides_the_slurm_node_list) {
  const Topology t = detect_ok(with(slurm_step(), {{"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "6000"}}));
  BOOST_TEST(t.master_addr == "10.1.1.1");
  BOOST_TEST(t.master_port == 6000);
}

BOOST_AUTO_TEST_CASE(slurm_first_host_of_a_node_list) {
  const std::pair<std::string, std::string> lists[] = {
      {"gpu[03-05,9],cpu1", "gpu03"}, {"n1,n2", "n1"}, {"rack[2-3]-node[010-011]", "rack2-node010"}, {"single", "single"}};
  for (const auto& [list, first] : lists) {
    BOOST_TEST_CONTEXT(list) {
      const Topology t = detect_ok(with(slurm_step(), {{"SLURM_JOB_NODELIST", list}}));
      BOOST_TEST(t.master_addr == first);
    }
  }
}

BOOST_AUTO_TEST_CASE(slurm_bad_tasks_per_node) {
  for (const char* list : {"4(x2", "x", "4,,3", "0", "4(x0)", "4,", "-4", "4(y2)"}) {
    BOOST_TEST_CONTEXT(list) {
      detect_error(with(slurm_step(), {{"SLURM_TASKS_PER_NODE", list}}),
                   {"SLURM_TASKS_PER_NODE='" + std::string(list) + "'", "takes a list like"});
    }
  }
}

BOOST_AUTO_TEST_CASE(slurm_node_past_the_tasks_list) {
  detect_error(with(slurm_step(), {{"SLURM_NODEID", "2"}, {"SLURM_TASKS_PER_NODE", "4,4"}}),
               {"SLURM_NODEID=2", "SLURM_TASKS_PER_NODE"});
}

BOOST_AUTO_TEST_CASE(slurm_uneven_list_needs_the_node_id) {
  detect_error(without(with(slurm_step(), {{"SLURM_TASKS_PER_NODE", "5,3"}}), {"SLURM_NODEID"}),
               {"SLURM_NODEID is not set", "SLURM_TASKS_PER_NODE"});
}

// --- Open MPI and MPICH -------------------------------------------------------

BOOST_AUTO_TEST_CASE(open_mpi) {
  const Topology t = detect_ok({{"OMPI_COMM_WORLD_RANK", "3"},
                                {"OMPI_COMM_WORLD_SIZE", "4"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                // A rank across all of the node's jobs, not the node's index.
                                {"OMPI_COMM_WORLD_NODE_RANK", "0"},
                                {"OMPI_MCA_orte_ess_jobid", "3735683073"}});
  check(t, 3, 4, 1, 2, 1, 2);
  BOOST_TEST(t.launcher == "openmpi");
  BOOST_TEST(t.job_id == "3735683073");
}

BOOST_AUTO_TEST_CASE(open_mpi_4_job_id_as_debians_mpirun_sets_it) {
  // mpirun of Open MPI 4.1 names its job in OMPI_MCA_ess_base_jobid, and in
  // PMIX_NAMESPACE (the same number), not in OMPI_MCA_orte_ess_jobid.
  const Topology t = detect_ok({{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                {"OMPI_MCA_ess_base_jobid", "1882980353"},
                                {"PMIX_NAMESPACE", "1882980353"},
                                {"PMIX_RANK", "1"}});
  BOOST_TEST(t.launcher == "openmpi");
  BOOST_TEST(t.job_id == "1882980353");
  BOOST_TEST(t.job_step.empty());
}

BOOST_AUTO_TEST_CASE(open_mpi_5_job_id_from_pmix_namespace) {
  const Topology t = detect_ok({{"OMPI_COMM_WORLD_RANK", "0"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                {"PMIX_NAMESPACE", "prterun-host-1234@1"}});
  check(t, 0, 2, 0, 2, 0, 1);
  BOOST_TEST(t.job_id == "prterun-host-1234@1");
}

BOOST_AUTO_TEST_CASE(open_mpi_ranks_mapped_by_node_are_an_error) {
  // mpirun --map-by node deals ranks round-robin: rank 1 is local rank 0 of
  // node 1. Deriving node 0 from "ranks fill nodes in order" would put two
  // local ranks 0 on node 0, so the layout is refused.
  const std::string m = detect_error({{"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_RANK=1", "--map-by"});
  BOOST_TEST_MESSAGE(m);
}

BOOST_AUTO_TEST_CASE(mpich_hydra) {
  const Topology t = detect_ok({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}});
  check(t, 2, 4, 0, 2, 1, 2);
  BOOST_TEST(t.launcher == "mpich");
}

BOOST_AUTO_TEST_CASE(pmi_job_id) {
  // Cray PMI (PALS) names the job in PMI_JOBID, a PMIx launcher in
  // PMIX_NAMESPACE; Hydra names none.
  const Vars pmi{{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}};
  BOOST_TEST(detect_ok(with(pmi, {{"PMI_JOBID", "8131.pbs01"}})).job_id == "8131.pbs01");
  BOOST_TEST(detect_ok(with(pmi, {{"PMIX_NAMESPACE", "mpiexec-7@0"}})).job_id == "mpiexec-7@0");
  BOOST_TEST(detect_ok(with(pmi, {{"PMI_FD", "5"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}})).job_id.empty());
}

// Rank `rank` of a Hydra job of `world` ranks, `per_node` on each node,
// started by the proxy `proxy` ("<pid>-<start ticks>"; empty: none found).
Vars hydra(int rank, int world, int per_node, const std::string& proxy) {
  Vars v{{"PMI_RANK", std::to_string(rank)},
         {"PMI_SIZE", std::to_string(world)},
         {"PMI_FD", "5"},
         {"MPI_LOCALRANKID", std::to_string(rank % per_node)},
         {"MPI_LOCALNRANKS", std::to_string(per_node)}};
  if (!proxy.empty()) v[std::string(core::hydra_proxy)] = proxy;
  return v;
}

BOOST_AUTO_TEST_CASE(hydra_on_one_node_is_named_by_its_proxy) {
  // Every rank of the job descends from one hydra_pmi_proxy: its pid and start time name the job.
  for (int rank = 0; rank < 4; ++rank) {
    const Topology t = detect_ok(hydra(rank, 4, 4, "4321-987654"));
    check(t, rank, 4, rank, 4, 0, 1);
    BOOST_TEST(t.launcher == "mpich");
    BOOST_TEST(t.job_id == "hydra-4321-987654");
    BOOST_TEST(t.job_step.empty());
  }
  // Another job's proxy, or the pid again after a restart: another job.
  BOOST_TEST(detect_ok(hydra(0, 4, 4, "4322-987700")).job_id == "hydra-4322-987700");
  BOOST_TEST(detect_ok(hydra(0, 4, 4, "4321-990000")).job_id == "hydra-4321-990000");
  // Without local counts a PMI job is on one node, and the proxy names it too.
  BOOST_TEST(detect_ok({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {std::string(core::hydra_proxy), "7-8"}}).job_id ==
             "hydra-7-8");
  // No proxy found (started by hand, or another process manager): no id, as before.
  BOOST_TEST(detect_ok(hydra(1, 4, 4, "")).job_id.empty());
}

BOOST_AUTO_TEST_CASE(hydra_across_nodes_has_no_job_id) {
  // Each node has its own proxy: an id taken from it would differ between nodes.
  for (int rank = 0; rank < 4; ++rank) {
    const Topology t = detect_ok(hydra(rank, 4, 2, rank < 2 ? "100-5000" : "200-6000"));
    check(t, rank, 4, rank % 2, 2, rank / 2, 2);
    BOOST_TEST(t.job_id.empty());
  }
}

BOOST_AUTO_TEST_CASE(a_job_id_the_launcher_names_comes_before_the_proxy) {
  BOOST_TEST(detect_ok(with(hydra(1, 2, 2, "100-5000"), {{"PMI_JOBID", "8131.pbs01"}})).job_id == "8131.pbs01");
  BOOST_TEST(detect_ok(with(hydra(1, 2, 2, "100-5000"), {{"PMIX_NAMESPACE", "mpiexec-7@0"}})).job_id == "mpiexec-7@0");
  // Other launchers do not look at it.
  const Vars proxy{{std::string(core::hydra_proxy), "100-5000"}};
  BOOST_TEST(detect_ok(with(torchrun(1, 2, 1, 2, 0), proxy)).job_id.empty());
  BOOST_TEST(detect_ok(with(slurm_step(), proxy)).job_id == "4242");
  BOOST_TEST(detect_ok(proxy).launcher == "none");
  BOOST_TEST(detect_ok(proxy).job_id.empty());
}

BOOST_AUTO_TEST_CASE(hydra_inside_a_slurm_allocation) {
  // On one node, two mpiexec of one allocation are two jobs: the proxy names
  // each. Across nodes, the allocation names the job, as before.
  const Vars alloc{{"SLURM_JOB_ID", "4242"}};
  BOOST_TEST(detect_ok(with(hydra(1, 2, 2, "100-5000"), alloc)).job_id == "hydra-100-5000");
  BOOST_TEST(detect_ok(with(hydra(1, 2, 2, ""), alloc)).job_id == "4242");
  BOOST_TEST(detect_ok(with(hydra(3, 4, 2, "100-5000"), alloc)).job_id == "4242");
}

BOOST_AUTO_TEST_CASE(pmi_without_local_counts_is_one_node) {
  const Topology t = detect_ok({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}});
  check(t, 1, 3, 1, 3, 0, 1);
  BOOST_TEST(t.launcher == "mpich");
}

BOOST_AUTO_TEST_CASE(cray_pmi_local_counts) {
  // Cray PMI under PALS (mpiexec on PBS) names the node's counts PMI_LOCAL_*.
  const Topology t = detect_ok({{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"PMI_LOCAL_RANK", "1"}, {"PMI_LOCAL_SIZE", "4"}});
  check(t, 5, 8, 1, 4, 1, 2);
  BOOST_TEST(t.launcher == "mpich");
  detect_error({{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"PMI_LOCAL_RANK", "4"}, {"PMI_LOCAL_SIZE", "4"}},
               {"PMI_LOCAL_RANK=4 is not below PMI_LOCAL_SIZE=4"});
  // Under srun, Slurm's variables (which give the node index) still win.
  Vars srun = with(slurm_step(), {{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"PMI_LOCAL_RANK", "1"}, {"PMI_LOCAL_SIZE", "4"}});
  BOOST_TEST(detect_ok(srun).launcher == "slurm");
}

// --- Precedence --------------------------------------------------------------

BOOST_AUTO_TEST_CASE(torchrun_inside_srun_gives_torchrun_values) {
  // One torchrun per node started by srun: Slurm's task is the launcher,
  // torchrun's RANK is the worker.
  Vars v = with(slurm_step(), torchrun(6, 16, 2, 4, 1));
  v["SLURM_PROCID"] = "1";
  v["SLURM_NTASKS"] = "4";
  v["SLURM_TASKS_PER_NODE"] = "1(x4)";
  v["SLURM_NNODES"] = "4";
  v["GROUP_WORLD_SIZE"] = "4";
  const Topology t = detect_ok(v);
  check(t, 6, 16, 2, 4, 1, 4);
  BOOST_TEST(t.launcher == "torchrun");
  BOOST_TEST(t.master_addr == "10.0.0.1");
  // torchrun without --rdzv-id inside an allocation: the allocation names the job.
  BOOST_TEST(t.job_id == "4242");
  v["TORCHELASTIC_RUN_ID"] = "rdzv-1";
  BOOST_TEST(detect_ok(v).job_id == "rdzv-1");
}

BOOST_AUTO_TEST_CASE(open_mpi_inside_slurm_gives_open_mpi_values) {
  Vars v = with(slurm_step(), {{"OMPI_COMM_WORLD_RANK", "2"},
                               {"OMPI_COMM_WORLD_SIZE", "3"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  const Topology t = detect_ok(v);
  check(t, 2, 3, 2, 3, 0, 1);
  BOOST_TEST(t.launcher == "openmpi");
  BOOST_TEST(t.job_id == "4242");
}

BOOST_AUTO_TEST_CASE(torchrun_comes_before_mpi) {
  Vars v = with(torchrun(1, 2, 1, 2, 0), {{"OMPI_COMM_WORLD_RANK", "0"},
                                          {"OMPI_COMM_WORLD_SIZE", "1"},
                                          {"PMI_RANK", "0"},
                                          {"PMI_SIZE", "1"}});
  const Topology t = detect_ok(v);
  BOOST_TEST(t.launcher == "torchrun");
  BOOST_TEST(t.rank == 1);
}

BOOST_AUTO_TEST_CASE(open_mpi_comes_before_pmi) {
  const Topology t = detect_ok(
      {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "5"}});
  BOOST_TEST(t.launcher == "openmpi");
  check(t, 1, 2, 1, 2, 0, 1);
}

BOOST_AUTO_TEST_CASE(mpich_hydra_inside_slurm_gives_mpich_values) {
  Vars v = with(slurm_step(), {{"PMI_RANK", "3"}, {"PMI_SIZE", "6"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "3"}});
  const Topology t = detect_ok(v);
  BOOST_TEST(t.launcher == "mpich");
  check(t, 3, 6, 0, 3, 1, 2);
  BOOST_TEST(t.job_id == "4242");
}

BOOST_AUTO_TEST_CASE(srun_pmi_plugin_defers_to_slurm_for_the_layout) {
  // srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE, but the node layout is Slurm's.
  const Topology t = detect_ok(with(slurm_step(), {{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}}));
  BOOST_TEST(t.launcher == "slurm");
  check(t, 5, 8, 1, 4, 1, 2);
}

// --- Malformed values --------------------------------------------------------

BOOST_AUTO_TEST_CASE(malformed_numbers_name_the_variable_and_what_it_takes) {
  struct Case {
    const char* value;
    const char* problem;
  };
  const Case cases[] = {{"abc", "is not a number"},
                        {"-1", "is negative"},
                        {"3x", "is not a number"},
                        {"99999999999999999999", "is too large"},
                        {"-99999999999999999999", "is negative"},
                        {"3000000000", "is too large"},
                        {" 3", "is not a number"},
                        {"+3", "is not a number"},
                        {"0x3", "is not a number"},
                        {"3.0", "is not a number"},
                        {"-", "is not a number"}};
  struct Target {
    Vars base;
    const char* var;
    const char* takes;
  };
  const Target targets[] = {
      {torchrun(1, 4, 1, 2, 0), "RANK", "must be an integer in [0, WORLD_SIZE)"},
      {torchrun(1, 4, 1, 2, 0), "WORLD_SIZE", "must be a positive integer"},
      {torchrun(1, 4, 1, 2, 0), "LOCAL_RANK", "must be an integer in [0, LOCAL_WORLD_SIZE)"},
      {torchrun(1, 4, 1, 2, 0), "LOCAL_WORLD_SIZE", "must be a positive integer"},
      {torchrun(1, 4, 1, 2, 0), "GROUP_RANK", "must be an integer in [0, GROUP_WORLD_SIZE)"},
      {torchrun(1, 4, 1, 2, 0), "GROUP_WORLD_SIZE", "must be a positive integer"},
      {torchrun(1, 4, 1, 2, 0), "MASTER_PORT", "must be a port number in 1..65535"},
      {slurm_step(), "SLURM_PROCID", "must be an integer in [0, SLURM_NTASKS)"},
      {slurm_step(), "SLURM_LOCALID", "must be an integer in ["},
      {slurm_step(), "SLURM_NTASKS", "must be a positive integer"},
      {slurm_step(), "SLURM_NODEID", "must be an integer in [0, SLURM_NNODES)"},
      {slurm_step(), "SLURM_NNODES", "must be a positive integer"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK", "must be an integer in"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_SIZE", "must be a positive integer"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
       "OMPI_COMM_WORLD_LOCAL_RANK",
       "must be an integer in"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}},
       "OMPI_COMM_WORLD_LOCAL_SIZE",
       "must be a positive integer"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, "PMI_RANK", "must be an integer in [0, PMI_SIZE)"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, "PMI_SIZE", "must be a positive integer"},
  };
  for (const Target& target : targets) {
    for (const Case& c : cases) {
      BOOST_TEST_CONTEXT(target.var << "='" << c.value << "'") {
        Vars v = target.base;
        v[target.var] = c.value;
        const std::string m = detect_error(v, {std::string(target.var) + "='" + c.value + "' " + c.problem,
                                               std::string(target.var) + " " + target.takes});
        BOOST_TEST(m.find("Check the launcher's environment.") != std::string::npos, m);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(long_values_are_cut_in_messages) {
  const std::string m = detect_error({{"RANK", std::string(500, '7')}, {"WORLD_SIZE", "2"}}, {"RANK='777", "...'"});
  BOOST_TEST(m.size() < 300u, m);
}

BOOST_AUTO_TEST_CASE(zero_world_size) {
  detect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE='0' is too small", "positive integer"});
  detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "0"}},
               {"LOCAL_WORLD_SIZE='0'", "positive integer"});
  detect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}, {"SLURM_NTASKS='0'"});
  detect_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}, {"PMI_SIZE='0'"});
}

BOOST_AUTO_TEST_CASE(negative_zero_reads_as_zero) {
  check(detect_ok({{"RANK", "-0"}, {"WORLD_SIZE", "1"}}), 0, 1, 0, 1, 0, 1);
}

BOOST_AUTO_TEST_CASE(rank_not_below_world_size) {
  detect_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}, {"RANK=4 is not below WORLD_SIZE=4", "[0, WORLD_SIZE)"});
  detect_error({{"OMPI_COMM_WORLD_RANK", "9"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
               {"OMPI_COMM_WORLD_RANK=9 is not below OMPI_COMM_WORLD_SIZE=2"});
  detect_error(with(slurm_step(), {{"SLURM_PROCID", "8"}}), {"SLURM_PROCID=8 is not below SLURM_NTASKS=8"});
  detect_error({{"PMI_RANK", "3"}, {"PMI_SIZE", "3"}}, {"PMI_RANK=3 is not below PMI_SIZE=3"});
}

BOOST_AUTO_TEST_CASE(local_rank_not_below_local_world_size) {
  detect_error(torchrun(3, 4, 2, 2, 1), {"LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2", "[0, LOCAL_WORLD_SIZE)"});
  detect_error({{"OMPI_COMM_WORLD_RANK", "1"},
                {"OMPI_COMM_WORLD_SIZE", "2"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}},
               {"OMPI_COMM_WORLD_LOCAL_RANK=1 is not below OMPI_COMM_WORLD_LOCAL_SIZE=1"});
  detect_error(with(slurm_step(), {{"SLURM_LOCALID", "4"}}), {"SLURM_LOCALID=4 is not below SLURM_TASKS_PER_NODE=4"});
}

BOOST_AUTO_TEST_CASE(partial_sets) {
  detect_error({{"RANK", "0"}}, {"RANK is set but WORLD_SIZE is not"});
  detect_error({{"WORLD_SIZE", "2"}}, {"WORLD_SIZE is set but RANK is not"});
  // An empty RANK counts as unset, so the job has no rank.
  detect_error({{"RANK", ""}, {"WORLD_SIZE", "2"}}, {"WORLD_SIZE is set but RANK is not"});
  detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
               {"LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"});
  detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
               {"LOCAL_WORLD_SIZE is set but LOCAL_RANK is not"});
  detect_error({{"OMPI_COMM_WORLD_RANK", "0"}}, {"OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"});
  detect_error({{"OMPI_COMM_WORLD_SIZE", "2"}}, {"OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"});
  detect_error({{"PMI_RANK", "0"}}, {"PMI_RANK is set but PMI_SIZE is not"});
  detect_error({{"PMI_SIZE", "2"}}, {"PMI_SIZE is set but PMI_RANK is not"});
  detect_error({{"SLURM_PROCID", "0"}}, {"SLURM_PROCID is set but SLURM_STEP_NUM_TASKS is not"});
}

BOOST_AUTO_TEST_CASE(contradictory_node_counts) {
  // More ranks on a node than in the job.
  detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}},
               {"LOCAL_WORLD_SIZE=4 is more than WORLD_SIZE=2"});
  // The number of nodes does not follow from the counts.
  detect_error({{"RANK", "0"}, {"WORLD_SIZE", "6"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}},
               {"WORLD_SIZE=6 is not a multiple of LOCAL_WORLD_SIZE=4", "GROUP_WORLD_SIZE"});
  // More nodes than ranks.
  detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"GROUP_WORLD_SIZE", "3"}},
               {"GROUP_WORLD_SIZE=3 is more than WORLD_SIZE=2"});
  // One node, but it runs fewer ranks than the job has.
  detect_error(with(torchrun(0, 4, 0, 2, 0), {{"GROUP_WORLD_SIZE", "1"}}),
               {"LOCAL_WORLD_SIZE=2 differs from WORLD_SIZE=4"});
  // The node index is past the node count.
  detect_error(torchrun(4, 8, 0, 4, 2), {"GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"});
  detect_error(with(slurm_step(), {{"SLURM_NODEID", "2"}}), {"SLURM_NODEID=2"});
  // Ranks not spread evenly and no node index.
  detect_error({{"RANK", "0"}, {"WORLD_SIZE", "5"}, {"GROUP_WORLD_SIZE", "2"}},
               {"WORLD_SIZE=5 is not a multiple of GROUP_WORLD_SIZE=2"});
}

BOOST_AUTO_TEST_CASE(counts_near_int_max_do_not_overflow) {
  // Ranks per node times nodes is past INT_MAX here: checked, not wrapped.
  detect_error({{"RANK", "0"},
                {"WORLD_SIZE", "2147483647"},
                {"LOCAL_RANK", "0"},
                {"LOCAL_WORLD_SIZE", "2147483647"},
                {"GROUP_WORLD_SIZE", "2"}},
               {"not spread evenly over 2 nodes", "GROUP_RANK"});
  const Topology t = detect_ok({{"RANK", "2147483646"}, {"WORLD_SIZE", "2147483647"}});
  check(t, 2147483646, 2147483647, 2147483646, 2147483647, 0, 1);
}

BOOST_AUTO_TEST_CASE(master_port_out_of_range) {
  for (const char* port : {"0", "65536", "70000", "-1", "abc", "29500x", "99999999999999999999"}) {
    BOOST_TEST_CONTEXT(port) {
      detect_error(with(torchrun(0, 2, 0, 2, 0), {{"MASTER_PORT", port}}),
                   {"MASTER_PORT='" + std::string(port) + "'", "MASTER_PORT must be a port number in 1..65535"});
      // Read even without a launcher: it steers the run host's port.
      detect_error({{"MASTER_PORT", port}}, {"MASTER_PORT='" + std::string(port) + "'"});
    }
  }
  BOOST_TEST(detect_ok(with(torchrun(0, 2, 0, 2, 0), {{"MASTER_PORT", "65535"}})).master_port == 65535);
  BOOST_TEST(detect_ok(with(torchrun(0, 2, 0, 2, 0), {{"MASTER_PORT", "1"}})).master_port == 1);
}

BOOST_AUTO_TEST_CASE(the_first_bad_value_is_the_error) {
  Error error;
  (void)detect({{"MASTER_PORT", "x"}, {"RANK", "y"}, {"WORLD_SIZE", "z"}}, error);
  BOOST_TEST(error.message().find("MASTER_PORT") != std::string::npos, error.message());
  BOOST_TEST(error.message().find("RANK") == std::string::npos, error.message());
}

BOOST_AUTO_TEST_CASE(an_error_leaves_a_single_process_topology) {
  Error error;
  const Topology t = detect({{"RANK", "5"}, {"WORLD_SIZE", "2"}}, error);
  BOOST_TEST(bool(error));
  check(t, 0, 1, 0, 1, 0, 1);
}

// --- The process environment -------------------------------------------------

namespace {

/// Clears every variable a launcher sets for the test's lifetime and puts the
/// old values back after, so the test does not depend on how ctest was started.
struct CleanLauncherEnv {
  static constexpr const char* names[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
      "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid",
      "PMIX_NAMESPACE", "PMI_JOBID", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID",
      "SLURM_LOCALID", "SLURM_NTASKS",
      "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS", "SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
      "SLURM_STEP_NUM_NODES", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
      "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
      "SLURM_LAUNCH_NODE_IPADDR"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;

  CleanLauncherEnv() {
    for (const char* n : names) {
      const char* v = std::getenv(n);
      saved.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(n);
    }
  }
  ~CleanLauncherEnv() {
    for (const auto& [n, v] : saved) {
      if (v)
        ::setenv(n.c_str(), v->c_str(), 1);
      else
        ::unsetenv(n.c_str());
    }
  }
};

} // namespace

BOOST_FIXTURE_TEST_CASE(public_detect_reads_the_process_environment, CleanLauncherEnv) {
  Error error;
  Topology t = chorus::detect_topology(error);
  BOOST_TEST(!error, error.message());
  BOOST_TEST(t.launcher == "none");
  check(t, 0, 1, 0, 1, 0, 1);

  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  t = chorus::detect_topology(error);
  BOOST_TEST(!error, error.message());
  BOOST_TEST(t.launcher == "torchrun");
  check(t, 3, 4, 1, 2, 1, 2);

  ::setenv("LOCAL_RANK", "abc", 1);
  t = chorus::detect_topology(error);
  BOOST_TEST((error.code() == Errc::bad_environment));
  BOOST_TEST(error.message().find("LOCAL_RANK='abc'") != std::string::npos, error.message());
}

BOOST_FIXTURE_TEST_CASE(process_env_reads_set_unset_and_empty, CleanLauncherEnv) {
  const core::Env env = core::process_env();
  BOOST_TEST(!env("RANK").has_value());
  ::setenv("RANK", "", 1);
  BOOST_TEST((env("RANK") == std::optional<std::string>("")));
  ::setenv("RANK", "7", 1);
  BOOST_TEST((env("RANK") == std::optional<std::string>("7")));
}

BOOST_FIXTURE_TEST_CASE(process_env_reads_the_hydra_proxy_from_proc_only, CleanLauncherEnv) {
  // No hydra_pmi_proxy above this test (tests/e2e/two_jobs_test.cpp runs
  // ranks under one); a variable of that name is not read.
  const std::string name(core::hydra_proxy);
  ::setenv(name.c_str(), "1-2", 1);
  BOOST_TEST(!core::process_env()(core::hydra_proxy).has_value());
  ::setenv("PMI_RANK", "0", 1);
  ::setenv("PMI_SIZE", "1", 1);
  Error error;
  const Topology t = chorus::detect_topology(error);
  BOOST_TEST(!error, error.message());
  BOOST_TEST(t.launcher == "mpich");
  BOOST_TEST(t.job_id.empty());
  ::unsetenv(name.c_str());
}

// --- Any environment -----------------------------------------------------------

BOOST_AUTO_TEST_CASE(any_environment_gives_a_consistent_topology_or_an_error) {
  // Values near every boundary the checks draw; a detected topology must
  // always be one a run can be placed in.
  const char* const values[] = {"",  "0",  "1",  "2",  "3",   "4",        "7",          "8",          "-1",
                                "x", "2(x2)", "1,3", "4(x2),3", "65535", "2147483647", "2147483648", "1073741824"};
  const char* const names[] = {"RANK",          "WORLD_SIZE",           "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
                               "GROUP_RANK",    "GROUP_WORLD_SIZE",     "MASTER_PORT",         "OMPI_COMM_WORLD_RANK",
                               "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                               "PMI_RANK",      "PMI_SIZE",             "MPI_LOCALRANKID",     "MPI_LOCALNRANKS",
                               "SLURM_PROCID",  "SLURM_LOCALID",        "SLURM_NTASKS",        "SLURM_NODEID",
                               "SLURM_NNODES",  "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"};
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto next = [&](std::size_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::size_t>((state >> 33) % n);
  };
  int detected = 0;
  for (int i = 0; i < 20000; ++i) {
    Vars v;
    for (const char* n : names)
      if (next(3) == 0) v[n] = values[next(std::size(values))];
    Error error;
    const Topology t = detect(v, error);
    if (error) {
      BOOST_TEST((error.code() == Errc::bad_environment));
      BOOST_TEST(error.message().find("Check the launcher's environment.") != std::string::npos, error.message());
      continue;
    }
    ++detected;
    const bool ok = t.world_size >= 1 && t.rank >= 0 && t.rank < t.world_size && t.local_world_size >= 1 &&
                    t.local_world_size <= t.world_size && t.local_rank >= 0 && t.local_rank < t.local_world_size &&
                    t.num_nodes >= 1 && t.num_nodes <= t.world_size && t.node_rank >= 0 &&
                    t.node_rank < t.num_nodes && (t.num_nodes > 1 || t.local_world_size == t.world_size);
    if (!ok) {
      std::string env;
      for (const auto& [k, val] : v) env += k + "=" + val + " ";
      BOOST_TEST(ok, "inconsistent topology from " << env << "-> rank " << t.rank << "/" << t.world_size << " local "
                                                    << t.local_rank << "/" << t.local_world_size << " node "
                                                    << t.node_rank << "/" << t.num_nodes);
    }
  }
  BOOST_TEST(detected > 100); // the values do reach valid layouts
}
