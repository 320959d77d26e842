#pragma once

// What the `kwatch probe` end-to-end tests share: private copies of the fixtures (a kernel
// uprobe on a shared file would reach every test's process) and kwatch's JSON lines.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/test_util.h"

namespace kwatch::testing {

using json = nlohmann::json;

class PrivateCopies {
 public:
  explicit PrivateCopies(const std::vector<std::pair<std::string, std::string>>& files) {
    char tmpl[] = "/tmp/kwatch-probe-test-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::permissions(dir_, std::filesystem::perms(0755));
    for (const auto& [from, name] : files) {
      const std::filesystem::path to = dir_ / name;
      std::filesystem::copy_file(from, to);
      std::filesystem::permissions(to, std::filesystem::perms(0755));
    }
  }
  ~PrivateCopies() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivateCopies(const PrivateCopies&) = delete;
  PrivateCopies& operator=(const PrivateCopies&) = delete;
  std::string operator[](const std::string& name) const { return (dir_ / name).string(); }
  // The private copy of the build's fixture `name`, made on first use.
  std::string Get(const std::string& name) {
    const std::filesystem::path to = dir_ / name;
    if (!std::filesystem::exists(to)) {
      std::filesystem::copy_file(::kwatch::testing::TargetPath(name), to);
      std::filesystem::permissions(to, std::filesystem::perms(0755));
    }
    return to.string();
  }

 private:
  std::filesystem::path dir_;
};

// Every fixture this test runs is a private copy. A kernel uprobe (another test's
// `--backend uprobe` on the shared build's file) patches the file's page in every process
// mapping it, and unregistering it writes the original byte back over kwatch's own INT3
// there: tests running in parallel under ctest -j would lose hits to each other.
inline std::string PrivateTargetPath(const std::string& name) {
  static PrivateCopies copies({});
  return copies.Get(name);
}

// kwatch's JSON lines; other lines (the target's own output) are kept apart.
struct JsonRun {
  std::vector<json> hits;
  json summary;
  std::vector<json> aggregates;
  std::vector<std::string> other;
};

inline JsonRun ParseJson(const std::string& out) {
  JsonRun run;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (line.front() != '{') {
      run.other.emplace_back(line);
      continue;
    }
    json j = json::parse(std::string(line));
    if (j["type"] == "hit") {
      run.hits.push_back(std::move(j));
    } else if (j["type"] == "summary") {
      run.summary = std::move(j);
    } else if (j["type"] == "aggregate") {
      run.aggregates.push_back(std::move(j));
    } else {
      ADD_FAILURE() << "unexpected line: " << line;
    }
  }
  return run;
}

inline std::vector<json> OfEvent(const std::vector<json>& hits, const std::string& event) {
  std::vector<json> out;
  for (const json& h : hits) {
    if (h["event"] == event) {
      out.push_back(h);
    }
  }
  return out;
}

}  // namespace kwatch::testing
