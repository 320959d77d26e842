#pragma once

// Helpers of the tests that write recordings: a private scratch directory, and a query's result
// as text.

#include <sqlite3.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace kwatch::testing {

// A new directory under the test's temporary directory, removed with everything in it at the
// end of the scope.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix) {
    std::string tmpl = ::testing::TempDir() + prefix + "_XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The rows `sql` gives on the database at `path`, every value of every row separated by one
// space (NULL as "NULL"); "" when it fails or gives none. The database is opened read-write:
// statements that change it (a test damaging a recording) run too.
inline std::string SqlText(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK) << path;
  std::string out;
  sqlite3_exec(
      db, sql.c_str(),
      [](void* o, int n, char** v, char**) {
        auto* s = static_cast<std::string*>(o);
        for (int i = 0; i < n; ++i) {
          absl::StrAppend(s, s->empty() ? "" : " ", v[i] == nullptr ? "NULL" : v[i]);
        }
        return 0;
      },
      &out, nullptr);
  sqlite3_close(db);
  return out;
}

}  // namespace kwatch::testing
