// `kwatch report` on crafted recordings (a recording is a file people share): names holding
// terminal escapes are shown escaped in text and CSV, JSON stays valid ASCII JSON whatever
// the bytes, and what exceeds the limits is refused with the reason.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/store/recording_limits.h"
#include "tests/cli/cli_test_util.h"
#include "tests/crafted_recording.h"

namespace kwatch {
namespace {

using ::kwatch::clitest::RunKwatch;
using ::kwatch::testing::CraftFieldsSql;
using ::kwatch::testing::CraftSpec;
using ::kwatch::testing::CraftSql;
using ::kwatch::testing::CraftWrite;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::WriteCraftBase;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

// An OSC sequence setting the window title, a colour, a C1 CSI and a bidi override.
const std::string kEvil =
    "\x1b]0;owned\x07\x1b[31mred\xc2\x9b"
    "2J\xe2\x80\xaert";
const std::string kEvilShown = "\\x1b]0;owned\\x07\\x1b[31mred\\u009b2J\\u202ert";

std::string Fresh(const std::string& name) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/hostile-report-", name, "-", getpid());
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::filesystem::remove(path + suffix);
  }
  return path;
}

// A recording whose every name holds kEvil: watch, type, fields, site, task, command line,
// end reason, probe.
std::string EvilRecording() {
  CraftSpec spec;
  spec.events = {CraftWrite(10, 101, 0), CraftWrite(20, 102, 8)};
  spec.sites.push_back({core::RemoteAddr{0x401000}, "f", 0, "/src/f.c", 7, "mov", ""});
  spec.tasks.push_back({100, 101, "prog"});
  spec.probes.push_back({1, "ev", "ev x", core::RemoteAddr{0x401000}, "f", "f.c", 1, false});
  core::store::HitRecord h;
  h.time_ns = testing::kCraftStartNs + 5;
  h.pid = 100;
  h.tid = 101;
  h.probe_id = 1;
  h.ip = core::RemoteAddr{0x401000};
  h.args = {{"x", "1"}};
  spec.hits = {h};
  const std::string path = Fresh("evil");
  EXPECT_TRUE(WriteCraftBase(path, spec).ok());
  const absl::Status s =
      CraftSql(path,
               "UPDATE watches SET expr = ?1, type_name = ?1; UPDATE fields SET path = path || ?1;"
               "UPDATE sites SET function = ?1, file = '/src/' || ?1; UPDATE tasks SET comm = ?1;"
               "UPDATE session SET command_line = ?1, exit_reason = ?1, host = ?1;"
               "UPDATE probes SET event = ?1, function = ?1, file = ?1, spec = ?1;"
               "UPDATE hits SET args = json_object(?1, ?1);",
               {kEvil});
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

bool HasControlBytes(const std::string& s) {
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if ((b < 0x20 && c != '\n') || b == 0x7f) {
      return true;
    }
  }
  return s.find("\xc2\x9b") != std::string::npos || s.find("\xe2\x80\xae") != std::string::npos;
}

TEST(HostileReport, TextShowsEveryNameEscaped) {
  const std::string path = EvilRecording();
  const RunResult r = RunKwatch({"report", path, "--color", "never"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(HasControlBytes(r.out)) << r.out;
  EXPECT_FALSE(HasControlBytes(r.err)) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("command   ", kEvilShown, "\n")));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("watch ", kEvilShown, " (", kEvilShown, ", 16 bytes")));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(kEvilShown, ".a", kEvilShown)));           // a field
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(kEvilShown, " (", kEvilShown, ":7)")));    // the site
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("tid 101 (pid 100, ", kEvilShown, ")")));  // comm
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("ended     after 0.001s: ", kEvilShown)));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("host      ", kEvilShown, "   kernel")));
  EXPECT_THAT(r.out, HasSubstr(kEvilShown + " " + kEvilShown + "  " + kEvilShown + ":1   1 hits"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("    ", kEvilShown, "  ", kEvilShown, " (1)")));
}

