// The options from any environment: the input is lines NAME=VALUE, the
// process's environment as resolve() sees it (CHORUS_* and the launchers'
// variables).
#include "runtime/core/options.hpp"

#include <map>
#include <string>

using namespace chorus;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::map<std::string, std::string, std::less<>> vars;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (std::size_t at = 0; at < text.size();) {
    std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(at, nl - at);
    if (const auto eq = line.find('='); eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
    at = nl + 1;
  }
  const core::Env env = [&](std::string_view name) -> std::optional<std::string> {
    if (auto it = vars.find(name); it != vars.end()) return it->second;
    return std::nullopt;
  };
  (void)core::detect_topology(env);
  Options o;
  o.read_env = true;
  (void)core::resolve(o, env);
  return 0;
}
