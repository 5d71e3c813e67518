#include "io/upload/tfevents.hpp"

#include "io/platform/crc32c.hpp"
#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/upload/tfevents_proto.hpp"

#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace chorus::upload {

std::uint32_t crc32c(std::span<const char> data, std::uint32_t crc) noexcept {
  return platform::crc32c(data.data(), data.size(), crc);
}

std::uint32_t masked_crc32c(std::span<const char> data) noexcept { return platform::mask_crc32c(crc32c(data)); }

namespace {

using namespace proto;

constexpr std::string_view elsewhere = "write the events to another directory";

Error file_error(std::string_view what, const std::string& path, int errnum) {
  return platform::os_error(what, path, errnum, elsewhere);
}

// mkdir -p, each new directory 0700 whatever the umask.
Error make_event_dir(const std::string& dir) {
  if (dir.empty())
    return Error{Errc::invalid_argument,
                 "the directory for TensorBoard events is empty: name one (it is created if missing)"};
  return platform::make_dirs(dir, elsewhere);
}

// Writes all of `data`, retrying after EINTR and short writes; 0 or the errno.
int write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t w = ::write(fd, data.data(), data.size());
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<std::size_t>(w));
  }
  return 0;
}

// The host name as a file name part: what is not a letter, digit, '.', '-'
// or '_' becomes '_'.
std::string host_part() {
  std::string host = platform::this_host();
  for (char& c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == '_';
    if (!ok) c = '_';
  }
  return host.empty() ? std::string("localhost") : host;
}

std::atomic<std::uint64_t> writers{0};

// A scalar as Summary.Value.simple_value holds it: a magnitude past the
// largest float is infinity (said here rather than left to the conversion).
float as_float(double v) {
  constexpr double largest = std::numeric_limits<float>::max();
  if (v > largest) return std::numeric_limits<float>::infinity();
  if (v < -largest) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(v);
}

} // namespace

Result<std::unique_ptr<TfEventsWriter>> TfEventsWriter::create(const std::string& dir, double wall_time_s) {
  if (Error e = make_event_dir(dir)) return e;
  const std::int64_t seconds = std::isfinite(wall_time_s) && wall_time_s >= 0 && wall_time_s < 9.2e18
                                   ? static_cast<std::int64_t>(wall_time_s)
                                   : platform::unix_now_us() / 1000000;
  const std::string stem = (dir.back() == '/' ? dir : dir + "/") + "events.out.tfevents." + std::to_string(seconds) +
                           "." + host_part() + "." + std::to_string(::getpid()) + ".";
  // A new file, never one already there: a name taken (by a writer of
  // another process that had this pid, say) moves on to the next n.
  std::string path;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    path = stem + std::to_string(writers.fetch_add(1, std::memory_order_relaxed));
    do {
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno != EEXIST) return file_error("creating the events file", path, errno);
  }
  if (fd < 0) return file_error("creating the events file", path, EEXIST);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && (st.st_mode & 07777) != 0600) (void)::fchmod(fd, 0600);

  std::unique_ptr<TfEventsWriter> w(new TfEventsWriter(fd, path));
  put_double(w->event_, event::wall_time, wall_time_s);
  put_bytes(w->event_, event::file_version, "brain.Event:2");
  w->add_record();
  if (Error e = w->write_out()) {
    w->buf_.clear(); // nothing for the destructor to try again
    w.reset();
    ::unlink(path.c_str());
    return e;
  }
  return w;
}

TfEventsWriter::~TfEventsWriter() {
  if (closed_) return;
  (void)write_out();
  platform::close_fd(fd_);
}

bool TfEventsWriter::take(std::string_view tag, std::int64_t step) {
  if (closed_) {
    ++after_close_;
    return false;
  }
  if (step < 0) {
    if (negative_steps_++ == 0) {
      first_negative_tag_.assign(tag.data(), tag.size());
      first_negative_step_ = step;
    }
    return false;
  }
  return true;
}

void TfEventsWriter::scalar(std::string_view tag, std::int64_t step, double wall_time_s, double value) {
  if (!take(tag, step)) return;
  // Summary.Value{tag, simple_value}, inside Summary.value, inside Event.summary.
  std::string val;
  put_bytes(val, value::tag, tag);
  put_float(val, value::simple_value, as_float(value));
  add_summary(tag, {val}, step, wall_time_s);
}

