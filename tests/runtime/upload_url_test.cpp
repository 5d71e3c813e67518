#define BOOST_TEST_MODULE runtime_upload_url
#include <boost/test/unit_test.hpp>

#include "runtime/core/upload_url.hpp"

#include <string>
#include <string_view>

using chorus::core::UploadUrl;
using Problem = UploadUrl::Problem;

BOOST_TEST_DONT_PRINT_LOG_VALUE(Problem)

namespace {

Problem problem_of(std::string_view url) {
  UploadUrl u;
  return UploadUrl::parse(url, u);
}

UploadUrl parse_ok(std::string_view url) {
  UploadUrl u;
  BOOST_TEST((UploadUrl::parse(url, u) == Problem::none), url);
  return u;
}

} // namespace

BOOST_AUTO_TEST_CASE(every_scheme_names_its_backend_and_protocol) {
  struct Case {
    std::string_view url;
    std::string_view backend;
    bool https;
  };
  for (const Case& c : {Case{"mlflow://h:5000", "mlflow", false},
                        Case{"mlflow+http://h:5000", "mlflow", false},
                        Case{"mlflow+https://h:443", "mlflow", true},
                        Case{"wandb://api.wandb.ai", "wandb", true},
                        Case{"wandb+https://api.wandb.ai", "wandb", true},
                        Case{"wandb+http://h:8080", "wandb", false}}) {
    BOOST_TEST_CONTEXT(c.url) {
      const UploadUrl u = parse_ok(c.url);
      BOOST_REQUIRE(u.backend);
      BOOST_TEST(u.backend->name == c.backend);
      BOOST_TEST(u.https == c.https);
      BOOST_TEST(u.scheme == c.url.substr(0, c.url.find("://")));
      BOOST_TEST(u.path.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(the_host_and_a_wandb_entity_are_read_apart) {
  UploadUrl u = parse_ok("wandb+http://h:8080/team");
  BOOST_TEST(u.authority == "h:8080");
  BOOST_TEST(u.path == "team");
  u = parse_ok("wandb://h/team//"); // trailing slashes go
  BOOST_TEST(u.path == "team");
  u = parse_ok("mlflow://127.0.0.1:5000/"); // an empty path is none
  BOOST_TEST(u.authority == "127.0.0.1:5000");
  BOOST_TEST(u.path.empty());
}

BOOST_AUTO_TEST_CASE(each_problem_is_named_in_order) {
  BOOST_TEST((problem_of("") == Problem::no_scheme));
  BOOST_TEST((problem_of("mlflow:/h") == Problem::no_scheme));
  BOOST_TEST((problem_of("http://h") == Problem::unknown_scheme));
  BOOST_TEST((problem_of("s3://bucket") == Problem::unknown_scheme));
  BOOST_TEST((problem_of("MLFLOW://h") == Problem::unknown_scheme)); // schemes are lower case
  BOOST_TEST((problem_of("mlflow+ftp://h") == Problem::unknown_scheme));
  BOOST_TEST((problem_of("+https://h") == Problem::unknown_scheme));
  BOOST_TEST((problem_of("mlflow://") == Problem::empty));
  BOOST_TEST((problem_of("wandb://user:secret@h") == Problem::credentials));
  BOOST_TEST((problem_of("mlflow:///x") == Problem::no_host));
  BOOST_TEST((problem_of("mlflow://u@h/x") == Problem::credentials));
  // What a path may be is the backend's to say (upload::UploadTarget::parse).
  BOOST_TEST(parse_ok("wandb://h/a/b").path == "a/b");
  BOOST_TEST(parse_ok("mlflow://h:1/x").path == "x");
}

BOOST_AUTO_TEST_CASE(a_backend_that_writes_files_takes_a_directory) {
  UploadUrl u = parse_ok("tensorboard:/var/tb");
  BOOST_TEST(u.backend->name == "tensorboard");
  BOOST_TEST(u.backend->local);
  BOOST_TEST(u.authority.empty());
  BOOST_TEST(u.path == "/var/tb");
  BOOST_TEST(parse_ok("tensorboard:tb/runs").path == "tb/runs"); // relative: to the working directory
  BOOST_TEST(parse_ok("tensorboard:///var/tb").path == "/var/tb");
  BOOST_TEST(parse_ok("tensorboard://tb").path == "tb");
  BOOST_TEST((problem_of("tensorboard:") == Problem::empty));
  BOOST_TEST((problem_of("tensorboard://") == Problem::empty));
  BOOST_TEST((problem_of("tensorboard+http://h") == Problem::unknown_scheme)); // a directory has no protocol
  BOOST_TEST((problem_of("mlflow:h") == Problem::no_scheme));                  // only a local backend takes NAME:
  BOOST_TEST((problem_of("nosuch:/x") == Problem::no_scheme));
}

BOOST_AUTO_TEST_CASE(the_usage_names_every_backend_and_both_protocols) {
  BOOST_TEST(chorus::core::upload_url_forms(false) ==
             "mlflow://HOST:PORT, wandb://HOST[/ENTITY], tensorboard:DIR or webhook://HOST[:PORT]/PATH");
  // A backend that writes files has no other protocol.
  BOOST_TEST(chorus::core::upload_url_forms(true) == "mlflow://HOST:PORT, mlflow+https://HOST:PORT, "
                                                       "wandb://HOST[/ENTITY], wandb+http://HOST[/ENTITY], "
                                                       "tensorboard:DIR, webhook://HOST[:PORT]/PATH or "
                                                       "webhook+http://HOST[:PORT]/PATH");
  BOOST_TEST(chorus::core::upload_other_protocols() == "mlflow+https://, wandb+http://, webhook+http://");
  BOOST_TEST(chorus::core::upload_credentials().find("W&B's in WANDB_API_KEY") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(masked_hides_the_credentials_only) {
  UploadUrl u;
  BOOST_REQUIRE((UploadUrl::parse("wandb+http://user:hunter2@h:8080/team", u) == Problem::credentials));
  BOOST_TEST(u.masked() == "wandb+http://***@h:8080");
  // A '@' in the password: everything up to the last one is hidden.
  BOOST_REQUIRE((UploadUrl::parse("mlflow://u:p@ss@h", u) == Problem::credentials));
  BOOST_TEST(u.masked() == "mlflow://***@h");
}