TEST(HostileReport, ColourCellsAreTheOnlyEscapes) {
  // --color always: the heatmap's own colour sequences stay, the names' are escaped.
  const std::string path = EvilRecording();
  const RunResult r = RunKwatch({"report", path, "--color", "always"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\x1b[48;5;"));
  EXPECT_THAT(r.out, Not(HasSubstr("\x1b]")));
  EXPECT_THAT(r.out, Not(HasSubstr("\x1b[31m")));
  EXPECT_THAT(r.out, HasSubstr(kEvilShown));
}

TEST(HostileReport, CsvShowsEveryNameEscaped) {
  const std::string path = EvilRecording();
  const RunResult r = RunKwatch({"report", path, "--format", "csv"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(HasControlBytes(r.out)) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr(absl::StrCat(kEvilShown, ",", kEvilShown, ".a", kEvilShown, ",0,8")));
}

TEST(HostileReport, JsonIsAsciiAndKeepsTheExactNames) {
  const std::string path = EvilRecording();
  // Bytes that are not UTF-8 in a probe value: nlohmann's strict dump threw (the report died).
  ASSERT_TRUE(
      CraftSql(path, "UPDATE hits SET args = '{\"x\":\"' || ?1 || '\"}'", {"\xff\xfe"}).ok());
  const RunResult r = RunKwatch({"report", path, "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char c : r.out) {
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << static_cast<int>(c);
  }
  const json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["watches"][0]["expr"], kEvil);
  EXPECT_EQ(j["watches"][0]["fields"][0]["path"], absl::StrCat(kEvil, ".a", kEvil));
  EXPECT_EQ(j["session"]["command"], kEvil);
  EXPECT_EQ(j["watches"][0]["top_sites"][0]["function"], kEvil);
  EXPECT_EQ(j["probes"][0]["event"], kEvil);
  EXPECT_EQ(j["probes"][0]["top_values"]["x"][0]["value"],
            "\xef\xbf\xbd\xef\xbf\xbd");  // U+FFFD x2
}

TEST(HostileReport, ChromeTraceIsAsciiAndKeepsTheExactNames) {
  const std::string path = EvilRecording();
  const RunResult r = RunKwatch({"report", path, "--format", "chrome-trace"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char c : r.out) {
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << static_cast<int>(c);
  }
  const json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  int accesses = 0;
  int hits = 0;
  int thread_names = 0;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "i" && e["cat"] == "access" && e["args"]["field"] == kEvil + ".a" + kEvil) {
      ++accesses;
      EXPECT_EQ(e["args"]["site"], absl::StrCat(kEvil, "+0x0 (", kEvil, ":7)"));
    } else if (e["ph"] == "i" && e["cat"] == "probe") {
      ++hits;
      EXPECT_EQ(e["name"], kEvil);
      EXPECT_EQ(e["args"][kEvil], kEvil);
    } else if (e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == 101) {
      ++thread_names;
      EXPECT_EQ(e["args"]["name"], absl::StrCat("tid 101 (", kEvil, ")"));
    }
  }
  EXPECT_EQ(accesses, 1) << r.out;
  EXPECT_EQ(hits, 1) << r.out;
  EXPECT_EQ(thread_names, 1) << r.out;
}

TEST(HostileReport, OversizedNamesAreRefusedWithTheLimit) {
  const std::string path = Fresh("long");
  ASSERT_TRUE(WriteCraftBase(path, {}).ok());
  ASSERT_TRUE(CraftSql(path, "UPDATE fields SET path = ?1 WHERE idx = 1",
                       {std::string(core::store::kMaxRecordedText + 1, 'p')})
                  .ok());
  for (const char* format : {"text", "json", "csv", "chrome-trace"}) {
    const RunResult r = RunKwatch({"report", path, "--format", format});
    EXPECT_EQ(r.exit_code, 1) << format;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("kwatch: error: ", path,
                                              ": refused: fields.path of watch 0 is 65537 bytes; "
                                              "kwatch reads at most 65536")));
    EXPECT_EQ(r.out, "");
  }
}

TEST(HostileReport, FortyThousandFieldsReportInEveryFormat) {
  // A 1.5 MB file: 40000 fields, two of them written. Before, the text report held 80000 rows
  // of time columns and the JSON report took 750 MB.
  CraftSpec spec;
  spec.events = {CraftWrite(10, 101, 0, 4), CraftWrite(20, 102, 4 * 39999, 4)};
  const std::string path = Fresh("wide");
  ASSERT_TRUE(WriteCraftBase(path, spec).ok());
  ASSERT_TRUE(CraftSql(path, "DELETE FROM fields; UPDATE watches SET length = 160000;" +
                                 CraftFieldsSql(0, 40000))
                  .ok());
  const RunResult text = RunKwatch({"report", path, "--color", "never"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("g.f39999"));
  const RunResult j = RunKwatch({"report", path, "--format", "json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const json parsed = json::parse(j.out, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded());
  ASSERT_EQ(parsed["watches"][0]["fields"].size(), 40000u);
  EXPECT_EQ(parsed["watches"][0]["fields"][0]["writes"], 1);
  EXPECT_EQ(parsed["watches"][0]["fields"][39999]["writes"], 1);
  EXPECT_EQ(parsed["watches"][0]["fields"][1]["writes"], 0);
  const RunResult csv = RunKwatch({"report", path, "--format", "csv"});
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 40001);
  // The PNG would be 640000 pixels tall: refused with the way out.
  const RunResult png = RunKwatch({"report", path, "--png", Fresh("wide.png")});
  EXPECT_EQ(png.exit_code, 1);
  EXPECT_THAT(png.err, HasSubstr("choose fewer fields with --field"));
}

}  // namespace
}  // namespace kwatch
