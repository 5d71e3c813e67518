// The one shape of chorus's fallible internals: a call that can fail returns
// its value or the Error that names the cause and the fix (Result<T>); a call
// with nothing to return returns the Error itself, empty where it succeeded.
// Out-parameters, `bool` with a `why` string and `optional` beside an
// `Error&` are not used for this. The public API keeps its own pinned forms
// (chorus::init(opts, error)).
#pragma once

#include <chorus/chorus.hpp>

#include <cassert>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

namespace chorus {

template <class T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, Error>, "a call that returns only an Error returns Error");

public:
  using value_type = T;

  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  /// A failure: `error` must be set.
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) { assert(std::get<1>(v_)); }
  Result(Errc code, std::string message) : Result(Error(code, std::move(message))) {}

  [[nodiscard]] bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  [[nodiscard]] T& value() & { return std::get<0>(v_); }
  [[nodiscard]] const T& value() const& { return std::get<0>(v_); }
  [[nodiscard]] T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The failure; empty where there is a value.
  [[nodiscard]] Error error() const& { return has_value() ? Error{} : std::get<1>(v_); }
  [[nodiscard]] Error error() && { return has_value() ? Error{} : std::get<1>(std::move(v_)); }

  /// The value, or `fallback` where the call failed.
  template <class U>
  [[nodiscard]] T value_or(U&& fallback) const& {
    return has_value() ? value() : static_cast<T>(std::forward<U>(fallback));
  }
  template <class U>
  [[nodiscard]] T value_or(U&& fallback) && {
    return has_value() ? std::move(*this).value() : static_cast<T>(std::forward<U>(fallback));
  }

private:
  std::variant<T, Error> v_;
};

} // namespace chorus
