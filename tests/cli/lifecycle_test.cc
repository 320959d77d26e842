// Target lifecycle under kwatch: thousands of short-lived threads created and joined while
// a watch or a probe is active (tests/targets/thread_churn.c) keep every count exact.
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using json = nlohmann::json;

struct Output {
  std::vector<json> lines;  // kwatch's JSON lines except the summary
  json summary;
};

Output Split(const std::string& out) {
  Output o;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    json j = json::parse(std::string(line));
    if (j.value("type", "") == "summary") {
      o.summary = std::move(j);
    } else {
      o.lines.push_back(std::move(j));
    }
  }
  return o;
}

constexpr int kThreads = 1000;
constexpr int kWrites = 3;
constexpr char kTruth[] = "threads=1000 writes=3000 ticks=1000\n";

// thread_churn's arguments, its ground truth going to a file of this test's.
std::vector<std::string> Churn(const std::string& truth) {
  return {TargetPath("thread_churn"), std::to_string(kThreads), std::to_string(kWrites), "8",
          truth};
}

std::string TruthFile(const std::string& name) {
  return ::testing::TempDir() + "thread_churn_" + name + "_" + std::to_string(::getpid());
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Lifecycle, ThreadChurnUnderAWatchCountsEveryWriteOfEveryThread) {
  const std::string truth = TruthFile("watch");
  std::vector<std::string> argv = {KwatchPath(), "--json", "--write", "g_churn.writes", "--"};
  for (std::string& a : Churn(truth)) {
    argv.push_back(std::move(a));
  }
  auto r = kwatch::testing::Run(argv);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(Slurp(truth), kTruth);
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  EXPECT_EQ(o.summary["events"], kThreads * kWrites);
  EXPECT_EQ(o.summary["lost"], 0);
  std::set<int> tids;
  int writes = 0;
  for (const json& ev : o.lines) {
    if (ev.value("type", "") == "event") {
      tids.insert(ev["tid"].get<int>());
      writes += ev["access"] == "w" ? 1 : 0;
    }
  }
  EXPECT_EQ(writes, kThreads * kWrites);
  EXPECT_EQ(tids.size(), static_cast<size_t>(kThreads));  // each worker seen, none lost
}

TEST(Lifecycle, ThreadChurnUnderAProbeHitsOncePerThread) {
  const std::string truth = TruthFile("probe");
  std::vector<std::string> argv = {KwatchPath(), "probe", "--json", "tick id", "--"};
  for (std::string& a : Churn(truth)) {
    argv.push_back(std::move(a));
  }
  auto r = kwatch::testing::Run(argv);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(Slurp(truth), kTruth);
  const Output o = Split(r->out);
  ASSERT_FALSE(o.summary.is_null()) << r->err;
  EXPECT_EQ(o.summary["hits"], kThreads);
  std::set<long> ids;
  std::set<int> tids;
  for (const json& hit : o.lines) {
    ids.insert(hit["args"]["id"].get<long>());
    tids.insert(hit["tid"].get<int>());
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), kThreads - 1);
  EXPECT_EQ(tids.size(), static_cast<size_t>(kThreads));
}

}  // namespace
}  // namespace kwatch
