// A launcher's environment for the tests of topology detection and options:
// a map of variables behind the lookup that core::resolve reads.
#pragma once

#include "runtime/core/options.hpp"

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::test {

using Vars = std::map<std::string, std::string, std::less<>>;

inline core::Env env_of(Vars vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

} // namespace chorus::test
