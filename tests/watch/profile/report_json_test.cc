// watch/profile/report_render.h: WriteJson writes, a field at a time, exactly what RenderJson
// builds (plus the caller's members), indented as dump(2), ASCII only.
#include <stdio.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/watch/profile/profile_test_util.h"
#include "watch/profile/report_render.h"

namespace kwatch::watch::profile {
namespace {

using testing::Read;
using testing::Write;

constexpr uint64_t kStart = 1'000'000'000;

std::string Written(const StorageProfile& p, const SiteNamer& namer,
                    const ReportRenderOptions& opts, const nlohmann::json& extra) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  WriteJson(p, namer, opts, extra, f);
  fclose(f);
  std::string out(buf, len);
  free(buf);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  return out;
}

StorageProfile TwoWatches() {
  WatchedObject a;
  a.id = 0;
  a.expr = "g\x1b[31m\xff";  // an escape and a byte that is not UTF-8
  a.addr = core::RemoteAddr{0x1000};
  a.length = 16;
  a.type_name = "struct s";
  a.fields = {{".hits", "long", 0, 8, 0, 0, 0, true}, {".misses", "long", 8, 8, 0, 0, 0, true}};
  WatchedObject b;
  b.id = 1;
  b.expr = "h";
  b.addr = core::RemoteAddr{0x2000};
  b.length = 8;
  ProfileOptions opts;
  opts.start_ns = kStart;
  StorageProfile p({a, b}, opts);
  p.Add(Write(kStart + 100, 11, 0x1000, 8, 0x401010, 0));
  p.Add(Write(kStart + 200, 12, 0x1008, 8, 0x401020, 0));
  p.Add(Read(kStart + 5'000'000, 12, 0x1000, 8, 0x401030, 0));
  return p;
}

SiteName Namer(core::RemoteAddr ip) {
  return SiteName{ip.value == 0x401010 ? "add\xc3\xa9" : "f", 4, "/src/f.c", 7, ""};
}

TEST(ReportJson, WriteJsonWritesWhatRenderJsonBuilds) {
  const StorageProfile p = TwoWatches();
  ReportRenderOptions opts;
  opts.task_names[11] = {"worker"};
  const nlohmann::json extra = {{"session", {{"command", "kwatch x"}}}, {"probes", {1, 2}}};
  const std::string out = Written(p, Namer, opts, extra);
  nlohmann::json want = RenderJson(p, Namer, opts);
  want["session"] = extra["session"];
  want["probes"] = extra["probes"];
  // The same text as dumping the whole document at once, indentation included.
  EXPECT_EQ(out, want.dump(2, ' ', true, nlohmann::json::error_handler_t::replace) + "\n");
  for (const char c : out) {
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << static_cast<int>(c);
  }
  const nlohmann::json back = nlohmann::json::parse(out);
  EXPECT_EQ(back["watches"][0]["expr"], "g\x1b[31m\xef\xbf\xbd");  // U+FFFD for \xff
  EXPECT_EQ(back["watches"][0]["fields"][0]["top_sites"][0]["function"], "add\xc3\xa9");
  EXPECT_EQ(back["watches"][1]["fields"].size(), 1u);
  // An untouched field's heat is its zeros, one per column.
  EXPECT_EQ(back["watches"][1]["heatmap"]["rows"][0]["writes"].size(),
            back["watches"][1]["heatmap"]["columns"].get<size_t>());
  EXPECT_EQ(back["watches"][0]["threads"][0]["comm"], "worker");
}

TEST(ReportJson, EmptyProfileWritesEmptyArrays) {
  ProfileOptions opts;
  opts.start_ns = kStart;
  const StorageProfile p({}, opts);
  const std::string out = Written(p, nullptr, {}, nlohmann::json::object());
  EXPECT_EQ(out, RenderJson(p, nullptr, {}).dump(2) + "\n");
  EXPECT_THAT(out, ::testing::HasSubstr("\"watches\": []"));
}

}  // namespace
}  // namespace kwatch::watch::profile
