// Where a node's processes find their sockets (local_socket_dir,
// actors/links/local_link.hpp): a directory of this user's of mode 0700,
// found the same way by every process; another user's directory, a link or
// a directory of another mode in its place is left as it is and the next
// name is taken; CHORUS_SOCKET_DIR naming a shared directory gets a private
// subdirectory, and the shared directory keeps its mode.
#define BOOST_TEST_MODULE actors_socket_dir
#include <boost/test/unit_test.hpp>

#include "actors/links/local_link.hpp"
#include "tests/temp_dir.hpp"

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace fs = std::filesystem;
using chorus::test::TempDir;
using chorus::actors::local_socket_dir;

namespace {

/// The environment of one case: a TMPDIR of its own (shared and sticky, as
/// /tmp is), no XDG_RUNTIME_DIR and no CHORUS_SOCKET_DIR unless given.
struct Env {
  TempDir root;
  fs::path tmp = root.path / "tmp";
  std::string uid = std::to_string(::geteuid());
  fs::path first = tmp / ("chorus-" + uid);

  Env() {
    fs::create_directory(tmp);
    ::chmod(tmp.c_str(), 01777);
    ::setenv("TMPDIR", tmp.c_str(), 1);
    ::unsetenv("XDG_RUNTIME_DIR");
    ::unsetenv("CHORUS_SOCKET_DIR");
  }
  ~Env() {
    ::unsetenv("TMPDIR");
    ::unsetenv("XDG_RUNTIME_DIR");
    ::unsetenv("CHORUS_SOCKET_DIR");
  }
};

/// lstat's mode bits (with the kind), owner and what the directory holds.
struct Seen {
  mode_t mode = 0;
  uid_t uid = 0;
  std::size_t entries = 0;
  bool operator==(const Seen&) const = default;
};
std::ostream& operator<<(std::ostream& out, const Seen& s) {
  return out << "mode " << std::oct << s.mode << std::dec << " uid " << s.uid << " entries " << s.entries;
}
Seen seen(const fs::path& p) {
  struct stat st {};
  BOOST_REQUIRE(::lstat(p.c_str(), &st) == 0);
  Seen s{st.st_mode, st.st_uid, 0};
  if (S_ISDIR(st.st_mode))
    for ([[maybe_unused]] auto& e : fs::directory_iterator(p)) ++s.entries;
  return s;
}

bool is_private(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 07777) == 0700;
}

std::string found(bool read_env = true) {
  auto dir = local_socket_dir(read_env);
  BOOST_REQUIRE_MESSAGE(dir, (dir ? "" : dir.error().message()));
  BOOST_TEST(is_private(*dir), *dir);
  return *dir;
}

} // namespace

BOOST_AUTO_TEST_CASE(the_default_is_a_private_directory_in_tmpdir) {
  Env env;
  BOOST_TEST(found() == env.first.string());
  // Every process finds the same one.
  BOOST_TEST(found() == env.first.string());
  BOOST_TEST((seen(env.tmp).mode & 07777) == 01777u);
}

BOOST_AUTO_TEST_CASE(a_directory_in_the_way_is_left_as_it_is_and_the_next_name_taken) {
  {
    // Ours, but of another mode (made by hand, say): not made private behind the user's back.
    Env env;
    fs::create_directory(env.first);
    ::chmod(env.first.c_str(), 0755);
    const Seen before = seen(env.first);
    BOOST_TEST(found() == env.first.string() + "-1");
    BOOST_TEST(seen(env.first) == before);
  }
  {
    // A link, to a directory that would pass: never followed.
    Env env;
    const fs::path target = env.root.path / "target";
    fs::create_directory(target);
    ::chmod(target.c_str(), 0700);
    fs::create_directory_symlink(target, env.first);
    BOOST_TEST(found() == env.first.string() + "-1");
    BOOST_TEST(fs::is_symlink(env.first));
    BOOST_TEST(fs::is_empty(target));
  }
  {
    // A file, and then a link too: the first name of the two that is free.
    Env env;
    std::ofstream(env.first.string()) << "x";
    fs::create_symlink("/nonexistent", env.first.string() + "-1");
    BOOST_TEST(found() == env.first.string() + "-2");
    // The next process takes the same.
    BOOST_TEST(found() == env.first.string() + "-2");
  }
}

