// media.jsonl's lines and media/'s paths: see io/store/media_log.hpp.
#include "io/store/media_log.hpp"
#include "runtime/core/fnv.hpp"
#include "runtime/core/json.hpp"

#include <cstdio>

namespace chorus::store {

std::string media_path(std::string_view key, int rank, std::int64_t step, std::string_view ext) {
  std::string dir;
  for (char c : key.substr(0, 64)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == '_';
    dir.push_back(ok ? c : '_');
  }
  char hash[9];
  std::snprintf(hash, sizeof hash, "%08x", static_cast<unsigned>(chorus::core::fnv1a64(key) & 0xffffffffu));
  return "media/" + dir + "-" + hash + "/" + std::to_string(step) + "-rank" + std::to_string(rank) + "." +
         std::string(ext);
}

void append_media_line(std::string& out, std::int64_t step, std::int64_t ts_us, std::int64_t runtime_us,
                       std::string_view key, int rank, const chorus::core::Media& m, std::string_view path) {
  core::JsonWriter w(out);
  w.begin_object();
  w.key("_step").integer(step).key("_timestamp").seconds(ts_us).key("_runtime").seconds(runtime_us);
  w.key("key").string(key).key("rank").integer(rank).key("kind").string(to_string(m.kind));
  w.key("format").string(m.format).key("path").string(path).key("size").uinteger(m.data.size());
  if (!m.caption.empty()) w.key("caption").string(m.caption);
  if (m.kind == chorus::core::MediaKind::image) w.key("width").uinteger(m.width).key("height").uinteger(m.height);
  w.end_object();
  out.push_back('\n');
}

Result<MediaLine> read_media_line(const simdjson::dom::element& line) {
  using simdjson::SUCCESS;
  auto bad = [](std::string_view what) {
    return Error{Errc::invalid_argument, "a media.jsonl line " + std::string(what) +
                                             ": the file was not written by chorus, or was damaged; `chorus recover "
                                             "RUN` rebuilds it from the run's WAL"};
  };
  simdjson::dom::object o;
  if (line.get(o) != SUCCESS) return bad("is not a JSON object");
  MediaLine out;
  std::int64_t rank = -1;
  if (o["_step"].get(out.step) != SUCCESS || out.step < 0) return bad("has no whole _step of 0 or more");
  if (o["key"].get(out.key) != SUCCESS || out.key.empty()) return bad("has no key");
  if (o["rank"].get(rank) != SUCCESS || rank < 0 || rank > INT32_MAX) return bad("has no rank");
  out.rank = static_cast<int>(rank);
  if (o["kind"].get(out.kind) != SUCCESS || (out.kind != "image" && out.kind != "text" && out.kind != "table"))
    return bad("has no kind of image, text or table");
  if (o["format"].get(out.format) != SUCCESS) return bad("has no format");
  if (o["path"].get(out.path) != SUCCESS || !out.path.starts_with("media/") ||
      out.path.find("..") != std::string_view::npos)
    return bad("has no path under media/");
  if (o["size"].get(out.size) != SUCCESS) return bad("has no size");
  if (o["_timestamp"].get(out.timestamp) != SUCCESS) out.timestamp = 0;
  if (o["_runtime"].get(out.runtime) != SUCCESS) out.runtime = 0;
  if (o["caption"].get(out.caption) != SUCCESS) out.caption = {};
  std::uint64_t wide = 0, high = 0;
  if (o["width"].get(wide) == SUCCESS && o["height"].get(high) == SUCCESS && wide <= UINT32_MAX && high <= UINT32_MAX) {
    out.width = static_cast<std::uint32_t>(wide);
    out.height = static_cast<std::uint32_t>(high);
  }
  return out;
}

} // namespace chorus::store
