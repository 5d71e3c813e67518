#include "cli/serve/media_index.hpp"

#include "io/store/json_lines.hpp"
#include "io/store/media_log.hpp"
#include "io/upload/http.hpp"

#include <simdjson.h>

#include <algorithm>
#include <mutex>
#include <tuple>

namespace chorus::cli::serve {
namespace {

/// Why a line's format does not go with its kind ("" where it does): an
/// image is a PNG or JPEG file, text markdown, a table JSON.
std::string misfit(const store::MediaLine& m) {
  const bool fits = m.kind == "image" ? m.format == "png" || m.format == "jpeg"
                    : m.kind == "text" ? m.format == "md"
                                       : m.format == "json";
  if (fits) return {};
  return "a media.jsonl line of kind " + std::string(m.kind) + " has format '" + std::string(m.format) +
         "' (an image is png or jpeg, text md, a table json)";
}

} // namespace

std::string_view media_content_type(std::string_view format) noexcept {
  if (format == "png") return "image/png";
  if (format == "jpeg") return "image/jpeg";
  if (format == "md") return "text/markdown; charset=utf-8";
  if (format == "json") return "application/json";
  return {};
}

MediaIndex::MediaIndex(std::string path, std::uint64_t step_bytes_)
    : file_(std::move(path)), step_bytes_(std::max<std::uint64_t>(step_bytes_, store::max_line_bytes + 1)) {}

bool MediaIndex::refresh() {
  std::unique_lock lock(mutex_);
  IndexState& s = file_.counts();
  simdjson::dom::parser parser;
  const auto forget = [&] {
    keys_.clear();
    entries_ = 0;
  };
  const bool changed = file_.follow(step_bytes_, forget, [&](std::string_view line, std::uint64_t) -> std::string {
    simdjson::dom::element doc;
    if (auto e = parser.parse(line.data(), line.size(), false).get(doc)) return simdjson::error_message(e);
    const Result<store::MediaLine> m = store::read_media_line(doc);
    if (!m) return m.error().message();
    if (std::string why = misfit(*m); !why.empty()) return why;
    auto it = keys_.find(m->key);
    if (it == keys_.end()) it = keys_.emplace(std::string(m->key), Key{std::string(m->kind), {}, {}}).first;
    Key& k = it->second;
    if (k.kind != m->kind)
      return "key " + std::string(m->key) + " holds " + k.kind + ", this line " + std::string(m->kind) +
             " (each kind keeps its own keys)";
    Entry e{.step = m->step,
            .rank = m->rank,
            .wall = m->timestamp,
            .rel = m->runtime,
            .size = m->size,
            .width = m->width,
            .height = m->height,
            .format = std::string(m->format),
            .path = std::string(m->path),
            .caption = std::string(m->caption)};
    // By step, then rank; a step of a rank named again (a recovered run) takes the later line.
    const auto at = std::lower_bound(k.entries.begin(), k.entries.end(), e, [](const Entry& a, const Entry& b) {
      return std::tie(a.step, a.rank) < std::tie(b.step, b.rank);
    });
    if (at != k.entries.end() && at->step == e.step && at->rank == e.rank) {
      *at = std::move(e);
    } else {
      k.entries.insert(at, std::move(e));
      ++entries_;
    }
    if (const auto r = std::lower_bound(k.ranks.begin(), k.ranks.end(), m->rank); r == k.ranks.end() || *r != m->rank)
      k.ranks.insert(r, m->rank);
    s.last_step = std::max(s.last_step, m->step);
    ++s.rows;
    return {};
  });
  s.keys = keys_.size();
  return changed;
}

IndexState MediaIndex::state() const {
  std::shared_lock lock(mutex_);
  return file_.state();
}

std::size_t MediaIndex::memory() const {
  std::shared_lock lock(mutex_);
  // Each entry's strings counted at a typical length: the index of a long run is not walked on every look.
  return sizeof *this + keys_.size() * (sizeof(Key) + 96) + entries_ * (sizeof(Entry) + 64);
}

void MediaIndex::keys_json(core::JsonWriter& w) const {
  std::shared_lock lock(mutex_);
  w.begin_array();
  for (const auto& [name, k] : keys_) {
    w.begin_object().key("key").string(name).key("kind").string(k.kind).key("ranks").begin_array();
    for (const int r : k.ranks) w.integer(r);
    w.end_array();
    std::size_t steps = 0;
    for (std::size_t i = 0; i < k.entries.size(); ++i) steps += i == 0 || k.entries[i].step != k.entries[i - 1].step;
    w.key("steps").uinteger(steps).key("entries").uinteger(k.entries.size());
    w.key("first_step").integer(k.entries.front().step).key("last_step").integer(k.entries.back().step);
    w.end_object();
  }
  w.end_array();
}

bool MediaIndex::key_json(std::string_view key, std::optional<std::int64_t> step, std::string_view run,
                          core::JsonWriter& w) const {
  std::shared_lock lock(mutex_);
  const auto it = keys_.find(key);
  if (it == keys_.end()) return false;
  const Key& k = it->second;
  const std::vector<Entry>& es = k.entries;
  // The step shown: the last at or before the one asked for (the first where none is).
  std::int64_t at = es.back().step;
  if (step) {
    const auto after =
        std::upper_bound(es.begin(), es.end(), *step, [](std::int64_t s, const Entry& e) { return s < e.step; });
    at = after == es.begin() ? es.front().step : std::prev(after)->step;
  }
  w.key("key").string(key).key("kind").string(k.kind).key("ranks").begin_array();
  for (const int r : k.ranks) w.integer(r);
  w.end_array().key("steps").begin_array();
  for (std::size_t i = 0; i < es.size(); ++i)
    if (i == 0 || es[i].step != es[i - 1].step) w.integer(es[i].step);
  w.end_array();
  w.key("first_step").integer(es.front().step).key("last_step").integer(es.back().step).key("at").integer(at);
  const std::string address = "/api/media/file?run=" + upload::url_encode(run) + "&key=" + upload::url_encode(key) + "&step=";
  w.key("entries").begin_array();
  const auto first =
      std::lower_bound(es.begin(), es.end(), at, [](const Entry& e, std::int64_t s) { return e.step < s; });
  for (auto e = first; e != es.end() && e->step == at; ++e) {
    w.begin_object().key("step").integer(e->step).key("rank").integer(e->rank);
    w.key("timestamp").number(e->wall).key("runtime").number(e->rel);
    w.key("format").string(e->format).key("size").uinteger(e->size).key("caption").string(e->caption);
    if (k.kind == "image") w.key("width").uinteger(e->width).key("height").uinteger(e->height);
    w.key("url").string(address + std::to_string(e->step) + "&rank=" + std::to_string(e->rank));
    w.end_object();
  }
  w.end_array();
  return true;
}

std::optional<MediaFile> MediaIndex::file(std::string_view key, std::int64_t step, int rank) const {
  std::shared_lock lock(mutex_);
  const auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  const std::vector<Entry>& es = it->second.entries;
  const auto e = std::lower_bound(es.begin(), es.end(), std::pair{step, rank}, [](const Entry& a, const auto& b) {
    return std::pair{a.step, a.rank} < b;
  });
  if (e == es.end() || e->step != step || e->rank != rank) return std::nullopt;
  return MediaFile{e->path, media_content_type(e->format), e->size};
}

} // namespace chorus::cli::serve