BOOST_AUTO_TEST_CASE(another_users_directory_is_left_as_it_is) {
  if (::geteuid() != 0) {
    BOOST_TEST_MESSAGE("skipped: needs root to make a directory of another user");
    return;
  }
  Env env;
  fs::create_directory(env.first);
  ::chmod(env.first.c_str(), 0700);
  std::ofstream((env.first / "theirs").string()) << "x";
  BOOST_REQUIRE(::chown(env.first.c_str(), 65534, 65534) == 0);
  const Seen before = seen(env.first);
  BOOST_TEST(found() == env.first.string() + "-1");
  BOOST_TEST(seen(env.first) == before);
  BOOST_TEST(seen(env.first).uid == 65534u);
}

BOOST_AUTO_TEST_CASE(every_name_taken_is_an_error_naming_the_path_and_the_fix) {
  Env env;
  std::ofstream(env.first.string()) << "x";
  for (int i = 1; i < 16; ++i) std::ofstream(env.first.string() + "-" + std::to_string(i)) << "x";
  auto dir = local_socket_dir(true);
  BOOST_REQUIRE(!dir);
  const std::string m = dir.error().message();
  BOOST_TEST(m.find(env.first.string() + " is not a directory") != std::string::npos, m);
  BOOST_TEST(m.find("set CHORUS_SOCKET_DIR to a directory of your own on every rank") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(chorus_socket_dir_of_a_shared_directory_gets_a_private_subdirectory) {
  Env env;
  const fs::path shared = env.root.path / "shared";
  fs::create_directory(shared);
  ::chmod(shared.c_str(), 01777);
  ::setenv("CHORUS_SOCKET_DIR", shared.c_str(), 1);
  BOOST_TEST(found() == (shared / ("chorus-" + env.uid)).string());
  BOOST_TEST((seen(shared).mode & 07777) == 01777u); // its sticky bit and mode kept
  // Read only where asked to (the environment of an orchestrator's actor system).
  BOOST_TEST(found(false) == env.first.string());
  // A directory of this user's, mode 0700, is used as it is; one that is missing is made so.
  const fs::path own = env.root.path / "own";
  ::setenv("CHORUS_SOCKET_DIR", own.c_str(), 1);
  BOOST_TEST(found() == own.string());
  BOOST_TEST(found() == own.string());
  // Ours of another mode: a subdirectory, its mode untouched.
  ::chmod(own.c_str(), 0750);
  BOOST_TEST(found() == (own / ("chorus-" + env.uid)).string());
  BOOST_TEST((seen(own).mode & 07777) == 0750u);
}

BOOST_AUTO_TEST_CASE(chorus_socket_dir_that_is_a_link_or_no_directory_is_refused_with_the_fix) {
  Env env;
  const fs::path real = env.root.path / "real";
  fs::create_directory(real);
  const fs::path link = env.root.path / "link";
  fs::create_directory_symlink(real, link);
  ::setenv("CHORUS_SOCKET_DIR", link.c_str(), 1);
  auto dir = local_socket_dir(true);
  BOOST_REQUIRE(!dir);
  BOOST_TEST(dir.error().message().find(link.string() + " (CHORUS_SOCKET_DIR) is not a directory") !=
             std::string::npos, dir.error().message());
  BOOST_TEST(dir.error().message().find("set CHORUS_SOCKET_DIR to a directory of your own") != std::string::npos);
  // A path under a file cannot be made: named, with its cause.
  std::ofstream((env.root.path / "file").string()) << "x";
  ::setenv("CHORUS_SOCKET_DIR", (env.root.path / "file" / "sub").c_str(), 1);
  dir = local_socket_dir(true);
  BOOST_REQUIRE(!dir);
  BOOST_TEST(dir.error().message().find((env.root.path / "file" / "sub").string()) != std::string::npos,
             dir.error().message());
  BOOST_TEST(dir.error().message().find("Not a directory") != std::string::npos, dir.error().message());
}

BOOST_AUTO_TEST_CASE(xdg_runtime_dir_is_used_where_it_is_private) {
  Env env;
  const fs::path xdg = env.root.path / "run-user";
  fs::create_directory(xdg);
  ::chmod(xdg.c_str(), 0700);
  ::setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
  BOOST_TEST(found() == (xdg / "chorus").string());
  // Not private (another mode): not used, and not changed.
  ::chmod(xdg.c_str(), 0755);
  BOOST_TEST(found() == env.first.string());
  BOOST_TEST((seen(xdg).mode & 07777) == 0755u);
}

BOOST_AUTO_TEST_CASE(a_path_too_long_for_a_socket_is_refused) {
  Env env;
  const fs::path deep = env.root.path / std::string(120, 'd');
  ::setenv("CHORUS_SOCKET_DIR", deep.c_str(), 1);
  auto dir = local_socket_dir(true);
  BOOST_REQUIRE(!dir);
  BOOST_TEST(dir.error().message().find("too long a path for a Unix socket") != std::string::npos,
             dir.error().message());
}
