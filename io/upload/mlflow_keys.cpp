// Keys MLflow would refuse (io/upload/mlflow_backend.hpp): characters
// outside [\w./\- ], more than 250 bytes, '.', '..' or empty path segments,
// mapped deterministically to `<cleaned>-<hash>`; the mapping is kept in
// upload/<id>.keys.json.
#include "io/upload/mlflow_backend.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "runtime/core/fnv.hpp"
#include "runtime/core/json.hpp"

#include <cstdio>

namespace chorus::upload {
namespace {

bool key_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-' || c == ' ' || c == '/';
}

} // namespace

std::string mlflow_clean_key(std::string_view key) {
  std::string out;
  bool changed = false;
  std::size_t start = 0;
  while (start <= key.size()) {
    std::size_t slash = key.find('/', start);
    if (slash == std::string_view::npos) slash = key.size();
    std::string_view seg = key.substr(start, slash - start);
    start = slash + 1;
    if (seg.empty()) {
      changed = true; // a leading, trailing or doubled '/'
      continue;
    }
    if (!out.empty()) out.push_back('/');
    if (seg == "." || seg == "..") {
      out.append(seg.size(), '_');
      changed = true;
      continue;
    }
    for (unsigned char c : seg) {
      if (key_char(c)) {
        out.push_back(static_cast<char>(c));
      } else {
        changed = true;
        if (c < 0x80 || (c & 0xC0) == 0xC0) out.push_back('_'); // one '_' per character, not per byte
      }
    }
  }
  if (out.empty()) changed = true;
  if (!changed && out.size() <= mlflow_max_key) return out;
  char suffix[10];
  std::snprintf(suffix, sizeof suffix, "-%08x", chorus::core::fnv1a32(key));
  if (out.size() > mlflow_max_key - 9) out.resize(mlflow_max_key - 9);
  while (!out.empty() && out.back() == '/') out.pop_back();
  out += suffix;
  return out;
}

const std::string& MlflowBackend::map_key(std::string_view key) {
  auto it = keys_.find(key);
  if (it != keys_.end()) return it->second;
  std::string mapped = mlflow_clean_key(key);
  auto [pos, fresh] = keys_.emplace(std::string(key), std::move(mapped));
  if (pos->second != key) {
    mapped_.emplace_back(pos->first, pos->second);
    keys_dirty_ = true;
  }
  return pos->second;
}

void MlflowBackend::load_keys() {
  const std::string text = platform::read_text(keys_file_, true).value_or(std::string());
  if (text.empty()) return;
  simdjson::dom::element doc;
  simdjson::dom::object obj;
  if (parser_.parse(text).get(doc) != simdjson::SUCCESS || doc.get(obj) != simdjson::SUCCESS) return;
  for (auto f : obj) {
    std::string_view v;
    if (f.value.get(v) == simdjson::SUCCESS) {
      keys_.emplace(std::string(f.key), std::string(v));
      mapped_.emplace_back(std::string(f.key), std::string(v));
    }
  }
}

void MlflowBackend::save_keys() {
  if (!keys_dirty_) return;
  std::string out;
  core::JsonWriter w(out);
  w.begin_object();
  for (const auto& [k, v] : mapped_) w.key(k).string(v);
  w.end_object();
  out.push_back('\n');
  if (!platform::write_file_atomic(keys_file_, out)) keys_dirty_ = false;
}

} // namespace chorus::upload
