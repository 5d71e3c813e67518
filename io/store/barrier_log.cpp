#include "io/store/barrier_log.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/store/line_reader.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <fcntl.h>

namespace chorus::store {
namespace {

using simdjson::SUCCESS;

// A barrier of 65,536 ranks takes about 4 MiB a line: within max_line_bytes.

/// Unix seconds read back as microseconds.
bool seconds_us(simdjson::dom::element e, std::int64_t& us) {
  double s = 0;
  if (e.get_double().get(s) != SUCCESS || !std::isfinite(s) || std::fabs(s) > 9e12) return false;
  us = std::llround(s * 1e6);
  return true;
}

} // namespace

std::string barrier_line(const BarrierRecord& r) {
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("name").string(r.name).key("index").uinteger(r.index).key("step").integer(r.step);
  w.key("opened").seconds(r.opened_us).key("released").seconds(r.released_us).key("error");
  if (r.error.empty()) w.null();
  else w.string(r.error);
  w.key("ranks").begin_array();
  for (const BarrierRank& k : r.ranks) {
    w.begin_object().key("rank").integer(k.rank).key("arrived");
    if (k.arrived_us) w.seconds(*k.arrived_us).key("waited").seconds(*r.waited_us(k));
    else w.null().key("waited").null();
    w.end_object();
  }
  w.end_array().end_object();
  return out;
}

Result<BarrierRecord> parse_barrier_line(std::string_view line) {
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  if (auto e = parser.parse(line.data(), line.size()).get(o))
    return Error(Errc::invalid_argument, std::string("not JSON (") + simdjson::error_message(e) + ")");
  BarrierRecord r;
  std::string_view name;
  std::uint64_t index = 0;
  if (o["name"].get(name) != SUCCESS) return Error(Errc::invalid_argument, "no \"name\" string");
  r.name = name;
  if (o["index"].get(index) != SUCCESS) return Error(Errc::invalid_argument, "no whole \"index\"");
  r.index = index;
  if (o["step"].get(r.step) != SUCCESS) return Error(Errc::invalid_argument, "no whole \"step\"");
  if (!seconds_us(o["opened"], r.opened_us)) return Error(Errc::invalid_argument, "no \"opened\" time");
  if (!seconds_us(o["released"], r.released_us)) return Error(Errc::invalid_argument, "no \"released\" time");
  simdjson::dom::element err;
  if (o["error"].get(err) == SUCCESS && !err.is_null()) {
    std::string_view why;
    if (err.get(why) != SUCCESS) return Error(Errc::invalid_argument, "\"error\" is neither null nor a string");
    r.error = why;
  }
  simdjson::dom::array ranks;
  if (o["ranks"].get(ranks) != SUCCESS) return Error(Errc::invalid_argument, "no \"ranks\" array");
  for (simdjson::dom::element e : ranks) {
    BarrierRank k;
    std::int64_t rank = 0;
    if (e["rank"].get(rank) != SUCCESS || rank < 0 || rank > 1'000'000)
      return Error(Errc::invalid_argument, "a rank without a whole \"rank\"");
    k.rank = static_cast<int>(rank);
    simdjson::dom::element at;
    if (e["arrived"].get(at) == SUCCESS && !at.is_null()) {
      std::int64_t us = 0;
      if (!seconds_us(at, us)) return Error(Errc::invalid_argument, "rank " + std::to_string(rank) + "'s \"arrived\" is no time");
      k.arrived_us = us;
    }
    r.ranks.push_back(k);
  }
  return r;
}

BarrierLog::BarrierLog(std::string dir) : dir_(std::move(dir)) {}
BarrierLog::~BarrierLog() = default;

Error BarrierLog::append(const BarrierRecord& r) {
  if (!file_) {
    Result<std::unique_ptr<platform::AppendFile>> f = platform::AppendFile::open(dir_ + "/" + file_name, /*truncate=*/false);
    if (!f) return f.error();
    file_ = std::move(*f);
  }
  std::string line = barrier_line(r);
  line.push_back('\n');
  return file_->write(line);
}

Error BarrierLog::flush() { return file_ ? file_->flush() : Error{}; }
Error BarrierLog::sync() { return file_ ? file_->sync() : Error{}; }
Error BarrierLog::start_sync() { return file_ ? file_->start_sync() : Error{}; }

BarrierSummary BarrierLog::read(const std::string& dir, std::size_t keep) {
  BarrierSummary s;
  const std::string path = dir + "/" + file_name;
  const Result<int> fd = platform::open_regular(path, O_RDONLY, /*missing_ok=*/true);
  if (!fd) {
    s.missing = false;
    s.problem = fd.error();
    return s;
  }
  if (*fd < 0) return s;
  s.missing = false;
  LineReader lines(*fd, path, {}, {.chunk = 1u << 20, .max_line = max_line_bytes});
  std::deque<BarrierRecord> last;
  auto rank = [&](int r) -> BarrierSummary::Rank& {
    if (static_cast<std::size_t>(r) >= s.ranks.size()) {
      const std::size_t had = s.ranks.size();
      s.ranks.resize(static_cast<std::size_t>(r) + 1);
      for (std::size_t i = had; i < s.ranks.size(); ++i) s.ranks[i].rank = static_cast<int>(i);
    }
    return s.ranks[static_cast<std::size_t>(r)];
  };
  for (std::string_view line;;) {
    const LineReader::Next next = lines.next(line);
    if (next == LineReader::Next::end) break;
    if (next == LineReader::Next::too_long || next == LineReader::Next::failed) {
      s.problem = lines.error(); // a line too long: the lines after it are not read (store::line_too_long)
      break;
    }
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    Result<BarrierRecord> r = parse_barrier_line(line);
    if (!r) {
      if (s.skipped++ == 0) s.first_skipped = "line " + std::to_string(lines.cursor().lines) + ": " + r.error().message();
      continue;
    }
    ++s.total;
    if (!r->error.empty()) ++s.failed;
    // Who the others waited for: the last to arrive, or any that never did.
    std::optional<std::int64_t> latest;
    bool absent = false;
    for (const BarrierRank& k : r->ranks) {
      if (!k.arrived_us) absent = true;
      else if (!latest || *k.arrived_us > *latest) latest = k.arrived_us;
    }
    for (const BarrierRank& k : r->ranks) {
      BarrierSummary::Rank& t = rank(k.rank);
      ++t.barriers;
      if (!k.arrived_us) {
        ++t.absent;
        ++t.last;
        for (const BarrierRank& o : r->ranks)
          if (o.arrived_us) t.caused_s += static_cast<double>(*r->waited_us(o)) / 1e6;
        continue;
      }
      t.waited_s += static_cast<double>(*r->waited_us(k)) / 1e6;
      if (!absent && latest && *k.arrived_us == *latest && r->ranks.size() > 1) {
        ++t.last;
        for (const BarrierRank& o : r->ranks)
          if (o.arrived_us && o.rank != k.rank) t.caused_s += static_cast<double>(*latest - *o.arrived_us) / 1e6;
      }
    }
    last.push_back(std::move(*r));
    if (last.size() > keep) last.pop_front();
  }
  s.records.assign(std::make_move_iterator(last.begin()), std::make_move_iterator(last.end()));
  return s;
}

} // namespace chorus::store
