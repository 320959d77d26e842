#pragma once

// Helpers shared by the end-to-end tests of the kwatch binary (tests/cli/*_test.cc): the
// ground truth field_writer prints about itself, kwatch's --json lines, running kwatch.
#include <sys/types.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/test_util.h"

namespace kwatch::clitest {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using json = nlohmann::json;

struct Truth {
  long hits_w = 0;
  long misses_w = 0;
  long flags_r = 0;
};

// tid -> ground truth, from the file field_writer wrote.
inline std::map<int, Truth> ReadTruth(const std::string& path) {
  std::map<int, Truth> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("flags_r")) {
      continue;  // a line still being written
    }
    out[j["tid"].get<int>()] =
        Truth{j["hits_w"].get<long>(), j["misses_w"].get<long>(), j["flags_r"].get<long>()};
  }
  return out;
}

// Parsed --json output of kwatch.
struct JsonRun {
  std::vector<json> events;
  std::vector<json> watches;
  std::vector<json> call_ends;  // per-call watches (--in): one per call that ended
  std::vector<json> moves;      // --follow
  json summary;
};

inline JsonRun ParseJsonLines(const std::string& out) {
  JsonRun run;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    json j = json::parse(std::string(line));
    const std::string type = j.value("type", "");
    if (type == "event") {
      run.events.push_back(std::move(j));
    } else if (type == "watch") {
      run.watches.push_back(std::move(j));
    } else if (type == "call_end") {
      run.call_ends.push_back(std::move(j));
    } else if (type == "move") {
      run.moves.push_back(std::move(j));
    } else if (type == "summary") {
      run.summary = std::move(j);
    } else {
      ADD_FAILURE() << "unexpected line: " << line;
    }
  }
  return run;
}

// The 1-based line of tests/targets/`file` that contains `needle`; -1 when none does.
inline int TargetSourceLine(const std::string& file, const std::string& needle) {
  std::ifstream in(std::string(KWATCH_SOURCE_DIR) + "/tests/targets/" + file);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find(needle) != std::string::npos) {
      return n;
    }
  }
  return -1;
}

// The 1-based line of field_writer.c that contains `needle`.
inline int SourceLine(const std::string& needle) {
  return TargetSourceLine("field_writer.c", needle);
}

inline std::string TruthFile(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/truth-", name, "-", getpid(), ".jsonl");
}

inline RunResult RunKwatch(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {KwatchPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = kwatch::testing::Run(argv);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

// The program a running kwatch launched: its only child, found through /proc (0 if none).
inline pid_t LaunchedTarget(pid_t kwatch) {
  std::ifstream children(absl::StrCat("/proc/", kwatch, "/task/", kwatch, "/children"));
  pid_t target = 0;
  children >> target;
  return target;
}

}  // namespace kwatch::clitest
