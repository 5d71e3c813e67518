// `chorus certs DIR`: the credentials a job's nodes authenticate each other with.
#include "cli/cli.hpp"
#include "io/platform/credentials.hpp"

#include <cstdio>

namespace chorus::cli {
int certs_main(std::span<char* const> args); // below

const Command certs_command{
    .name = "certs",
    .summary = "make the credentials that authenticate a job's nodes to each other",
    .usage = "DIR [--days N] [--force]",
    .help = R"(Makes the credentials for the links between a job's nodes: a CA made for
this job alone (DIR/ca.pem), and a certificate (DIR/cert.pem) and key
(DIR/key.pem) signed by it, which every node of the job holds. DIR is made
0700 and the files 0600; the CA's own key is not kept, so nobody can make
another certificate for the job.

Copy DIR to every node (it must stay private) and point the job at it with
CHORUS_TLS_DIR=DIR (or Options::tls_dir): the run host then accepts links
only from peers that hold these credentials (mutual TLS), and a run that
spans nodes does not start without them unless CHORUS_INSECURE=1.

options:
  --days N     how long the credentials are valid (default 30)
  --force      replace credentials already in DIR
  -h, --help   this text

exit codes: 0 made, 1 they could not be made (or DIR already has them),
2 a wrong command line.
)",
    .main = certs_main,
};

int certs_main(std::span<char* const> args) {
  std::string dir;
  std::int64_t days = 30;
  bool force = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "-h" || a == "--help") return print_help(certs_command);
    if (a == "--force") {
      force = true;
    } else if (a == "--days") {
      if (i + 1 >= args.size()) return usage_error("certs", "--days needs a number of days");
      auto d = parse_int(args[++i], 1, 36500);
      if (!d) return usage_error("certs", "--days takes a whole number of days from 1 to 36500");
      days = *d;
    } else if (!a.empty() && a[0] == '-') {
      return usage_error("certs", "unknown option '" + std::string(a) + "'");
    } else if (dir.empty()) {
      dir = a;
    } else {
      return usage_error("certs", "one DIR only");
    }
  }
  if (dir.empty()) return usage_error("certs", "DIR is missing: where to put the job's credentials");
  if (Error e = platform::make_credentials(dir, static_cast<int>(days), force)) return failure("certs", e.message());
  std::printf("credentials for the job's nodes in %s (valid %lld days): ca.pem, cert.pem, key.pem\n"
              "copy the directory to every node, then set CHORUS_TLS_DIR=%s\n",
              dir.c_str(), static_cast<long long>(days), dir.c_str());
  return exit_ok;
}

} // namespace chorus::cli
