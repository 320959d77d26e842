// TraceReader against crafted recordings (a recording is a file people share): what exceeds
// the documented limits (core/store/recording_limits.h) is refused with the reason, what stays
// within them reads back byte for byte (escaping names is the display's job).
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/store/recording_limits.h"
#include "core/store/trace_reader.h"
#include "tests/crafted_recording.h"

namespace kwatch::core::store {
namespace {

using ::kwatch::testing::CraftFieldsSql;
using ::kwatch::testing::CraftSpec;
using ::kwatch::testing::CraftSql;
using ::kwatch::testing::CraftWrite;
using ::kwatch::testing::WriteCraftBase;
using ::testing::HasSubstr;

std::string Fresh(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/hostile-", name, "-", getpid());
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::filesystem::remove(path + suffix);
  }
  return path;
}

std::string Base(const std::string& name, const CraftSpec& spec = {}) {
  const std::string path = Fresh(name);
  const absl::Status s = WriteCraftBase(path, spec);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

TEST(HostileRecordingTest, NamesWithControlBytesReadBackExactly) {
  const std::string path = Base("escapes");
  const std::string evil = "g\x1b]0;title\x07\x1b[31m\xff\xc2\x9b";
  ASSERT_TRUE(
      CraftSql(path, "UPDATE watches SET expr = ?1; UPDATE fields SET path = ?1;", {evil}).ok());
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->watches()[0].expr, evil);
  EXPECT_EQ((*r)->watches()[0].fields[0].path, evil);
}

TEST(HostileRecordingTest, StringsUpToTheLimitReadAndLongerOnesAreRefused) {
  const std::string path = Base("long");
  ASSERT_TRUE(
      CraftSql(path, "UPDATE watches SET type_name = ?1", {std::string(kMaxRecordedText, 't')})
          .ok());
  {
    auto r = TraceReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->watches()[0].type_name.size(), kMaxRecordedText);
  }
  ASSERT_TRUE(
      CraftSql(path, "UPDATE watches SET expr = ?1", {std::string(kMaxRecordedText + 1, 'e')})
          .ok());
  auto r = TraceReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      r.status().message(),
      HasSubstr(absl::StrCat(path, ": refused: watches.expr of watch 0 is ", kMaxRecordedText + 1,
                             " bytes; kwatch reads at most ", kMaxRecordedText)));
  EXPECT_THAT(r.status().message(), HasSubstr("docs/recording.md"));
}

TEST(HostileRecordingTest, EveryStringColumnIsBounded) {
  CraftSpec spec;
  spec.sites.push_back({RemoteAddr{0x401000}, "f", 0, "f.c", 1, "mov", "g"});
  spec.tasks.push_back({100, 100, "prog"});
  spec.probes.push_back({1, "ev", "ev x", RemoteAddr{0x401000}, "f", "f.c", 1, false});
  const std::string path = Base("columns", spec);
  const std::string big(kMaxRecordedText + 1, 'x');
  // Each column on its own, in a fresh copy of the file.
  const struct {
    const char* sql;
    const char* what;
  } kCases[] = {
      {"UPDATE session SET host = ?1", "session.host is"},
      {"UPDATE session SET exit_reason = ?1", "session.exit_reason is"},
      {"UPDATE fields SET type_name = ?1 WHERE idx = 1", "fields.type_name of watch 0 is"},
      {"UPDATE sites SET function = ?1", "sites.function of site 0x401000 is"},
      {"UPDATE sites SET file = ?1", "sites.file of site 0x401000 is"},
      {"UPDATE sites SET inlined = ?1", "sites.inlined of site 0x401000 is"},
      {"UPDATE tasks SET comm = ?1", "tasks.comm of task 100 is"},
      {"UPDATE probes SET spec = ?1", "probes.spec of probe 1 is"},
  };
  for (const auto& c : kCases) {
    const std::string copy = Fresh("columns-copy");
    std::filesystem::copy_file(path, copy);
    ASSERT_TRUE(CraftSql(copy, c.sql, {big}).ok()) << c.sql;
    auto r = TraceReader::Open(copy);
    ASSERT_FALSE(r.ok()) << c.sql;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << c.sql;
    EXPECT_THAT(r.status().message(), HasSubstr(c.what));
  }
}

TEST(HostileRecordingTest, AValueTooLargeToHoldIsRefusedBeforeItIsLoaded) {
  // SQLite refuses to load it (SQLITE_LIMIT_LENGTH): a 380 MB name cost 13 GB before.
  const std::string path = Base("huge");
  ASSERT_TRUE(
      CraftSql(path, "UPDATE watches SET expr = ?1", {std::string(kMaxRecordedValue + 1, 'h')})
          .ok());
  auto r = TraceReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat(path, ": refused: it holds a value of more than ",
                                     kMaxRecordedValue, " bytes")));
}

