// Options as a process will use them: the environment applied, defaults
// filled in, and this process's place in the run worked out from the mode,
// the scope and the topology.
#pragma once

#include "runtime/core/result.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::core {

/// Looks up an environment variable; tests pass their own.
using Env = std::function<std::optional<std::string>(std::string_view name)>;
/// This process's environment; and, under `hydra_proxy`, its ancestry.
Env process_env();

/// Not an environment variable: the name under which an Env answers with
/// the MPICH Hydra proxy (hydra_pmi_proxy) this process descends from, as
/// "<pid>-<start ticks>" (nothing where there is none). Hydra names no job
/// id; on one node its proxy stands for the job, as every rank of the job
/// on that node descends from it. process_env() reads it from /proc, never
/// from a variable; tests pass their own.
inline constexpr std::string_view hydra_proxy = "/proc:hydra_pmi_proxy";

/// The words CHORUS_MODE, CHORUS_SCOPE and CHORUS_RESUME take (Flyte's,
/// and the C++ enum names beside them), and the Python package's mode=,
/// scope=, resume= and reduce= likewise; nothing for any other.
[[nodiscard]] std::optional<Mode> parse_mode(std::string_view text);
[[nodiscard]] std::optional<Scope> parse_scope(std::string_view text);
[[nodiscard]] std::optional<Resume> parse_resume(std::string_view text);
[[nodiscard]] std::optional<Reduce> parse_reduce(std::string_view text);
[[nodiscard]] std::optional<Summary> parse_summary(std::string_view text);
/// What they take, as an error names it.
inline constexpr std::string_view mode_takes = "auto, shared or new (or automatic, per_rank)";
inline constexpr std::string_view scope_takes = "global or worker (or node)";
inline constexpr std::string_view resume_takes = "never, allow or must";
inline constexpr std::string_view reduce_takes = "none, mean, sum, min, max or first";
inline constexpr std::string_view summary_takes = "last, min, max or mean";

/// Topology from the launcher's variables (see chorus.hpp). Precedence when
/// several launchers' variables are present: torchrun (RANK/WORLD_SIZE),
/// then Open MPI, then MPICH/PMI, then Slurm; PMI_RANK without Hydra's
/// MPI_LOCAL* inside an srun step is srun's PMI plugin, so Slurm's layout is
/// used. Malformed numbers, ranks out of range or contradictions
/// (LOCAL_RANK >= LOCAL_WORLD_SIZE, WORLD_SIZE not a multiple of
/// LOCAL_WORLD_SIZE where required, a local rank that does not fit ranks
/// filling nodes in order when no node index is given, ...) are errors
/// naming the variable and what it takes. Empty variables count as unset.
[[nodiscard]] Result<Topology> detect_topology(const Env& env);

struct Settings {
  Options opts;        // after CHORUS_* overrides; dir, group, name filled in
  Topology topo;
  // This process's place in its run:
  bool active = true;  // false: this rank logs nothing (an inactive handle)
  bool is_host = true; // this process hosts the Run actor
  int run_rank = 0;    // index of this rank within the run (0 on the host)
  int run_world = 1;   // ranks in the run
  std::string host_address; // where the run host listens (remote ranks dial it)
  std::uint16_t port = 0;   // the run host's port
  // The job the port was derived from ("openmpi job 1882980353"), where
  // nothing named it (CHORUS_PORT, Options::port, MASTER_PORT); else empty.
  std::string port_job;
  std::string run_name;     // display name, with -rank-R / -node-N where it applies
  // The job's group, where the job has several runs (a run per rank, or per
  // node on several nodes): their hosts report to the Group actor on global
  // rank 0 (README, "Modes and the environment"; io/store/group_file.hpp).
  int group_size = 0;        // runs in the job; 0: one run, no Group actor
  int group_index = 0;       // this run's place: its rank (per-rank runs) or node (per-node runs)
  std::string group_address; // where global rank 0 listens for them; empty: only its own node can
  std::uint16_t group_port = 0;
};

/// Applies the environment to `opts` (when opts.read_env), detects the
/// topology (unless opts.topology is set) and places this process. A
/// malformed value is an error that names the variable or option and the
/// values it takes.
[[nodiscard]] Result<Settings> resolve(const Options& opts, const Env& env);

/// How messages name one of the job's ports (the run host's, or one after
/// it): "CHORUS_PORT 29501", and where it was derived from the job's id,
/// which job that was.
std::string port_name(const Settings& s, std::uint16_t port);

/// The identity of the job a rank belongs to, as its joins carry it:
/// "field=value" lines: the launcher's job (or where it meets), the project,
/// the group (derived from the launcher's job id, or where the job meets),
/// the run's size, mode, scope and run id. A run host refuses a rank whose
/// identity differs from its own, and the refusal shows both.
std::string job_identity(const Settings& s);
/// An identity as one line for a message: "project a, group g, 4 ranks, ...".
std::string job_text(std::string_view identity);
/// Where two identities name the same launcher job but the ranks disagree
/// (a project set differently on one rank, say): the fields that differ, with
/// where each is set ("project "b" there, "a" on the run host (set by
/// ...)"); "" where they are different jobs.
std::string job_disagreement(std::string_view theirs, std::string_view ours);

} // namespace chorus::core
