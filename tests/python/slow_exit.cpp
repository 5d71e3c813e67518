// Preloaded into a test job's ranks: on rank 0 (RANK), an exit handler
// registered before anything else, so that it runs after every static
// destructor, takes 500 ms, as a GPU library's own exit handler may.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

[[gnu::constructor]] void register_slow_exit() {
  const char* rank = std::getenv("RANK");
  if (rank != nullptr && std::strcmp(rank, "0") == 0)
    std::atexit([] { std::this_thread::sleep_for(std::chrono::milliseconds(500)); });
}

} // namespace
