// A run directory written by hand, as the run host writes one (run.json,
// history.jsonl, system.jsonl, config.json, summary.json, artifacts), for
// the upload tests: they can grow it while an Uploader reads it.
#pragma once

#include "io/platform/files.hpp"
#include "runtime/core/json.hpp"
#include "tests/io/files.hpp"

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace chorus::test {

class RunFixture {
public:
  explicit RunFixture(std::string name = "run") {
    char tmpl[] = "/tmp/chorus-upload-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    dir_ = root_ + "/proj/grp/" + name;
    std::filesystem::create_directories(dir_);
    id_ = name;
    write_run_json("running");
  }
  ~RunFixture() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  [[nodiscard]] const std::string& dir() const { return dir_; }
  [[nodiscard]] const std::string& root() const { return root_; }
  [[nodiscard]] const std::string& id() const { return id_; }

  std::string project = "proj";
  std::string group = "grp";
  double start = 1'700'000'000.0;
  /// The run's attempts, one entry each in run.json's `segments` (the
  /// earlier ones crashed: their times are not read by the upload).
  int attempts = 1;
  /// run.json's ranks (a run of several keeps a media key's column per rank).
  std::int64_t world_size = 1;

  void write_run_json(const std::string& state, double end = 0) {
    std::string out;
    core::JsonWriter w(out);
    w.begin_object().key("id").string(id_).key("name").string(id_ + "-rank-3").key("project").string(project);
    w.key("group").string(group).key("job_type").string("train").key("notes").string("");
    w.key("mode").string("per_rank").key("scope").string("global").key("host").string("node7");
    w.key("state").string(state).key("start_time").number(start);
    if (end > 0) w.key("end_time").number(end);
    w.key("world_size").integer(world_size).key("segments").begin_array();
    for (int i = 1; i < attempts; ++i)
      w.begin_object().key("start_time").number(start).key("state").string("crashed").end_object();
    w.begin_object().key("start_time").number(start).key("state").string(state);
    if (end > 0) w.key("end_time").number(end);
    w.end_object().end_array().end_object();
    write("run.json", out);
  }

  /// The run starts its next attempt under its id (Options::resume): running again.
  void resume() {
    ++attempts;
    write_run_json("running");
  }

  /// Appends history rows for steps [first, first + n): keys k0..k{keys-1},
  /// value = step * 10 + key index (exactly representable).
  void history(std::int64_t first, std::int64_t n, int keys = 3) {
    std::string out;
    for (std::int64_t s = first; s < first + n; ++s) {
      core::JsonWriter w(out);
      w.begin_object().key("_step").integer(s).key("_timestamp").number(start + static_cast<double>(s) * 0.25);
      w.key("_runtime").number(static_cast<double>(s) * 0.25);
      for (int k = 0; k < keys; ++k) w.key("k" + std::to_string(k)).number(static_cast<double>(s * 10 + k));
      w.end_object();
      out.push_back('\n');
    }
    append("history.jsonl", out);
  }

  void append(const std::string& file, const std::string& text) {
    std::ofstream f(dir_ + "/" + file, std::ios::app | std::ios::binary);
    f << text;
  }
  void write(const std::string& file, const std::string& text) {
    BOOST_REQUIRE(!platform::write_file_atomic(dir_ + "/" + file, text));
  }
  [[nodiscard]] std::string read(const std::string& file) const { return test::files::slurp(dir_ + "/" + file); }

private:
  std::string root_, dir_, id_;
};

} // namespace chorus::test
