// Asio interop: await a chorus ticket from an asio::awaitable coroutine, or
// with any other completion token. Header-only; include it only where Asio is.
//
//   chorus::Error e = co_await chorus::async_wait(run.log({{"loss", l}}), asio::use_awaitable);
//   chorus::FinishResult r = co_await chorus::async_wait(run.finish(), asio::use_awaitable);
//
// The handler runs on its associated executor (for use_awaitable: the
// coroutine's), never on a chorus thread.
#pragma once

#include <chorus/chorus.hpp>

#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include <memory>
#include <utility>

namespace chorus {

namespace detail {
template <class Ticket, class Result, class Token>
auto async_wait_impl(Ticket ticket, Token&& token) {
  return asio::async_initiate<Token, void(Result)>(
      [ticket](auto handler) {
        using H = decltype(handler);
        auto ex = asio::get_associated_executor(handler);
        // The work guard keeps the handler's executor alive until it runs.
        auto state = std::make_shared<std::pair<H, asio::executor_work_guard<decltype(ex)>>>(
            std::move(handler), asio::make_work_guard(ex));
        ticket.on_done([state](Result r) mutable {
          auto work = std::move(state->second);
          auto ex2 = work.get_executor();
          asio::post(ex2, [state, r = std::move(r)]() mutable { std::move(state->first)(std::move(r)); });
        });
      },
      token);
}
} // namespace detail

template <class Token>
auto async_wait(Pending ticket, Token&& token) {
  return detail::async_wait_impl<Pending, Error>(ticket, std::forward<Token>(token));
}

template <class Token>
auto async_wait(FinishPending ticket, Token&& token) {
  return detail::async_wait_impl<FinishPending, FinishResult>(ticket, std::forward<Token>(token));
}

} // namespace chorus