TEST(HostileRecordingTest, TheCommandLineHasItsOwnLargerLimit) {
  const std::string path = Base("cmdline");
  ASSERT_TRUE(CraftSql(path, "UPDATE session SET command_line = ?1",
                       {std::string(kMaxRecordedCommandLine, 'c')})
                  .ok());
  {
    auto r = TraceReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->session().command_line.size(), kMaxRecordedCommandLine);
  }
  ASSERT_TRUE(CraftSql(path, "UPDATE session SET command_line = command_line || 'c'").ok());
  auto r = TraceReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("session.command_line is"));
}

TEST(HostileRecordingTest, WatchIdsOutsideTheRangeAreRefused) {
  // 2^32 would alias watch 0 once cast to 32 bits.
  for (const int64_t id : {int64_t{kMaxRecordedWatches}, int64_t{-1}, int64_t{1} << 32}) {
    const std::string path = Base("ids");
    ASSERT_TRUE(
        CraftSql(path, absl::StrCat("INSERT INTO watches SELECT ", id,
                                    ", expr, address, length, kind, backend, coverage, type_name "
                                    "FROM watches WHERE id = 0"))
            .ok());
    auto r = TraceReader::Open(path);
    ASSERT_FALSE(r.ok()) << id;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(r.status().message(),
                HasSubstr(absl::StrCat("a watch has id ", id, "; kwatch numbers watches 0 to ",
                                       kMaxRecordedWatches - 1)));
  }
  const std::string path = Base("ids-ok");
  ASSERT_TRUE(CraftSql(path, absl::StrCat("INSERT INTO watches SELECT ", kMaxRecordedWatches - 1,
                                          ", expr, address, length, kind, backend, coverage, "
                                          "type_name FROM watches WHERE id = 0"))
                  .ok());
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->watches().back().id, kMaxRecordedWatches - 1);
}

TEST(HostileRecordingTest, FieldsUpToTheLimitReadAndMoreAreRefused) {
  const std::string path = Base("fields");
  // The base watch has 2 fields: add up to the limit exactly.
  ASSERT_TRUE(CraftSql(path, CraftFieldsSql(0, kMaxRecordedFields - 2)).ok());
  {
    auto r = TraceReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->watches()[0].fields.size(), kMaxRecordedFields);
  }
  ASSERT_TRUE(
      CraftSql(path, "INSERT INTO fields VALUES(0, 999, '.x', 'int', 0, 4, 0, 0, 0, 1, 0)").ok());
  auto r = TraceReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("its watches have more than ", kMaxRecordedFields,
                                     " fields, the most kwatch reads")));
}

TEST(HostileRecordingTest, FieldNamesTakingTooMuchTogetherAreRefused) {
  // A 64 KiB expression repeated in each field's name: 1100 fields make 70 MB of names.
  const std::string path = Base("names");
  ASSERT_TRUE(
      CraftSql(path, "UPDATE watches SET expr = ?1", {std::string(kMaxRecordedText, 'e')}).ok());
  ASSERT_TRUE(CraftSql(path, CraftFieldsSql(0, 1100)).ok());
  auto r = TraceReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("the names of its fields (expression + path) take more than ",
                                     kMaxRecordedFieldNames, " bytes")));
}

TEST(HostileRecordingTest, OversizedHitArgumentsStopTheStreamWithTheReason) {
  CraftSpec spec;
  spec.probes.push_back({1, "ev", "ev x", RemoteAddr{0x401000}, "f", "f.c", 1, false});
  HitRecord h;
  h.time_ns = testing::kCraftStartNs + 10;
  h.pid = 100;
  h.tid = 100;
  h.probe_id = 1;
  h.args = {{"x", "1"}};
  spec.hits = {h, h};
  const std::string path = Base("args", spec);
  ASSERT_TRUE(CraftSql(path,
                       "UPDATE hits SET args = '{\"x\":\"' || ?1 || '\"}' WHERE rowid = "
                       "(SELECT max(rowid) FROM hits)",
                       {std::string(kMaxRecordedArgs, 'a')})
                  .ok());
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  int seen = 0;
  const absl::Status s = (*r)->ForEachHit({}, [&](const HitRecord&) {
    ++seen;
    return true;
  });
  EXPECT_EQ(seen, 1);  // the first hit, then the refusal
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("hits.args"));
}

TEST(HostileRecordingTest, EventsOfUnknownWatchesStillRead) {
  // Events naming watch ids nobody declared (or beyond 32 bits) are delivered as they are:
  // the profile counts them as ignored.
  CraftSpec spec;
  spec.events = {CraftWrite(10, 101, 0)};
  const std::string path = Base("unknown", spec);
  ASSERT_TRUE(CraftSql(path, "UPDATE events SET watch_id = 5000").ok());
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  int seen = 0;
  ASSERT_TRUE((*r)->ForEachEvent({},
                                 [&](const AccessEvent& e) {
                                   EXPECT_EQ(e.watch_id, 5000u);
                                   ++seen;
                                   return true;
                                 })
                  .ok());
  EXPECT_EQ(seen, 1);
}

}  // namespace
}  // namespace kwatch::core::store