void TfEventsWriter::histogram(std::string_view tag, std::int64_t step, double wall_time_s, const Histogram& h) {
  if (!take(tag, step)) return;
  // HistogramProto's buckets are (previous limit, limit], the first from
  // `min`: each non-empty bucket is its upper bound, after its lower bound
  // (with a count of 0) where a gap precedes it. The infinities are buckets
  // at -DBL_MAX and DBL_MAX, as TensorFlow's own histograms have them; NaN
  // has no place in the format and is left out of `num`.
  std::vector<double> limits, counts;
  const std::vector<Histogram::Bucket> buckets = h.buckets();
  limits.reserve(2 * buckets.size() + 2);
  counts.reserve(2 * buckets.size() + 2);
  constexpr double most = std::numeric_limits<double>::max();
  if (h.neg_inf_count() != 0) {
    limits.push_back(-most);
    counts.push_back(static_cast<double>(h.neg_inf_count()));
  }
  for (const Histogram::Bucket& b : buckets) {
    if (!limits.empty() && limits.back() < b.lo) {
      limits.push_back(b.lo);
      counts.push_back(0);
    }
    limits.push_back(std::min(b.hi, most));
    counts.push_back(static_cast<double>(b.count));
  }
  if (h.pos_inf_count() != 0) {
    limits.push_back(most);
    counts.push_back(static_cast<double>(h.pos_inf_count()));
  }
  auto packed = [](std::string& out, std::uint32_t field, const std::vector<double>& v) {
    put_key(out, field, length_delimited);
    put_varint(out, v.size() * 8);
    for (double d : v) put_le(out, std::bit_cast<std::uint64_t>(d), 8);
  };
  const bool finite = h.finite_count() != 0;
  std::string histo;
  put_double(histo, histogram_proto::min, h.neg_inf_count() ? -most : finite ? h.min() : 0.0);
  put_double(histo, histogram_proto::max, h.pos_inf_count() ? most : finite ? h.max() : 0.0);
  put_double(histo, histogram_proto::num, static_cast<double>(h.count() - h.nan_count()));
  put_double(histo, histogram_proto::sum, h.sum());
  packed(histo, histogram_proto::bucket_limit, limits);
  packed(histo, histogram_proto::bucket, counts);
  std::string val;
  put_bytes(val, value::tag, tag);
  put_bytes(val, value::histo, histo);
  add_summary(tag, {val}, step, wall_time_s);
}

void TfEventsWriter::hparams(std::span<const HParam> values, double start_time_s, double wall_time_s) {
  constexpr std::string_view tag = "_hparams_/session_start_info";
  if (!take(tag, 0)) return;
  // SessionStartInfo{hparams: map<string, google.protobuf.Value>, start_time_secs}:
  // each map entry a message {key, value}; a Value's kind is a oneof, so a
  // 0 or false is written too.
  std::string info, entry, v;
  for (const HParam& h : values) {
    v.clear();
    if (const double* d = std::get_if<double>(&h.value)) put_double(v, proto_value::number_value, *d);
    else if (const bool* b = std::get_if<bool>(&h.value)) put_uint(v, proto_value::bool_value, *b ? 1 : 0);
    else put_bytes(v, proto_value::string_value, std::get<std::string>(h.value));
    entry.clear();
    put_bytes(entry, map_entry::key, h.name);
    put_bytes(entry, map_entry::value, v);
    put_bytes(info, session_start_info::hparams, entry);
  }
  put_double(info, session_start_info::start_time_secs, start_time_s);
  std::string content;
  put_bytes(content, hparams_plugin_data::session_start_info, info);
  std::string plugin;
  put_bytes(plugin, plugin_data::plugin_name, "hparams");
  put_bytes(plugin, plugin_data::content, content);
  std::string meta;
  put_bytes(meta, metadata::plugin_data, plugin);
  // The tensor is empty, as the plugin's own summaries have it: DT_FLOAT of shape [0].
  std::string dim, shape, tens;
  put_bytes(shape, tensor_shape::dim, dim);
  put_uint(tens, tensor::dtype, dt_float);
  put_bytes(tens, tensor::tensor_shape, shape);

  std::string val;
  put_bytes(val, value::tag, tag);
  put_bytes(val, value::tensor, tens);
  put_bytes(val, value::metadata, meta);
  add_summary(tag, {val}, 0, wall_time_s);
}

