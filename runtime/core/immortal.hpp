// An object that is made and never destroyed: a static that threads other
// than the exiting one may still reach while the process exits.
//
// exit() runs the static destructors while every other thread goes on:
// CAF's multiplexer closing the links of ranks that exit at the same time,
// a run's drain, a handshake thread. A run whose handle is still held at
// the exit (a Python interpreter's, or one left by exit() itself) keeps
// those threads until the process is gone, so what they use must outlive
// the destructors. `static Immortal<T> x;` is made on first use, as a
// function-local static is, and registers no destructor.
#pragma once

#include <new>
#include <utility>

namespace chorus::core {

template <class T>
class Immortal {
public:
  template <class... Args>
  explicit Immortal(Args&&... args) {
    ::new (static_cast<void*>(storage_)) T(std::forward<Args>(args)...);
  }
  Immortal(const Immortal&) = delete;
  Immortal& operator=(const Immortal&) = delete;

  T& get() noexcept { return *std::launder(reinterpret_cast<T*>(storage_)); }
  const T& get() const noexcept { return *std::launder(reinterpret_cast<const T*>(storage_)); }
  T* operator->() noexcept { return &get(); }
  const T* operator->() const noexcept { return &get(); }
  T& operator*() noexcept { return get(); }
  const T& operator*() const noexcept { return get(); }

private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

} // namespace chorus::core