namespace kwatch::core::store {
namespace {

// A recording with one count() aggregation of one row (5 hits).
std::string WithAggregation(const std::string& name) {
  const std::string path = Base(name);
  EXPECT_TRUE(CraftSql(path,
                       "INSERT INTO aggregates VALUES(0, 0, 'ev', 'count()', 'count', 0);"
                       "INSERT INTO aggregate_rows VALUES(0, 0, '{}', 5, 5);")
                  .ok());
  return path;
}

TEST(HostileRecordingTest, AggregationValuesAreNumbersOrTheRecordingIsRefused) {
  {
    auto r = TraceReader::Open(WithAggregation("agg-ok"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ((*r)->aggregates().size(), 1u);
    EXPECT_EQ((*r)->aggregates()[0].rows.at(0).value, "5");
  }
  // What the report would print unquoted in JSON must be a number.
  for (const char* sql :
       {"UPDATE aggregate_rows SET value = '1},\"x\":{'", "UPDATE aggregate_rows SET value = NULL",
        "UPDATE aggregate_rows SET value = x'3132'", "UPDATE aggregate_rows SET value = '-1'",
        "UPDATE aggregates SET func = 'evil'", "UPDATE aggregate_rows SET key = '[1]'",
        "UPDATE aggregate_rows SET idx = 7"}) {
    const std::string path = WithAggregation("agg-bad");
    ASSERT_TRUE(CraftSql(path, sql).ok()) << sql;
    auto r = TraceReader::Open(path);
    ASSERT_FALSE(r.ok()) << sql;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << sql << ": " << r.status();
  }
}

TEST(HostileRecordingTest, AggregationsBeyondTheLimitsAreRefused) {
  const std::string path = WithAggregation("agg-many");
  ASSERT_TRUE(CraftSql(path, absl::StrCat("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
                                          "FROM n WHERE i < ",
                                          kMaxRecordedAggregates - 1,
                                          ") INSERT INTO aggregates SELECT i, 0, 'ev', 'count()', "
                                          "'count', 0 FROM n"))
                  .ok());
  {
    auto r = TraceReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->aggregates().size(), kMaxRecordedAggregates);
  }
  ASSERT_TRUE(CraftSql(path, absl::StrCat("INSERT INTO aggregates VALUES(", kMaxRecordedAggregates,
                                          ", 0, 'ev', 'count()', 'count', 0)"))
                  .ok());
  auto r = TraceReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("the number of aggregations is ", kMaxRecordedAggregates + 1,
                                     " rows; kwatch reads at most ", kMaxRecordedAggregates)));
  // Buckets: a histogram row of more than the limit.
  const std::string buckets = Base("agg-buckets");
  ASSERT_TRUE(
      CraftSql(buckets, absl::StrCat("INSERT INTO aggregates VALUES(0, 0, 'ev', 'hist(x)', 'hist', "
                                     "0); INSERT INTO aggregate_rows VALUES(0, 0, '{}', NULL, 1);"
                                     "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 "
                                     "FROM n WHERE i < ",
                                     kMaxRecordedAggregateBuckets,
                                     ") INSERT INTO aggregate_buckets SELECT 0, 0, i, i, i + 1, 1 "
                                     "FROM n"))
          .ok());
  r = TraceReader::Open(buckets);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("the number of histogram buckets is ",
                                     kMaxRecordedAggregateBuckets + 1, " rows")));
}

std::string WithStack(const std::string& name) {
  const std::string path = Base(name);
  EXPECT_TRUE(CraftSql(path,
                       "INSERT INTO stack_frames VALUES(1, 0, 4096, 'tick', 0, 't.c', 3);"
                       "INSERT INTO stack_frames VALUES(1, 1, 8192, 'main', 9, 't.c', 9);")
                  .ok());
  return path;
}

TEST(HostileRecordingTest, StacksReadBackOrAreRefusedWithTheReason) {
  {
    auto r = TraceReader::Open(WithStack("stack-ok"));
    ASSERT_TRUE(r.ok()) << r.status();
    const absl::StatusOr<std::vector<StackRecord>> stacks = (*r)->Stacks();
    ASSERT_TRUE(stacks.ok()) << stacks.status();
    ASSERT_EQ(stacks->size(), 1u);
    EXPECT_EQ((*stacks)[0].id, 1u);
    ASSERT_EQ((*stacks)[0].frames.size(), 2u);
    EXPECT_EQ((*stacks)[0].frames[1].function, "main");
    EXPECT_EQ((*stacks)[0].frames[1].offset, 9u);
  }
  for (const char* sql :
       {"UPDATE stack_frames SET idx = 5 WHERE idx = 1", "UPDATE stack_frames SET stack_id = 0"}) {
    const std::string path = WithStack("stack-bad");
    ASSERT_TRUE(CraftSql(path, sql).ok()) << sql;
    auto r = TraceReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    const absl::StatusOr<std::vector<StackRecord>> stacks = (*r)->Stacks();
    ASSERT_FALSE(stacks.ok()) << sql;
    EXPECT_EQ(stacks.status().code(), absl::StatusCode::kDataLoss) << sql << stacks.status();
  }
}

}  // namespace
}  // namespace kwatch::core::store
