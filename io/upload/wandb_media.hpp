// Images, text and tables as the W&B backend (io/upload/wandb.cpp) sends
// them (docs/UPLOADS.md, "Images, text and tables"): each a file of the run
// (media/images/..., media/table/...), uploaded as W&B's client uploads its
// files, and a value in the history row of its step that names it.
#pragma once

#include "io/store/media_log.hpp"
#include "io/upload/backends.hpp"

#include <simdjson.h>

#include <span>
#include <string>

namespace chorus::upload {

/// A media line as it goes to W&B.
struct WandbMedia {
  std::string column; // its key in the row
  std::string value;  // its value there: {"_type": "image-file", ...} or {"_type": "table-file", ...}
  std::string name;   // the run's file it names: media/images/<column>_<step>_<sha256[:20]>.png, ...
  std::string file;   // where the file's bytes are (in the run directory), or
  std::string body;   // the bytes, made here (a text as a table of one cell)
};

/// What W&B gets of `m`, a line of the run in `run_dir` of `world_size`
/// ranks, or why it cannot (its file is gone or unreadable). `parser` reads a table.
[[nodiscard]] Result<WandbMedia> wandb_media(const std::string& run_dir, std::int64_t world_size, const store::MediaLine& m,
                                             simdjson::dom::parser& parser);

/// Uploads the files `media` name to the run `st` names as W&B's client
/// does: createRunFiles for their upload URLs, then a PUT of each with the
/// upload headers the server gave and no credentials (the URL is signed).
/// Ok, or the failure to report; a file PUT again replaces itself.
[[nodiscard]] Sent upload_wandb_files(HttpClient& http, const UploadTarget& target, const std::string& api_key,
                                      const UploadState& st, std::span<const WandbMedia> media,
                                      simdjson::dom::parser& parser);

} // namespace chorus::upload
