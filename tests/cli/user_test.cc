// `-u USER`: a command launched by kwatch (as root) runs as USER with USER's groups, as
// strace -u does; errors name the user or the missing privilege.
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

// A copy of print_ids that any user can run (the build tree may not be reachable by them).
class PublicCopy {
 public:
  PublicCopy() {
    char tmpl[] = "/tmp/kwatch-user-test-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::permissions(dir_, std::filesystem::perms(0755));
    std::filesystem::copy_file(TargetPath("print_ids"), dir_ / "print_ids");
    std::filesystem::permissions(dir_ / "print_ids", std::filesystem::perms(0755));
  }
  ~PublicCopy() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PublicCopy(const PublicCopy&) = delete;
  PublicCopy& operator=(const PublicCopy&) = delete;
  std::string path() const { return (dir_ / "print_ids").string(); }

 private:
  std::filesystem::path dir_;
};

RunResult RunOrFail(const std::vector<std::string>& argv) {
  auto r = kwatch::testing::Run(argv);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

TEST(RunAsUser, ProbedCommandRunsAsTheUserWithItsGroups) {
  ASSERT_EQ(::geteuid(), 0u) << "this test launches a command as 'nobody': it needs root";
  const passwd* nobody = ::getpwnam("nobody");
  ASSERT_NE(nobody, nullptr) << "no user 'nobody' on this machine";
  PublicCopy copy;
  for (const std::string& user : {std::string("nobody"), std::to_string(nobody->pw_uid)}) {
    const RunResult r =
        RunOrFail({KwatchPath(), "probe", "--json", "-u", user, "tick i", "--", copy.path()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> target;
    json summary;
    std::vector<json> hits;
    for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      if (line.front() != '{') {
        target.emplace_back(line);
        continue;
      }
      json j = json::parse(std::string(line));
      if (j["type"] == "hit") {
        hits.push_back(std::move(j));
      } else {
        summary = std::move(j);
      }
    }
    ASSERT_EQ(target.size(), 1u) << r.out;
    EXPECT_THAT(target[0], HasSubstr(absl::StrCat("uid=", nobody->pw_uid, " gid=", nobody->pw_gid,
                                                  " groups=")));
    ASSERT_EQ(hits.size(), 1u) << r.out;
    EXPECT_EQ(hits[0]["args"]["i"], 7);
    EXPECT_EQ(summary["hits"], 1);
  }
}

TEST(RunAsUser, WatchedCommandRunsAsTheUser) {
  ASSERT_EQ(::geteuid(), 0u) << "this test launches a command as 'nobody': it needs root";
  const passwd* nobody = ::getpwnam("nobody");
  ASSERT_NE(nobody, nullptr) << "no user 'nobody' on this machine";
  PublicCopy copy;
  const RunResult r = RunOrFail(
      {KwatchPath(), "--json", "-q", "-u", "nobody", "--write", "g_ticks", "--", copy.path()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> target;
  json summary;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    if (line.front() != '{') {
      target.emplace_back(line);
    } else if (json j = json::parse(std::string(line)); j["type"] == "summary") {
      summary = std::move(j);
    }
  }
  ASSERT_EQ(target.size(), 1u) << r.out;
  EXPECT_THAT(target[0],
              HasSubstr(absl::StrCat("uid=", nobody->pw_uid, " gid=", nobody->pw_gid, " ")));
  ASSERT_FALSE(summary.is_null()) << r.err;
  EXPECT_EQ(summary["events"], 1);
  EXPECT_EQ(summary["watches"][0]["writes"], 1);
}

TEST(RunAsUser, UnknownUserAndMisuseAreUsageErrors) {
  const RunResult unknown =
      RunOrFail({KwatchPath(), "probe", "-u", "kw-no-such-user", "tick", "--", "/bin/true"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("-u kw-no-such-user: no such user"));
  const RunResult no_command =
      RunOrFail({KwatchPath(), "probe", "-u", "nobody", "-p", "1", "tick"});
  EXPECT_EQ(no_command.exit_code, 2);
  EXPECT_THAT(no_command.err, HasSubstr("-u USER applies to a command"));
  const RunResult watch_unknown =
      RunOrFail({KwatchPath(), "-u", "kw-no-such-user", "--write", "x", "--", "/bin/true"});
  EXPECT_EQ(watch_unknown.exit_code, 2);
  EXPECT_THAT(watch_unknown.err, HasSubstr("-u kw-no-such-user: no such user"));
}

}  // namespace
}  // namespace kwatch
