// <chorus/asio.hpp>: tickets awaited from asio::awaitable coroutines resume on
// the coroutine's executor, with the ticket's result.
#define BOOST_TEST_MODULE e2e_asio
#include "local_run.hpp"

#include <chorus/asio.hpp>
#include <chorus/chorus.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <boost/test/unit_test.hpp>

#include <thread>

using namespace e2e;

namespace {

asio::awaitable<void> trainer(chorus::Run& run, std::thread::id loop_thread, chorus::FinishResult& out) {
  run.define_metric("loss", chorus::Reduce::mean);
  for (int step = 0; step < 5; ++step) {
    chorus::Error e = co_await chorus::async_wait(run.log({{"loss", step * 0.5}, {"lr", 0.1}}), asio::use_awaitable);
    BOOST_TEST(!e, e.message());
    BOOST_TEST((std::this_thread::get_id() == loop_thread));
  }
  chorus::Error bad = co_await chorus::async_wait(run.log({{"loss", 1.0}}, {.step = 0}), asio::use_awaitable);
  BOOST_TEST((bad.code() == chorus::Errc::backwards_step));
  std::string name = "end";
  chorus::Error e = co_await chorus::async_wait(run.barrier(name), asio::use_awaitable);
  BOOST_TEST(!e, e.message());
  out = co_await chorus::async_wait(run.finish(), asio::use_awaitable);
  BOOST_TEST((std::this_thread::get_id() == loop_thread));
}

} // namespace

BOOST_AUTO_TEST_CASE(tickets_resume_asio_coroutines_on_their_executor) {
  TempDir dir;
  chorus::Run run = chorus::init(e2e::local_options(dir, "asio"));

  asio::io_context io;
  chorus::FinishResult result;
  asio::co_spawn(io, trainer(run, std::this_thread::get_id(), result), asio::detached);
  io.run(); // returns once the coroutine is done: the pending waits keep it alive until then

  BOOST_TEST(!result.error, result.error.message());
  BOOST_TEST((result.state == chorus::RunState::finished));
  auto rows = read_history(result.run_dir);
  BOOST_REQUIRE_EQUAL(rows.size(), 5u);
  for (std::size_t s = 0; s < rows.size(); ++s) BOOST_TEST(rows[s].num.at("loss") == s * 0.5);
}
