// Tickets completed by the Channel: deferred tickets, settled one by one from
// another thread, beside the run host's acknowledgements.
#define BOOST_TEST_MODULE runtime_channel
#include <boost/test/unit_test.hpp>

#include "runtime/client/channel.hpp"

#include <chrono>
#include <future>
#include <thread>

using namespace chorus;
using chorus::client::Channel;

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)

BOOST_AUTO_TEST_CASE(a_deferred_ticket_completes_when_settled_with_its_own_result) {
  Channel ch;
  const Pending ok(&ch, ch.defer(), false);
  const Pending bad(&ch, ch.defer(), false);
  BOOST_TEST(!ok.ready());
  BOOST_TEST(!bad.ready());
  BOOST_TEST((ok.wait_for(std::chrono::milliseconds(10)).code() == Errc::timeout));

  std::promise<Error> called;
  bad.on_done([&](Error e) { called.set_value(std::move(e)); });
  std::thread settler([&] {
    ch.settle(ok.seq(), {});
    ch.settle(bad.seq(), {Errc::io_error, "disk full"});
  });
  BOOST_TEST(!ok.wait());
  const Error e = bad.wait();
  BOOST_TEST((e.code() == Errc::io_error));
  BOOST_TEST(e.message() == "disk full");
  BOOST_TEST(called.get_future().get().message() == "disk full");
  settler.join();
  // The ring's tickets are untouched by it.
  BOOST_TEST(!ch.ready(1));
}

BOOST_AUTO_TEST_CASE(a_lost_run_host_leaves_deferred_tickets_to_be_settled) {
  Channel ch;
  const Pending logged(&ch, 1, false);
  const Pending copy(&ch, ch.defer(), false);
  std::promise<Error> copied;
  copy.on_done([&](Error e) { copied.set_value(std::move(e)); });
  ch.fail({Errc::host_lost, "the run host went away"});
  BOOST_TEST(logged.ready());
  BOOST_TEST((logged.wait().code() == Errc::host_lost));
  BOOST_TEST(!copy.ready()); // the copy is this process's: it still completes on its own
  ch.settle(copy.seq(), {});
  BOOST_TEST(!copy.wait());
  BOOST_TEST(!copied.get_future().get());
}

BOOST_AUTO_TEST_CASE(a_coroutine_awaiting_a_deferred_ticket_resumes_on_its_executor) {
  Channel ch;
  const Pending copy(&ch, ch.defer(), false);
  std::thread settler([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ch.settle(copy.seq(), {Errc::invalid_argument, "no such file"});
  });
  const auto me = std::this_thread::get_id();
  std::thread::id resumed_on;
  const Error e = sync_wait([&]() -> task<Error> {
    Error got = co_await copy;
    resumed_on = std::this_thread::get_id();
    co_return got;
  }());
  BOOST_TEST((resumed_on == me));
  BOOST_TEST(e.message() == "no such file");
  settler.join();
}
