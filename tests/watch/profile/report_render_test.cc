#include "watch/profile/report_render.h"

#include <nlohmann/json.hpp>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_split.h"

namespace kwatch::watch::profile {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kStart = 1'000'000'000;
constexpr uint64_t kMs = 1'000'000;

core::AccessEvent Ev(uint64_t t, pid_t tid, uint64_t addr, uint32_t size, core::AccessKind kind,
                     uint64_t ip, uint32_t watch_id = 0) {
  core::AccessEvent ev;
  ev.time_ns = kStart + t;
  ev.pid = 10;
  ev.tid = tid;
  ev.watch_id = watch_id;
  ev.ip = core::RemoteAddr{ip};
  ev.trap_ip = ev.ip;
  ev.addr = core::RemoteAddr{addr};
  ev.len = size;
  ev.access_addr = ev.addr;
  ev.access_size = size;
  ev.kind = kind;
  return ev;
}

// struct s { long hits; unsigned flags : 3, mode : 5; int misses; } g at 0x1000, watched
// 4 ms: thread 11 writes hits 3 times, thread 12 reads it once and writes flags/mode once.
StorageProfile Small() {
  WatchedObject o;
  o.id = 0;
  o.expr = "g";
  o.addr = core::RemoteAddr{0x1000};
  o.length = 16;
  o.type_name = "struct s";
  o.fields = {
      {".hits", "long", 0, 8, 0, 0, 0, true},
      {".flags", "unsigned int", 8, 4, 0, 3, 0, true},
      {".mode", "unsigned int", 8, 4, 3, 5, 0, true},
      {".misses", "int", 12, 4, 0, 0, 0, true},
  };
  ProfileOptions opts;
  opts.start_ns = kStart;
  StorageProfile p({o}, opts);
  for (uint64_t t : {100'000, 200'000, 300'000}) {
    p.Add(Ev(t, 11, 0x1000, 8, core::AccessKind::kWrite, 0x401010));
  }
  p.Add(Ev(1'500'000, 12, 0x1000, 8, core::AccessKind::kRead, 0x401020));
  p.Add(Ev(3'500'000, 12, 0x1008, 1, core::AccessKind::kWrite, 0x401030));
  return p;
}

SiteName Namer(core::RemoteAddr ip) {
  if (ip.value == 0x401010) {
    return {"add_hits", 0x12, "/src/field_writer.c", 41, ""};
  }
  if (ip.value == 0x401020) {
    return {"read_hits", 0, "/src/reader.c", 7, ""};
  }
  return {};
}

// Two threads writing left and right of one line alternately, 10 times, 100 ns apart.
StorageProfile Shared() {
  WatchedObject o;
  o.id = 0;
  o.expr = "g_pair";
  o.addr = core::RemoteAddr{0x2000};
  o.length = 16;
  o.type_name = "struct pair";
  o.fields = {{".left", "long", 0, 8, 0, 0, 0, true}, {".right", "long", 8, 8, 0, 0, 0, true}};
  ProfileOptions opts;
  opts.start_ns = kStart;
  StorageProfile p({o}, opts);
  for (int i = 0; i < 10; ++i) {
    const bool first = i % 2 == 0;
    p.Add(Ev(static_cast<uint64_t>(i) * 100, first ? 21 : 22, first ? 0x2000 : 0x2008, 8,
             core::AccessKind::kWrite, first ? 0x401010 : 0x401020));
  }
  return p;
}

// FormatDuration and the heat levels are watch/profile's: tests/watch/profile/duration_test.cc
// and heat_scale_test.cc.

TEST(ProfileReport, TextFieldTableHeatmapSitesThreads) {
  const StorageProfile p = Small();
  const std::string text = RenderText(p, Namer, {});
  EXPECT_EQ(text, R"(storage profile: 5 events from 2 threads, 100 us to 3.5 ms after the start

watch g (struct s, 16 bytes at 0x1000): 1 read, 4 writes
  field     offset  size  reads  writes  threads  top site
  g.hits         0     8      1       3        2  add_hits+0x12 (field_writer.c:41)
  g.flags      8:0    3b      0       1        1  0x401030
  g.mode       8:3    5b      0       1        1  0x401030
  g.misses      12     4      0       0        0  -
  heatmap: reads+writes per field, one column = 1 ms
  g.hits    |█▒  |
  g.flags   |   ▒|
  g.mode    |   ▒|
  g.misses  |    |
            0 ns 4 ms
  scale: ▒ 1  ▓ 2  █ 3 accesses per column
  top sites:
    reads  writes  site
        0       3  add_hits+0x12 (field_writer.c:41): g.hits
        1       0  read_hits (reader.c:7): g.hits
        0       1  0x401030: g.flags, g.mode
  threads:
    tid 11 (pid 10)
      field   reads  writes
      g.hits      0       3
    tid 12 (pid 10)
      field    reads  writes
      g.hits       1       0
      g.flags      0       1
      g.mode       0       1

false sharing (threads writing disjoint bytes of one 64-byte line within 1 ms):
  no false sharing found
)");
}

// A clock may stamp an event before the session's recorded start (e.g. a sample taken while
// kwatch armed): it shows as a negative time, never as 2^64 ns.
TEST(ProfileReport, ASiteInAnInlinedFunctionNamesItAndItsCaller) {
  const StorageProfile p = Small();
  const auto inlined = [](core::RemoteAddr ip) {
    SiteName n = Namer(ip);
    if (ip.value == 0x401010) {
      n.inlined = "bump_hits";
    }
    return n;
  };
  const std::string text = RenderText(p, inlined, {});
  EXPECT_THAT(text, HasSubstr("  bump_hits inlined in add_hits+0x12 (field_writer.c:41)\n"));
  const nlohmann::json j = RenderJson(p, inlined, {});
  EXPECT_THAT(j.dump(), HasSubstr(R"("function":"add_hits","inlined":"bump_hits")"));
  EXPECT_THAT(j.dump(), HasSubstr(R"("function":"read_hits","ip")"));  // no "inlined"
}

TEST(ProfileReport, AnEventBeforeTheStartShowsANegativeTime) {
  StorageProfile p = Shared();
  core::AccessEvent early = Ev(0, 21, 0x2000, 8, core::AccessKind::kWrite, 0x401010);
  early.time_ns = kStart - 2 * kMs;
  p.Add(early);
  const std::string text = RenderText(p, Namer, ReportRenderOptions{});
  EXPECT_THAT(text, HasSubstr("-2 ms to 900 ns after the start")) << text;
  EXPECT_THAT(text, Not(HasSubstr("18446744073"))) << text;
  const nlohmann::json j = RenderJson(p, Namer, ReportRenderOptions{});
  EXPECT_THAT(j.dump(), Not(HasSubstr("1844674407"))) << j.dump(2);
}

TEST(ProfileReport, FieldFilterAndPrefix) {
  const StorageProfile p = Small();
  ReportRenderOptions o;
  o.field_filter = "i";  // hits, misses
  const std::string text = RenderText(p, Namer, o);
  EXPECT_THAT(text, HasSubstr("\n  g.hits "));
  EXPECT_THAT(text, HasSubstr("\n  g.misses "));
  EXPECT_THAT(text, Not(HasSubstr("g.flags")));
  o.field_filter.clear();
  o.path_prefix = "g.hit";  // not a member boundary
  EXPECT_EQ(RenderCsv(p, Namer, o), "watch,field,offset,size,reads,writes,threads,top_site\n");
  o.path_prefix = "g";
  EXPECT_EQ(RenderCsv(p, Namer, o).size(), RenderCsv(p, Namer, {}).size());
}

TEST(ProfileReport, ThreadFilterCountsOnlyThoseThreads) {
  const StorageProfile p = Small();
  ReportRenderOptions o;
  o.threads = {12};
  EXPECT_EQ(RenderCsv(p, Namer, o),
            "watch,field,offset,size,reads,writes,threads,top_site\n"
            "g,g.hits,0,8,1,0,1,add_hits+0x12 (field_writer.c:41)\n"
            "g,g.flags,8:0,3b,0,1,1,0x401030\n"
            "g,g.mode,8:3,5b,0,1,1,0x401030\n"
            "g,g.misses,12,4,0,0,0,-\n");
  const std::string text = RenderText(p, Namer, o);
  EXPECT_THAT(text, HasSubstr("top sites (all threads):"));
  EXPECT_THAT(text, Not(HasSubstr("tid 11")));
  EXPECT_THAT(text, HasSubstr("  g.hits    | █  |\n"));  // thread 12's read at 1.5 ms
  EXPECT_THAT(text, HasSubstr("  scale: █ 1 accesses per column\n"));
}

TEST(ProfileReport, Csv) {
  const StorageProfile p = Small();
  EXPECT_EQ(RenderCsv(p, Namer, {}),
            "watch,field,offset,size,reads,writes,threads,top_site\n"
            "g,g.hits,0,8,1,3,2,add_hits+0x12 (field_writer.c:41)\n"
            "g,g.flags,8:0,3b,0,1,1,0x401030\n"
            "g,g.mode,8:3,5b,0,1,1,0x401030\n"
            "g,g.misses,12,4,0,0,0,-\n");
  const auto quoting = [](core::RemoteAddr) { return SiteName{"f", 0, "a,\"b\".c", 1, ""}; };
  EXPECT_THAT(RenderCsv(p, quoting, {}), HasSubstr(",2,\"f (a,\"\"b\"\".c:1)\"\n"));
}

TEST(ProfileReport, Json) {
  const StorageProfile p = Small();
  const nlohmann::json j = RenderJson(p, Namer, {});
  EXPECT_EQ(j["events"], 5);
  ASSERT_EQ(j["watches"].size(), 1u);
  const nlohmann::json& w = j["watches"][0];
  EXPECT_EQ(w["expr"], "g");
  EXPECT_EQ(w["address"], "0x1000");
  EXPECT_EQ(w["length"], 16);
  EXPECT_EQ(w["type"], "struct s");
  ASSERT_EQ(w["fields"].size(), 4u);
  const nlohmann::json& hits = w["fields"][0];
  EXPECT_EQ(hits["path"], "g.hits");
  EXPECT_EQ(hits["offset"], 0);
  EXPECT_EQ(hits["size"], 8);
  EXPECT_EQ(hits["reads"], 1);
  EXPECT_EQ(hits["writes"], 3);
  EXPECT_EQ(hits["threads"], 2);
  ASSERT_EQ(hits["top_sites"].size(), 2u);
  EXPECT_EQ(hits["top_sites"][0], (nlohmann::json{{"ip", "0x401010"},
                                                  {"function", "add_hits"},
                                                  {"offset", 0x12},
                                                  {"file", "/src/field_writer.c"},
                                                  {"line", 41},
                                                  {"count", 3},
                                                  {"reads", 0},
                                                  {"writes", 3}}));
  EXPECT_EQ(w["fields"][2]["bit_offset"], 3);
  EXPECT_EQ(w["fields"][2]["bit_size"], 5);
  EXPECT_EQ(w["heatmap"]["bucket_ns"], kMs);
  EXPECT_EQ(w["heatmap"]["columns"], 4);
  EXPECT_EQ(w["heatmap"]["rows"][0]["writes"], (nlohmann::json{3, 0, 0, 0}));
  EXPECT_EQ(w["heatmap"]["rows"][0]["reads"], (nlohmann::json{0, 1, 0, 0}));
  ASSERT_EQ(w["threads"].size(), 2u);
  EXPECT_EQ(w["threads"][1]["tid"], 12);
  EXPECT_EQ(w["threads"][1]["reads"], 1);
  EXPECT_EQ(w["threads"][1]["writes"], 2);  // flags and mode: one event, two fields
  EXPECT_EQ(j["false_sharing"], nlohmann::json::array());
}

TEST(ProfileReport, FalseSharingEvidence) {
  const StorageProfile p = Shared();
  const std::string text = RenderText(p, Namer, {});
  EXPECT_THAT(text, HasSubstr(R"(
false sharing (threads writing disjoint bytes of one 64-byte line within 1 ms):
  line 0x2000: 9 false-sharing transfers (0 true-sharing) from 100 ns to 900 ns
    fields (+offset in line, bytes): g_pair.left (+0, 8), g_pair.right (+8, 8)
    tid 21: 5 writes: g_pair.left x5
      sites: add_hits+0x12 (field_writer.c:41) x5
    tid 22: 5 writes: g_pair.right x5
      sites: read_hits (reader.c:7) x5
)"));
  const nlohmann::json j = RenderJson(p, Namer, {});
  ASSERT_EQ(j["false_sharing"].size(), 1u);
  const nlohmann::json& f = j["false_sharing"][0];
  EXPECT_EQ(f["line"], "0x2000");
  EXPECT_EQ(f["false_transfers"], 9);
  EXPECT_EQ(f["true_transfers"], 0);
  EXPECT_EQ(f["first_ns"], 100);
  EXPECT_EQ(f["last_ns"], 900);
  EXPECT_EQ(f["fields"][1],
            (nlohmann::json{{"path", "g_pair.right"}, {"address", "0x2008"}, {"size", 8}}));
  EXPECT_EQ(f["threads"][0]["tid"], 21);
  EXPECT_EQ(f["threads"][0]["fields"][0], (nlohmann::json{{"path", "g_pair.left"}, {"writes", 5}}));
  EXPECT_EQ(f["threads"][1]["top_sites"][0]["function"], "read_hits");
  EXPECT_EQ(f["shared_fields"], nlohmann::json::array());
}

TEST(ProfileReport, ColourHeatmapAndNarrowWidth) {
  const StorageProfile p = Small();
  ReportRenderOptions o;
  o.color = true;
  const std::string text = RenderText(p, Namer, o);
  // hits: 3 accesses then 1; max 3, 6 levels: upper bounds 0, 1, 1, 2, 2, 3.
  EXPECT_THAT(text, HasSubstr("  g.hits    |\x1b[48;5;196m \x1b[0m\x1b[48;5;220m \x1b[0m  |\n"));
  EXPECT_THAT(text, HasSubstr("  scale: \x1b[48;5;220m  \x1b[0m 1  \x1b[48;5;208m  \x1b[0m 2  "
                              "\x1b[48;5;196m  \x1b[0m 3 accesses per column\n"));
  // 40 columns of 100 us, 30 wide: 2 buckets per column.
  ProfileOptions opts;
  opts.start_ns = kStart;
  opts.initial_bucket_ns = 100'000;
  WatchedObject obj;
  obj.expr = "x";
  obj.addr = core::RemoteAddr{0x3000};
  obj.length = 4;
  StorageProfile q({obj}, opts);
  for (uint64_t t = 0; t < 40; ++t) {
    q.Add(Ev(t * 100'000, 1, 0x3000, 4, core::AccessKind::kWrite, 0x1));
  }
  ReportRenderOptions narrow;
  narrow.width = 30;
  const std::string nt = RenderText(q, nullptr, narrow);
  EXPECT_THAT(nt, HasSubstr("one column = 200 us (2 buckets of 100 us)\n"));
  EXPECT_THAT(nt, HasSubstr("  x  |████████████████████|\n"));  // 20 columns of 2
  EXPECT_THAT(nt, HasSubstr("\n     0 ns              4 ms\n"));
  EXPECT_THAT(nt, HasSubstr("  scale: ▒ 1  █ 2 accesses per column\n"));
  narrow.log_scale = true;
  EXPECT_THAT(RenderText(q, nullptr, narrow),
              HasSubstr("  scale (log): ░ 1  █ 2 accesses per column\n"));
  EXPECT_THAT(nt, HasSubstr("storage profile: 40 events from 1 thread, 0 ns to 3.9 ms"));
}

}  // namespace
}  // namespace kwatch::watch::profile