void TfEventsWriter::add_summary(std::string_view tag, std::initializer_list<std::string_view> value,
                                 std::int64_t step, double wall_time_s) {
  // Event{wall_time, step, summary: Summary{value}}, the Value written as
  // its parts one after the other: an image's or a text's bytes are copied
  // once, into the event.
  std::uint64_t size = 0;
  for (std::string_view part : value) size += part.size();
  const std::uint64_t summary_size = 1 + varint_size(size) + size; // Summary{value = 1}
  if (summary_size > max_record - 64) { // 64: the Event's other fields, with room to spare
    if (too_large_++ == 0) first_too_large_tag_.assign(tag.data(), tag.size());
    return;
  }
  event_.clear();
  put_double(event_, event::wall_time, wall_time_s);
  put_uint(event_, event::step, static_cast<std::uint64_t>(step));
  put_length(event_, event::summary, summary_size);
  put_length(event_, summary::value, size);
  for (std::string_view part : value) event_.append(part);
  add_record();
}

void TfEventsWriter::add_record() {
  std::string header;
  put_le(header, event_.size(), 8);
  put_le(header, masked_crc32c(header), 4);
  buf_.append(header);
  buf_.append(event_);
  put_le(buf_, masked_crc32c(event_), 4);
  ++buffered_records_;
  if (buf_.size() < write_at_) return;
  Error e = write_out();
  if (!e) return;
  if (!failed_) failed_ = std::move(e);
  if (buf_.size() >= pending_limit) {
    dropped_ += buffered_records_;
    std::string().swap(buf_);
    buffered_records_ = 0;
    write_at_ = buffer_limit;
  } else {
    // The next try once another buffer_limit has gathered, not at every record.
    write_at_ = buf_.size() + buffer_limit;
  }
}

Error TfEventsWriter::write_out() {
  if (buf_.empty()) return {};
  const int e = write_fully(fd_, buf_);
  if (e == 0) {
    written_ += buf_.size();
    buf_.clear();
    buffered_records_ = 0;
    write_at_ = buffer_limit;
    return {};
  }
  Error err = file_error("writing TensorBoard events", path_, e);
  // Part of the buffer may have gone out: cut the file back to its last
  // whole record (O_APPEND puts the next write there).
  if (::ftruncate(fd_, static_cast<off_t>(written_)) != 0) {
    const int t = errno;
    err = Error{Errc::io_error, err.message() + " Cutting the file back to its last whole record failed too (" +
                                    std::strerror(t) + "): TensorBoard reads up to the partial record at its end"};
  }
  return err;
}

Error TfEventsWriter::left_out() {
  std::string message;
  Errc code = Errc::ok;
  auto add = [&](Errc c, const std::string& m) {
    if (code == Errc::ok) code = c;
    message += message.empty() ? m : " Also: " + m;
  };
  if (dropped_ != 0)
    add(Errc::io_error, std::to_string(dropped_) + " events are not in " + path_ +
                            ": writes kept failing until " + std::to_string(pending_limit >> 20) +
                            " MiB had gathered, and they were dropped. The first failure: " + failed_.message());
  if (negative_steps_ != 0)
    add(Errc::invalid_argument, std::to_string(negative_steps_) + " events with a negative step were left out of " +
                                    path_ + " (the first: '" + first_negative_tag_ + "' at step " +
                                    std::to_string(first_negative_step_) +
                                    "). Steps in chorus are >= 0: log steps from 0 up.");
  if (too_large_ != 0)
    add(Errc::invalid_argument, std::to_string(too_large_) + " events were over the " +
                                    std::to_string(max_record >> 20) +
                                    " MiB a record of chorus's takes and are not in " + path_ + " (the first: '" +
                                    first_too_large_tag_ + "').");
  if (after_close_ != 0)
    add(Errc::finished, std::to_string(after_close_) + " events came after close() and are not in " + path_ +
                            ": give them before close(), or write them with a new TfEventsWriter.");
  dropped_ = negative_steps_ = after_close_ = too_large_ = 0;
  failed_ = {};
  first_negative_tag_.clear();
  first_too_large_tag_.clear();
  return code == Errc::ok ? Error{} : Error{code, std::move(message)};
}

Error TfEventsWriter::flush() {
  if (!closed_) {
    if (Error e = write_out()) {
      if (dropped_ != 0)
        return Error{e.code(), e.message() + " Before it, " + std::to_string(dropped_) +
                                   " events were dropped after writes kept failing."};
      return e;
    }
  }
  return left_out();
}

Error TfEventsWriter::close() {
  if (closed_) return left_out();
  Error err = flush();
  if (!buf_.empty()) {
    err = Error{err.code(), err.message() + " The writer is closed: its " + std::to_string(buffered_records_) +
                                " events not yet written are lost."};
    buf_.clear();
    buffered_records_ = 0;
  }
  if (Error s = platform::sync_file(fd_, path_); s && !err) err = std::move(s);
  platform::close_fd(fd_);
  fd_ = -1;
  closed_ = true;
  return err;
}

