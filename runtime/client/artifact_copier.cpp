#include "runtime/client/artifact_copier.hpp"

#include "io/store/artifacts.hpp"
#include "runtime/core/json.hpp"

#include <new>

namespace chorus::client {

ArtifactCopier::~ArtifactCopier() {
  {
    std::lock_guard lock(mu_);
    closed_ = stopping_ = true;
    abandon_.store(true, std::memory_order_relaxed);
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

Pending ArtifactCopier::push(Job job) {
  std::unique_lock lock(mu_);
  if (closed_)
    return Pending(&channel_,
                   channel_.immediate({Errc::finished, "log_artifact after finish: this run has finished and takes no "
                                                       "more artifacts; log them before calling finish()"}),
                   true);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  const std::uint64_t id = channel_.defer();
  queue_.emplace_back(id, std::move(job));
  busy_.fetch_add(1, std::memory_order_release);
  lock.unlock();
  cv_.notify_one();
  return Pending(&channel_, id, false);
}

void ArtifactCopier::close() noexcept {
  std::lock_guard lock(mu_);
  if (closed_) return;
  closed_ = true;
  closed_at_ = std::chrono::steady_clock::now();
}

bool ArtifactCopier::holds_finish() noexcept {
  if (busy_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(mu_);
  if (closed_ && std::chrono::steady_clock::now() - closed_at_ < finish_timeout_) return true;
  abandon_.store(true, std::memory_order_relaxed);
  return false;
}

Error ArtifactCopier::copy(const Job& job) {
  try {
    if (abandon_.load(std::memory_order_relaxed)) {
      std::string m = "artifact ";
      core::append_json_string(m, job.name);
      m.append(" was not copied: the run finished before its copy started (finish_timeout ran out); wait for "
               "log_artifact's ticket before finishing, or raise CHORUS_FINISH_TIMEOUT");
      return {Errc::timeout, std::move(m)};
    }
    if (job.check_here)
      if (Error e = store::check_run_dir_is_here(job.run_dir)) return e;
    store::ArtifactRecord rec;
    rec.name = job.name;
    rec.type = job.type;
    rec.rank = job.rank;
    rec.step = job.step;
    rec.ts_us = job.ts_us;
    return store::store_artifact(job.run_dir, job.source, rec, &abandon_);
  } catch (const std::bad_alloc&) {
    return {Errc::internal, "out of memory while copying an artifact"};
  }
}

void ArtifactCopier::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto [id, job] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    channel_.settle(id, copy(job));
    // Counted down only once settled: a finish that waits sees the ticket complete.
    busy_.fetch_sub(1, std::memory_order_release);
    lock.lock();
  }
}

} // namespace chorus::client
