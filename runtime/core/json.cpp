#include "runtime/core/json.hpp"
#include "runtime/core/shortest.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <variant>

namespace chorus::core {
namespace {

// How many bytes the UTF-8 sequence at p spans when well-formed (`ok`), or
// else the length of its maximal ill-formed subpart (at least 1): the unit
// Unicode recommends replacing with one U+FFFD.
std::size_t utf8_step(const unsigned char* p, std::size_t n, bool& ok) noexcept {
  const unsigned char b = p[0];
  std::size_t need;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b < 0x80) {
    ok = true;
    return 1;
  } else if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0; // overlong
    if (b == 0xED) hi = 0x9F; // surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90; // overlong
    if (b == 0xF4) hi = 0x8F; // above U+10FFFF
  } else {
    ok = false;
    return 1;
  }
  std::size_t i = 1;
  for (; i <= need; ++i) {
    if (i >= n) break;
    const unsigned char c = p[i];
    const unsigned char l = i == 1 ? lo : 0x80;
    const unsigned char h = i == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
  }
  ok = i == need + 1;
  return i;
}

// Bytes that cannot be copied into a JSON string as they are.
constexpr std::array<bool, 256> make_special() {
  std::array<bool, 256> t{};
  for (int c = 0; c < 0x20; ++c) t[static_cast<std::size_t>(c)] = true;
  t['"'] = true;
  t['\\'] = true;
  for (int c = 0x80; c < 0x100; ++c) t[static_cast<std::size_t>(c)] = true;
  return t;
}
constexpr std::array<bool, 256> special = make_special();

void append_control(std::string& out, unsigned char c) {
  static constexpr char hex[] = "0123456789abcdef";
  switch (c) {
  case '\b': out.append("\\b"); return;
  case '\f': out.append("\\f"); return;
  case '\n': out.append("\\n"); return;
  case '\r': out.append("\\r"); return;
  case '\t': out.append("\\t"); return;
  default: {
    const char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xF]};
    out.append(e, sizeof e);
  }
  }
}

} // namespace

bool valid_utf8(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t n = s.size();
  while (n != 0) {
    // ASCII eight bytes at a time: most keys and values are plain ASCII.
    if (n >= 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        p += 8;
        n -= 8;
        continue;
      }
    }
    bool ok;
    const std::size_t k = utf8_step(p, n, ok);
    if (!ok) return false;
    p += k;
    n -= k;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  out.reserve(out.size() + n + 2);
  out.push_back('"');
  std::size_t run = 0; // start of the bytes not yet appended
  std::size_t i = 0;
  while (i < n) {
    if (!special[p[i]]) {
      ++i;
      continue;
    }
    out.append(s.data() + run, i - run);
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out.push_back('\\');
        out.push_back(static_cast<char>(c));
      } else {
        append_control(out, c);
      }
      ++i;
    } else {
      bool ok;
      const std::size_t k = utf8_step(p + i, n - i, ok);
      if (ok)
        out.append(s.data() + i, k);
      else
        out.append("\xEF\xBF\xBD"); // U+FFFD
      i += k;
    }
    run = i;
  }
  out.append(s.data() + run, n - run);
  out.push_back('"');
}

void append_json_int(std::string& out, std::int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, static_cast<std::size_t>(r.ptr - buf));
}

void append_json_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out.append("\"NaN\"");
  } else if (std::isinf(v)) {
    out.append(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  } else if (v == 0 && std::signbit(v)) {
    out.append("-0.0"); // "-0" reads back as the integer 0 and loses the sign
  } else {
    char buf[shortest_room];
    char* end = shortest(buf, v);
    // Integral text beyond 64 bits is refused by readers that parse integers
    // into 64 bits (simdjson among them): keep such numbers in exponent form.
    if (std::fabs(v) >= 0x1p63 && std::memchr(buf, 'e', static_cast<std::size_t>(end - buf)) == nullptr &&
        std::memchr(buf, '.', static_cast<std::size_t>(end - buf)) == nullptr)
      end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific).ptr;
    out.append(buf, static_cast<std::size_t>(end - buf));
  }
}

void append_json_seconds(std::string& out, std::int64_t us) {
  std::uint64_t u = static_cast<std::uint64_t>(us);
  if (us < 0) {
    out.push_back('-');
    u = 0 - u;
  }
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, u / 1'000'000);
  out.append(buf, static_cast<std::size_t>(r.ptr - buf));
  auto frac = static_cast<std::uint32_t>(u % 1'000'000);
  if (frac == 0) return;
  char digits[7] = {'.', '0', '0', '0', '0', '0', '0'};
  std::size_t len = 7;
  for (std::size_t i = 6; i > 0; --i, frac /= 10) digits[i] = static_cast<char>('0' + frac % 10);
  while (digits[len - 1] == '0') --len;
  out.append(digits, len);
}

JsonWriter& JsonWriter::key(std::string_view k) {
  if (need_comma_) out_.push_back(',');
  append_json_string(out_, k);
  out_.push_back(':');
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::string(std::string_view s) {
  separate();
  append_json_string(out_, s);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::number(double v) {
  separate();
  append_json_number(out_, v);
  need_comma_ = true;
  return *this;
}

template <class I>
JsonWriter& JsonWriter::whole(I v) {
  separate();
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out_.append(buf, static_cast<std::size_t>(r.ptr - buf));
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::integer(std::int64_t v) { return whole(v); }
JsonWriter& JsonWriter::uinteger(std::uint64_t v) { return whole(v); }

JsonWriter& JsonWriter::seconds(std::int64_t us) {
  separate();
  append_json_seconds(out_, us);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::boolean(bool b) { return raw(b ? "true" : "false"); }

JsonWriter& JsonWriter::null() { return raw("null"); }

JsonWriter& JsonWriter::raw(std::string_view json) {
  separate();
  out_.append(json);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(const Value& v) {
  std::visit(
      [this](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>)
          null();
        else if constexpr (std::is_same_v<T, bool>)
          boolean(x);
        else if constexpr (std::is_same_v<T, std::int64_t>)
          integer(x);
        else if constexpr (std::is_same_v<T, double>)
          number(x);
        else
          string(x);
      },
      v.get());
  return *this;
}

std::string fields_to_json(std::span<const Field> fields) {
  std::string out;
  JsonWriter w(out);
  w.begin_object();
  for (const Field& f : fields) w.field(f.key, f.value);
  w.end_object();
  return out;
}

} // namespace chorus::core