Error TfEventsWriter::sync() {
  if (closed_) return left_out();
  Error err = flush();
  if (Error e = platform::sync_file(fd_, path_, true); e && !err) err = std::move(e);
  return err;
}

namespace {

/// Reads a varint at `at`; false past the end or a varint too long.
bool get_varint(std::string_view msg, std::size_t& at, std::uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && at < msg.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(msg[at++]);
    v |= std::uint64_t{b & 0x7Fu} << shift;
    if ((b & 0x80u) == 0) return true;
  }
  return false;
}

/// Calls `field(number, wire, value, bytes)` for each field of `msg`; false
/// where it is not a well-formed message.
template <class Field>
bool each_field(std::string_view msg, const Field& field) {
  std::size_t at = 0;
  while (at < msg.size()) {
    std::uint64_t key = 0, v = 0;
    if (!get_varint(msg, at, key)) return false;
    std::string_view bytes;
    switch (key & 7) {
    case varint:
      if (!get_varint(msg, at, v)) return false;
      break;
    case fixed64:
    case fixed32: {
      const std::size_t n = (key & 7) == fixed64 ? 8 : 4;
      if (msg.size() - at < n) return false;
      for (std::size_t i = n; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(msg[at + i]);
      at += n;
      break;
    }
    case length_delimited:
      if (!get_varint(msg, at, v) || v > msg.size() - at) return false;
      bytes = msg.substr(at, v);
      at += v;
      break;
    default: return false;
    }
    field(static_cast<std::uint32_t>(key >> 3), v, bytes);
  }
  return true;
}

} // namespace

Result<std::map<std::string, TagExtent, std::less<>>> scan_events(const std::string& path) {
  Result<int> fd = platform::open_regular(path, O_RDONLY);
  if (!fd) return fd.error();
  std::map<std::string, TagExtent, std::less<>> tags;
  std::string record;
  char header[12];
  auto read_all = [&](char* to, std::size_t n) {
    while (n > 0) {
      const ssize_t got = ::read(*fd, to, n);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return got == 0 ? 0 : -1;
      to += got;
      n -= static_cast<std::size_t>(got);
    }
    return 1;
  };
  Error err;
  for (;;) {
    int r = read_all(header, sizeof header);
    if (r <= 0) {
      if (r < 0) err = file_error("reading TensorBoard events", path, errno);
      break;
    }
    std::uint64_t len = 0;
    for (int i = 8; i-- > 0;) len = (len << 8) | static_cast<unsigned char>(header[i]);
    std::uint32_t len_crc = 0;
    for (int i = 12; i-- > 8;) len_crc = (len_crc << 8) | static_cast<unsigned char>(header[i]);
    if (len_crc != masked_crc32c({header, 8}) || len > TfEventsWriter::max_record) break; // a damaged tail
    record.resize(len + 4);
    if ((r = read_all(record.data(), record.size())) <= 0) {
      if (r < 0) err = file_error("reading TensorBoard events", path, errno);
      break;
    }
    std::uint32_t data_crc = 0;
    for (std::size_t i = record.size(); i-- > len;) data_crc = (data_crc << 8) | static_cast<unsigned char>(record[i]);
    const std::string_view data(record.data(), len);
    if (data_crc != masked_crc32c(data)) break;
    std::int64_t step = 0;
    double wall = 0;
    std::vector<std::string_view> seen;
    const bool ok = each_field(data, [&](std::uint32_t n, std::uint64_t v, std::string_view bytes) {
      if (n == event::wall_time) wall = std::bit_cast<double>(v);
      else if (n == event::step) step = static_cast<std::int64_t>(v);
      else if (n == event::summary)
        each_field(bytes, [&](std::uint32_t sn, std::uint64_t, std::string_view value) {
          if (sn != summary::value) return;
          each_field(value, [&](std::uint32_t vn, std::uint64_t, std::string_view tag) {
            if (vn == value::tag) seen.push_back(tag);
          });
        });
    });
    if (!ok) break;
    for (std::string_view tag : seen) {
      auto it = tags.find(tag);
      if (it == tags.end()) it = tags.emplace(std::string(tag), TagExtent{}).first;
      it->second.max_step = std::max(it->second.max_step, step);
      it->second.max_wall_time = std::max(it->second.max_wall_time, wall);
      ++it->second.events;
    }
  }
  platform::close_fd(*fd);
  if (err) return err;
  return tags;
}

} // namespace chorus::upload
