#include "python/reader.hpp"

#include "python/convert.hpp"
#include "python/events.hpp"

#include "cli/histogram_lines.hpp"
#include "cli/series.hpp"
#include "io/platform/posix.hpp"
#include "io/store/artifacts.hpp"
#include "io/store/event_log.hpp"
#include "io/store/history_row.hpp"
#include "io/store/json_lines.hpp"
#include "io/store/lease.hpp"
#include "io/store/line_reader.hpp"
#include "io/store/run_record.hpp"

#include <pybind11/stl.h>

#include <fcntl.h>

#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace chorus::python {
namespace {

py::object optional_int(const std::optional<std::int64_t>& v) {
  return v ? py::object(py::int_(*v)) : py::object(py::none());
}
py::object optional_seconds(const std::optional<std::int64_t>& us) {
  return us ? py::object(py::float_(store::RunRecord::seconds(*us))) : py::object(py::none());
}
py::dict exit_codes_dict(const store::ExitCodes& codes) {
  py::dict d;
  for (const auto& [rank, code] : codes) d[py::int_(rank)] = code;
  return d;
}

/// run.json as a dict, read through its owner as every reader reports it:
/// a run whose host is gone reads crashed (io/store/lease.hpp).
py::dict read_record(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string cut; // files a crash of the machine cut short after the run's end
  Result<store::RunRecord> read = [&] {
    py::gil_scoped_release unlocked;
    Result<store::RunRecord> r = store::RunRecord::read(path);
    if (r) cut = store::apply_liveness(*r, dir, platform::unix_now_us()).cut;
    return r;
  }();
  if (!read) {
    // A damaged run.json is a problem of the file, as for the other run files.
    Error e = read.error();
    raise(e.code() == Errc::invalid_argument ? Error(Errc::io_error, e.message()) : e);
  }
  const store::RunRecord& r = *read;
  if (!r.damage.empty())
    raise(Error(Errc::io_error, path + " is damaged (" + r.damage + "): `chorus recover` rebuilds it from the WAL"));
  py::dict d;
  d["id"] = r.id;
  d["name"] = r.name;
  d["project"] = r.project;
  d["group"] = r.group;
  d["job_type"] = r.job_type;
  d["notes"] = r.notes;
  d["mode"] = r.mode;
  d["scope"] = r.scope;
  d["host"] = r.host;
  d["pid"] = r.pid;
  d["dir"] = r.dir;
  d["launcher"] = r.launcher;
  d["job_id"] = r.job_id;
  d["nodes"] = r.nodes;
  d["group_index"] = optional_int(r.group_index);
  d["first_rank"] = optional_int(r.rank);
  d["node"] = optional_int(r.node);
  d["state"] = r.state;
  d["start_time"] = optional_seconds(r.start_us);
  d["end_time"] = optional_seconds(r.end_us);
  d["world_size"] = optional_int(r.world_size);
  d["rows"] = optional_int(r.rows);
  d["rejected"] = optional_int(r.rejected);
  d["error"] = r.error ? py::object(py::str(*r.error)) : py::object(py::none());
  d["files_cut"] = cut.empty() ? py::object(py::none()) : py::object(py::str(cut));
  d["exit_codes"] = r.exit_codes ? py::object(exit_codes_dict(*r.exit_codes)) : py::object(py::none());
  py::list ranks;
  for (const store::RunRecord::Rank& k : r.ranks) ranks.append(rank_dict(k.rank, k.state, k.last_step, k.host, k.message));
  d["ranks"] = ranks;
  py::list segments;
  for (const store::RunRecord::Segment& s : r.segments) {
    py::dict sd;
    sd["start_time"] = optional_seconds(s.start_us);
    sd["end_time"] = optional_seconds(s.end_us);
    sd["state"] = s.state;
    sd["exit_codes"] = s.exit_codes ? py::object(exit_codes_dict(*s.exit_codes)) : py::object(py::none());
    segments.append(sd);
  }
  d["segments"] = segments;
  return d;
}

/// The numeric columns of a JSON-lines file, NaN where a row has no value.
struct Columns {
  std::vector<std::string> names;
  std::vector<std::vector<double>> values;
  std::vector<std::vector<std::uint8_t>> present;
  std::unordered_map<std::string, std::size_t> index;
  std::size_t rows = 0;

