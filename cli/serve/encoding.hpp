// How `chorus serve` compresses what it sends: the content coding a browser
// accepts (Accept-Encoding), and gzip and Brotli over zlib and libbrotlienc.
// The page's files are compressed once, at build time, at the highest levels
// (cli/serve/embed_assets.cpp); a JSON answer is compressed per request at the
// cheapest level, or not at all to a client on the same machine
// (docs/ARCHITECTURE.md, "chorus serve": which is faster end to end where).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace chorus::cli::serve {

enum class Coding { identity, gzip, br };

/// The name in Content-Encoding ("" for identity).
[[nodiscard]] std::string_view coding_name(Coding c);

/// Whether an Accept-Encoding header accepts `coding`: named, or covered by
/// `*`, with a q-value above 0.
[[nodiscard]] bool accepts(std::string_view accept_encoding, Coding coding);

/// The coding to send to a client whose Accept-Encoding is `accept_encoding`,
/// among those the sender has: Brotli first, then gzip, else identity.
[[nodiscard]] Coding pick_coding(std::string_view accept_encoding, bool have_br = true, bool have_gzip = true);

/// Answers smaller than this go as they are: compressing them saves less
/// than a packet.
inline constexpr std::size_t smallest_compressed = 1024;

/// The coding of an answer made per request (JSON, a text file) of `size`
/// bytes: none to a client on this machine, where copying beats any
/// compression (loopback moves gigabytes a second); else the cheapest level
/// of what the client takes, Brotli before gzip (BENCHMARKS.md, bench_serve).
[[nodiscard]] Coding answer_coding(std::string_view accept_encoding, bool client_on_this_machine, std::size_t size);

/// The level an answer is compressed at in `coding`: the cheapest.
[[nodiscard]] int answer_level(Coding coding);

/// `body` compressed with `coding` at `level` (gzip 1..9, Brotli 0..11); the
/// body itself for identity. Throws std::runtime_error where the library fails.
[[nodiscard]] std::string compress(std::string_view body, Coding coding, int level);

} // namespace chorus::cli::serve
