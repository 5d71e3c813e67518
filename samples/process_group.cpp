#include "process_group.hpp"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace ddp {

namespace fs = std::filesystem;

struct ProcessGroup::Gloo {
  std::shared_ptr<gloo::rendezvous::Context> context;
  // Every rank runs the same collectives in the same order, so a counter
  // gives each one the same tag everywhere and keeps their messages apart.
  std::uint32_t next_tag = 0;

  template <class T>
  void allreduce(std::span<T> values, void (*reduce)(void*, const void*, const void*, std::size_t)) {
    gloo::AllreduceOptions opts(context);
    opts.setOutput(values.data(), values.size());
    opts.setReduceFunction(reduce);
    opts.setTag(next_tag++);
    gloo::allreduce(opts);
  }
};

ProcessGroup::ProcessGroup(int rank, int world_size, const GroupOptions& opts)
    : rank_(rank), world_size_(world_size) {
  if (world_size_ == 1) return;
  // Gloo sends with writev(2), which cannot ask for MSG_NOSIGNAL: without
  // this a peer that dies mid-collective kills us with SIGPIPE instead of
  // surfacing as an exception we can report.
  std::signal(SIGPIPE, SIG_IGN);

  gloo::transport::tcp::attr attr;
  if (!opts.iface.empty())
    attr.iface = opts.iface;
  else
    attr.hostname = opts.host;
  auto device = gloo::transport::tcp::CreateDevice(attr);

  // One directory per job: a FileStore never forgets keys, so a directory
  // shared with another job (or left by a crashed one) would hand out stale
  // addresses.
  const fs::path dir = fs::path(opts.store_dir) / ("chorus-ddp-" + opts.job_key);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    throw std::runtime_error("cannot create the Gloo rendezvous directory " + dir.string() + ": " + ec.message());

  gloo_ = std::make_unique<Gloo>();
  try {
    gloo::rendezvous::FileStore files(dir.string());
    // The prefix names this process group within the store, as torch's
    // ProcessGroupGloo does; the world size in it keeps a launch with another
    // world size from matching these keys.
    gloo::rendezvous::PrefixStore store("ddp_train/world-" + std::to_string(world_size_), files);
    gloo_->context = std::make_shared<gloo::rendezvous::Context>(rank_, world_size_);
    gloo_->context->setTimeout(opts.timeout);
    gloo_->context->connectFullMesh(store, device);
    // Once every rank is connected nobody reads the store again: remove it
    // now rather than at exit, so a later crash cannot leave it behind.
    barrier();
  } catch (const std::exception& e) {
    // A stale store would mislead the next launch that reuses this key.
    if (rank_ == 0) fs::remove_all(dir, ec);
    throw std::runtime_error("rendezvous of " + std::to_string(world_size_) + " ranks in " + dir.string() +
                             " failed (did every rank start, and do all see this directory?): " + e.what());
  }
  if (rank_ == 0) fs::remove_all(dir, ec);
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::average(std::span<float> values) {
  if (!gloo_) return;
  gloo_->allreduce(values, &gloo::sum<float>);
  const float inv = 1.0f / static_cast<float>(world_size_);
  for (float& v : values) v *= inv;
}

void ProcessGroup::sum(std::span<double> values) {
  if (gloo_) gloo_->allreduce(values, &gloo::sum<double>);
}

bool ProcessGroup::all_equal(std::uint64_t value) {
  if (!gloo_) return true;
  std::uint64_t low = value, high = value;
  gloo_->allreduce(std::span<std::uint64_t>(&low, 1), &gloo::min<std::uint64_t>);
  gloo_->allreduce(std::span<std::uint64_t>(&high, 1), &gloo::max<std::uint64_t>);
  return low == high;
}

void ProcessGroup::barrier() {
  if (!gloo_) return;
  gloo::BarrierOptions opts(gloo_->context);
  opts.setTag(gloo_->next_tag++);
  gloo::barrier(opts);
}

} // namespace ddp