  std::size_t column(std::string_view name) {
    auto it = index.find(std::string(name));
    if (it != index.end()) return it->second;
    const std::size_t c = names.size();
    names.emplace_back(name);
    values.emplace_back(rows, std::numeric_limits<double>::quiet_NaN());
    present.emplace_back(rows, 0);
    index.emplace(std::string(name), c);
    return c;
  }
  void set(std::size_t c, double v) {
    values[c].back() = v;
    present[c].back() = 1;
  }
  void new_row() {
    ++rows;
    for (std::size_t c = 0; c < names.size(); ++c) {
      values[c].push_back(std::numeric_limits<double>::quiet_NaN());
      present[c].push_back(0);
    }
  }
};

/// A column of numbers as the bytes of a NumPy array.
template <class T>
py::bytes column_bytes(const std::vector<T>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

/// `out`, with how the reading of its JSON-lines file went: the lines
/// skipped (and the first), an unfinished last line, the problem that
/// stopped it (an exception object, or None).
py::dict with_reading(py::dict out, const store::JsonLines& read) {
  out["skipped"] = read.skipped;
  out["first_skipped_line"] = read.first_skipped_line;
  out["first_skipped_why"] = read.first_skipped_why;
  out["unfinished"] = read.unfinished;
  out["problem"] = error_object(read.problem);
  return out;
}

/// _chorus.read_lines(path, keys, counts, history): the file's numeric
/// columns. `keys` (None: all) picks the keys kept besides those starting
/// with '_', as `chorus export --metric` does (cli/series.hpp's
/// metric_filter): a key and its per-rank columns, a glob, a /REGEX/. With
/// `history`, each line is read as a row by the store (store::HistoryRow: a line
/// that is none is skipped, and why is said), and with `counts` a reduced
/// key's `_count` becomes the column "_count/<key>".
py::dict read_lines(const std::string& path, const std::optional<std::vector<std::string>>& keys, bool counts,
                    bool history) {
  Columns cols;
  cli::KeyFilter filter;
  if (keys && keys->empty()) {
    filter = [](std::string_view) { return false; };
  } else if (keys) {
    Result<cli::KeyFilter> f = cli::metric_filter(*keys, "keys");
    if (!f) raise(f.error());
    filter = std::move(*f);
  }
  // Each key is matched once: a history repeats its keys on every row.
  std::unordered_map<std::string, bool> taken;
  const auto wanted = [&](std::string_view key) {
    auto it = taken.find(std::string(key));
    if (it == taken.end()) it = taken.emplace(std::string(key), !filter || filter(key)).first;
    return it->second;
  };
  store::JsonLines read;
  {
    py::gil_scoped_release unlocked;
    std::string count_key;
    read = store::read_json_lines(path, [&](const simdjson::dom::object& line) -> std::string_view {
      if (!history) {
        cols.new_row();
        for (auto [key, value] : line) {
          if (!store::reserved_key(key) && !wanted(key)) continue;
          if (std::optional<double> v = store::metric_value(value)) cols.set(cols.column(key), *v);
        }
        return {};
      }
      const store::HistoryRow row(line);
      if (!row) return row.why();
      cols.new_row();
      cols.set(cols.column("_step"), static_cast<double>(row.step()));
      if (const std::optional<double> t = row.timestamp()) cols.set(cols.column("_timestamp"), *t);
      if (const std::optional<double> t = row.runtime()) cols.set(cols.column("_runtime"), *t);
      for (const store::RowValue& v : row.metrics())
        if (wanted(v.key)) cols.set(cols.column(v.key), v.value);
      if (counts)
        for (const store::RowValue& n : row.counts())
          if (wanted(n.key)) cols.set(cols.column(count_key.assign("_count/").append(n.key)), n.value);
      return {};
    });
  }
  py::dict out;
  py::list names, values, present;
  for (std::size_t c = 0; c < cols.names.size(); ++c) {
    names.append(cols.names[c]);
    values.append(column_bytes(cols.values[c]));
    present.append(column_bytes(cols.present[c]));
  }
  out["names"] = names;
  out["values"] = values;
  out["present"] = present;
  out["rows"] = cols.rows;
  return with_reading(std::move(out), read);
}

/// _chorus.read_artifacts(path): artifacts.jsonl's entries, in the order
/// written, each read by the store's reader of the line.
py::dict read_artifacts(const std::string& path) {
  std::vector<store::ArtifactRecord> records;
  store::JsonLines read;
  {
    py::gil_scoped_release unlocked;
    read = store::read_json_lines(path, [&](const simdjson::dom::object& line) -> std::string_view {
      std::optional<store::ArtifactRecord> r = store::artifact_record(line);
      if (!r) return "no name";
      records.push_back(std::move(*r));
      return {};
    });
  }
  py::list entries;
  for (const store::ArtifactRecord& r : records) {
    py::dict e;
    e["name"] = r.name;
    e["type"] = r.type;
    e["size"] = r.size;
    e["sha256"] = r.sha256;
    e["rank"] = r.rank;
    e["step"] = r.step;
    e["timestamp"] = static_cast<double>(r.ts_us) / 1e6;
    entries.append(e);
  }
  py::dict out;
  out["entries"] = entries;
  return with_reading(std::move(out), read);
}

/// _chorus.read_histograms(path, key): histograms.jsonl's keys, in the order
/// they first appear, and the lines of `key` (every rank's column of it), or
/// of the one column `key` names ("act/rank-1"); None: the keys only. Each
/// line is read by the store's reader (store::read_histogram_line): a line it
/// refuses is skipped, and why is said.
py::dict read_histograms(const std::string& path, const std::optional<std::string>& key) {
  std::vector<std::string> keys;
  std::unordered_map<std::string, bool> seen;
  std::vector<std::int64_t> steps, counts, nans, infs, neg_infs;
  std::vector<std::optional<int>> ranks;
  std::vector<double> sums, mins, maxs;
  std::vector<std::vector<Histogram::Bucket>> buckets;
  store::JsonLines read;
  {
    py::gil_scoped_release unlocked;
    read = cli::read_histogram_lines(path, [&](const store::HistogramLine& h) {
      if (seen.emplace(std::string(h.key), true).second) keys.emplace_back(h.key);
      if (!key || (*key != h.key && (!key->starts_with(h.key) || *key != h.column()))) return;
      const Histogram& v = h.value;
      steps.push_back(h.step);
      ranks.push_back(h.rank);
      counts.push_back(static_cast<std::int64_t>(v.count()));
      sums.push_back(v.sum());
      mins.push_back(v.min());
      maxs.push_back(v.max());
      nans.push_back(static_cast<std::int64_t>(v.nan_count()));
      infs.push_back(static_cast<std::int64_t>(v.pos_inf_count()));
      neg_infs.push_back(static_cast<std::int64_t>(v.neg_inf_count()));
      buckets.push_back(v.buckets());
    });
  }
  py::list rank_list, bucket_list;
  for (const std::optional<int>& r : ranks) rank_list.append(r ? py::object(py::int_(*r)) : py::object(py::none()));
  for (const std::vector<Histogram::Bucket>& line : buckets) {
    py::list l;
    for (const Histogram::Bucket& b : line) l.append(py::make_tuple(b.lo, b.hi, b.count));
    bucket_list.append(l);
  }
  py::dict out;
  out["keys"] = keys;
  out["rows"] = steps.size();
  out["_step"] = column_bytes(steps);
  out["rank"] = rank_list;
  out["count"] = column_bytes(counts);
  out["sum"] = column_bytes(sums);
  out["min"] = column_bytes(mins);
  out["max"] = column_bytes(maxs);
  out["nan"] = column_bytes(nans);
  out["inf"] = column_bytes(infs);
  out["-inf"] = column_bytes(neg_infs);
  out["buckets"] = bucket_list;
  return with_reading(std::move(out), read);
}

/// _chorus.read_media(path, key, kind): media.jsonl's keys (with their
/// kinds), in the order they first appear, and the lines of `key` that are
/// of `kind` ("image", "text", "table"; None: any), column by column; a
/// line's path joined to the run directory. Each line is read by the
/// store's reader (store::read_media_line): a line it refuses is skipped, and
/// why is said.
py::dict read_media(const std::string& path, const std::optional<std::string>& key,
                    const std::optional<std::string>& kind) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::vector<std::pair<std::string, std::string>> keys;
  std::unordered_map<std::string, bool> seen;
  struct Entry {
    std::int64_t step;
    double timestamp;
    int rank;
    std::string kind, format, caption, path;
    std::uint64_t size;
    std::uint32_t width, height;
  };
  std::vector<Entry> entries;
  store::JsonLines read;
  {
    py::gil_scoped_release unlocked;
    read = cli::read_media_lines(path, [&](const store::MediaLine& m) {
      if (seen.emplace(std::string(m.key), true).second) keys.emplace_back(m.key, m.kind);
      if (!key || *key != m.key || (kind && *kind != m.kind)) return;
      entries.push_back({m.step, m.timestamp, m.rank, std::string(m.kind), std::string(m.format),
                         std::string(m.caption), dir + std::string(m.path), m.size, m.width, m.height});
    });
  }
  py::list key_list, rows;
  for (const auto& [k, what] : keys) key_list.append(py::make_tuple(k, what));
  for (const Entry& e : entries) {
    py::dict d;
    d["_step"] = e.step;
    d["_timestamp"] = e.timestamp;
    d["rank"] = e.rank;
    d["kind"] = e.kind;
    d["format"] = e.format;
    d["caption"] = e.caption.empty() ? py::object(py::none()) : py::object(py::str(e.caption));
    d["path"] = e.path;
    d["size"] = e.size;
    d["width"] = e.width > 0 ? py::object(py::int_(e.width)) : py::object(py::none());
    d["height"] = e.height > 0 ? py::object(py::int_(e.height)) : py::object(py::none());
    rows.append(d);
  }
  py::dict out;
  out["keys"] = key_list;
  out["entries"] = rows;
  return with_reading(std::move(out), read);
}

/// _chorus.read_events(path): events.jsonl's events, in the order the run
/// host told them, each line read by its one reader (store::parse_event_line):
/// a line it refuses is skipped, and why is said. Each entry is an event as
/// Run.on_event gives it (events.hpp's event_tuple).
py::dict read_events(const std::string& path) {
  std::vector<Event> events;
  store::JsonLines read;
  {
    py::gil_scoped_release unlocked;
    const Result<int> fd = platform::open_regular(path, O_RDONLY);
    if (!fd) {
      read.problem = fd.error();
    } else {
      store::LineReader lines(*fd, path, {}, {.chunk = 1u << 20, .max_line = store::max_line_bytes});
      for (std::string_view line;;) {
        const store::LineReader::Next next = lines.next(line);
        if (next == store::LineReader::Next::end) {
          const std::string_view rest = lines.rest();
          read.unfinished = rest.find_first_not_of(" \t\r") != std::string_view::npos;
          break;
        }
        if (next == store::LineReader::Next::too_long || next == store::LineReader::Next::failed) {
          read.problem = lines.error();
          break;
        }
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
          line.remove_suffix(1);
        if (line.empty()) continue;
        Result<store::EventLine> e = store::parse_event_line(line);
        if (!e) {
          if (read.skipped++ == 0) {
            read.first_skipped_line = lines.cursor().lines;
            read.first_skipped_why = e.error().message();
          }
          continue;
        }
        ++read.used;
        events.push_back(std::move(e->event));
      }
    }
  }
  py::list entries;
  for (const Event& e : events) entries.append(event_tuple(e));
  py::dict out;
  out["entries"] = entries;
  return with_reading(std::move(out), read);
}

std::string read_text(const std::string& path, bool missing_ok) {
  Result<std::string> text = [&] {
    py::gil_scoped_release unlocked;
    return platform::read_text(path, missing_ok);
  }();
  if (!text) raise(text.error());
  return *text;
}

} // namespace

void bind_reader(py::module_& m) {
  m.def("read_record", &read_record, py::arg("path"), "run.json as a dict (chorus.open's identity and ranks).");
  m.def("read_lines", &read_lines, py::arg("path"), py::arg("keys") = py::none(), py::arg("counts") = false,
        py::arg("history") = false, "The numeric columns of history.jsonl (history=True) or system.jsonl.");
  m.def("read_histograms", &read_histograms, py::arg("path"), py::arg("key") = py::none(),
        "histograms.jsonl's keys, and the lines of one key or column, column by column.");
  m.def("read_media", &read_media, py::arg("path"), py::arg("key") = py::none(), py::arg("kind") = py::none(),
        "media.jsonl's keys and kinds, and the lines of one key (of one kind), each a dict.");
  m.def("read_events", &read_events, py::arg("path"),
        "events.jsonl's events, in the order told, each as the tuple chorus.Event is made of.");
  m.def("read_artifacts", &read_artifacts, py::arg("path"), "artifacts.jsonl's entries, in the order written.");
  m.def("read_text", &read_text, py::arg("path"), py::arg("missing_ok") = false,
        "A run file's text (a regular file only, of bounded size).");
}

} // namespace chorus::python
