// RunSnapshot (io/upload/upload.hpp): run.json as the backends need it, as
// every reader reports it (io/store/lease.hpp): a run whose host is gone is
// crashed, and its end state goes up with what its files hold.
#include "io/upload/upload.hpp"

#include "io/store/lease.hpp"

#include <algorithm>
#include <cmath>

namespace chorus::upload {
namespace {

std::int64_t seconds_to_ms(double s) { return static_cast<std::int64_t>(std::llround(s * 1000.0)); }

} // namespace

Result<RunSnapshot> RunSnapshot::read(const std::string& run_dir) {
  const std::string path = run_dir + "/run.json";
  store::Liveness liveness;
  const Result<store::RunRecord> run = store::read_run_record(run_dir, &liveness);
  // Files a crash of the machine cut short go up once rebuilt, never as they are.
  if (!liveness.cut.empty()) return Error(Errc::io_error, run_dir + ": " + liveness.cut);
  if (!run) {
    const Error e = run.error();
    // A file that cannot be read at all may be in no run directory; a damaged one says how to rebuild it.
    return Error(Errc::io_error, e.code() == Errc::io_error ? e.message() + " (is " + run_dir + " a run directory?)"
                                                           : e.message());
  }
  if (run->id.empty())
    return Error(Errc::io_error, path + " has no run id: run `chorus recover " + run_dir + "` to rebuild it from the WAL");
  RunSnapshot r;
  static_cast<store::RunIdentity&>(r) = *run;
  r.dir = run_dir;
  if (r.name.empty()) r.name = r.id;
  r.state = run->state;
  if (run->start_us) r.start_ms = seconds_to_ms(store::RunRecord::seconds(*run->start_us));
  if (run->end_us) r.end_ms = seconds_to_ms(store::RunRecord::seconds(*run->end_us));
  r.attempts = run->segments.empty() ? 1 : run->segments.size();
  r.world_size = std::max<std::int64_t>(run->world_size.value_or(1), 1);
  r.ended = !r.state.empty() && r.state != "running";
  r.exit_code = r.state == "finished" ? 0 : r.state == "killed" ? 143 : 1;
  if (r.ended && run->exit_codes) {
    int worst = 0;
    for (const auto& [rank, c] : *run->exit_codes)
      if (c != 0 && (worst == 0 || c > worst)) worst = static_cast<int>(c);
    if (worst != 0 || r.state == "finished") r.exit_code = worst;
  }
  if (r.ended && r.end_ms == 0) r.end_ms = r.start_ms;
  return r;
}

} // namespace chorus::upload
