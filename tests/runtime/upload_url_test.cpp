#define BOOST_TEST_MODULE runtime_upload_url
#include <boost/test/unit_test.hpp>

#include "runtime/core/upload_url.hpp"

#include <string>
#include <string_view>

using chorus::detail::UploadUrl;
using Problem = UploadUrl::Problem;

BOOST_TEST_DONT_PRINT_LOG_VALUE(Problem)
BOOST_TEST_DONT_PRINT_LOG_VALUE(UploadUrl::Kind)

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
    UploadUrl::Kind kind;
    bool https;
  };
  for (const Case& c : {Case{"mlflow://h:5000", UploadUrl::Kind::mlflow, false},
                        Case{"mlflow+http://h:5000", UploadUrl::Kind::mlflow, false},
                        Case{"mlflow+https://h:443", UploadUrl::Kind::mlflow, true},
                        Case{"wandb://api.wandb.ai", UploadUrl::Kind::wandb, true},
                        Case{"wandb+https://api.wandb.ai", UploadUrl::Kind::wandb, true},
                        Case{"wandb+http://h:8080", UploadUrl::Kind::wandb, false}}) {
    BOOST_TEST_CONTEXT(c.url) {
      const UploadUrl u = parse_ok(c.url);
      BOOST_TEST((u.kind == c.kind));
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
  BOOST_TEST((problem_of("mlflow://") == Problem::empty));
  BOOST_TEST((problem_of("wandb://user:secret@h") == Problem::credentials));
  BOOST_TEST((problem_of("mlflow:///x") == Problem::no_host));
  BOOST_TEST((problem_of("mlflow://h:1/x") == Problem::mlflow_path));
  BOOST_TEST((problem_of("wandb://h/a/b") == Problem::deep_path));
  // The earlier problem wins: credentials before a path MLflow refuses.
  BOOST_TEST((problem_of("mlflow://u@h/x") == Problem::credentials));
}

BOOST_AUTO_TEST_CASE(masked_hides_the_credentials_only) {
  UploadUrl u;
  BOOST_REQUIRE((UploadUrl::parse("wandb+http://user:hunter2@h:8080/team", u) == Problem::credentials));
  BOOST_TEST(u.masked() == "wandb+http://***@h:8080");
  // A '@' in the password: everything up to the last one is hidden.
  BOOST_REQUIRE((UploadUrl::parse("mlflow://u:p@ss@h", u) == Problem::credentials));
  BOOST_TEST(u.masked() == "mlflow://***@h");
}
