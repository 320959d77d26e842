#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/event.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#include "tests/scratch_store.h"

namespace kwatch::core::store {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// A fresh directory per test, removed afterwards.
class TempDir : public ::kwatch::testing::ScratchDir {
 public:
  TempDir() : ScratchDir("kwatch_store") {}
};

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

uint32_t ModeOf(const std::string& path) {
  struct stat st {};
  KW_CHECK(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

SessionRecord TestSession() {
  SessionRecord s;
  s.command_line = "kwatch --rw 'g_stats.hits' -o run.kwdb -- ./server --port 80";
  s.pid = 4242;
  s.kernel = "6.1.0-test";
  s.host = "host-\xc3\xa9";
  s.start_wall_ns = 1'700'000'000'123'456'789ULL;
  s.start_mono_ns = 5'000'000'000ULL;
  s.kwatch_version = "0.1.0";
  s.mode = "watch";
  s.backend = "perf";
  return s;
}

// Events with every shape: unknown CPU, trap_ip apart from ip, values absent, present and
// all-ones, every kind, kernel addresses.
AccessEvent MakeEvent(uint64_t i) {
  AccessEvent e;
  e.time_ns = 5'000'000'000ULL + i * 1000;
  e.pid = 4242;
  e.tid = static_cast<pid_t>(4242 + (i % 3));
  e.cpu = i % 5 == 4 ? kUnknownCpu : static_cast<uint32_t>(i % 2);
  e.watch_id = static_cast<uint32_t>(i % 2);
  e.ip = RemoteAddr{0x555555554000ULL + (i % 7) * 0x10};
  e.trap_ip = i % 4 == 0 ? e.ip : e.ip + 3;
  e.addr = RemoteAddr{i % 11 == 10 ? 0xffffffff82a0c000ULL : 0x555555558010ULL};
  e.len = 8;
  e.access_addr = e.addr + (i % 8);
  e.access_size = static_cast<uint32_t>(i % 9);
  e.kind = static_cast<AccessKind>(i % 3);
  if (i % 6 != 5) {
    e.value = i % 13 == 0 ? kMax : i * 0x1001;
  }
  if (i % 2 == 1) {
    e.old_value = i % 17 == 1 ? kMax : i;
  }
  e.value_exact = i % 2 == 1;
  return e;
}

void ExpectSameEvent(const AccessEvent& got, const AccessEvent& want, uint64_t i) {
  SCOPED_TRACE(::testing::Message() << "event " << i);
  EXPECT_EQ(got.time_ns, want.time_ns);
  EXPECT_EQ(got.pid, want.pid);
  EXPECT_EQ(got.tid, want.tid);
  EXPECT_EQ(got.cpu, want.cpu);
  EXPECT_EQ(got.watch_id, want.watch_id);
  EXPECT_EQ(got.trap_ip, want.trap_ip);
  EXPECT_EQ(got.ip, want.ip);
  EXPECT_EQ(got.addr, want.addr);
  EXPECT_EQ(got.len, want.len);
  EXPECT_EQ(got.access_addr, want.access_addr);
  EXPECT_EQ(got.access_size, want.access_size);
  EXPECT_EQ(got.kind, want.kind);
  EXPECT_EQ(got.value, want.value);
  EXPECT_EQ(got.old_value, want.old_value);
  EXPECT_EQ(got.value_exact, want.value_exact);
}

std::vector<AccessEvent> ReadAll(const TraceReader& r, const EventFilter& f = {},
                                 absl::Status* status = nullptr) {
  std::vector<AccessEvent> out;
  absl::Status s = r.ForEachEvent(f, [&](const AccessEvent& e) {
    out.push_back(e);
    return true;
  });
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

// Events one row each (EventStorage::kRows): what the tests below read back with SQL, and what
// schemas 1 to 6 stored; tests/core/store/event_blocks_test.cc covers the blocks kwatch writes.
std::unique_ptr<TraceWriter> NewWriter(const std::string& path,
                                       size_t batch = TraceWriter::kDefaultBatchSize,
                                       EventStorage storage = EventStorage::kRows) {
  auto w = TraceWriter::Create(path, TestSession(), batch, storage);
  KW_CHECK(w.ok());
  return *std::move(w);
}

std::unique_ptr<TraceReader> OpenOk(const std::string& path) {
  auto r = TraceReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

// A recording of `n` events (MakeEvent(0..n-1)), finished.
void WriteFinished(const std::string& path, uint64_t n) {
  auto w = NewWriter(path);
  WatchRecord watch;
  watch.id = 0;
  watch.expr = "g";
  ASSERT_TRUE(w->AddWatch(watch).ok());
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(w->Append(MakeEvent(i)).ok());
  }
  ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
}

// Runs one SQL statement on the file directly (read-write) and returns the first column of
// its first row as text ("" if none).
std::string Sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  KW_CHECK(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                           nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  std::string out;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
    out = std::string("ERROR ") + sqlite3_errmsg(db);
  } else if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != nullptr) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

TEST(TraceStoreTest, RoundTripsEveryColumn) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  auto w = NewWriter(path);

  WatchRecord w0;
  w0.id = 0;
  w0.expr = "g_stats";
  w0.address = RemoteAddr{0x555555558010ULL};
  w0.length = 16;
  w0.kind = "rw";
  w0.backend = "perf";
  w0.coverage = "16 bytes at 0x555555558010: 2 exact 8-byte slots";
  w0.type_name = "struct stats";
  symbols::FieldLayout f0;
  f0.path = ".hits";
  f0.type_name = "unsigned long";
  f0.offset = 0;
  f0.size = 8;
  f0.depth = 0;
  f0.is_leaf = true;
  symbols::FieldLayout f1;
  f1.path = ".flags";
  f1.type_name = "union flags";
  f1.offset = 8;
  f1.size = 8;
  f1.is_leaf = false;
  f1.is_union = true;
  symbols::FieldLayout f2;
  f2.path = ".flags.dirty";
  f2.type_name = "unsigned int";
  f2.offset = 8;
  f2.size = 4;
  f2.bit_offset = 3;
  f2.bit_size = 1;
  f2.depth = 1;
  w0.fields = {f0, f1, f2};
  WatchRecord w1;
  w1.id = 1;
  w1.expr = "&jiffies";
  w1.address = RemoteAddr{0xffffffff82a0c000ULL};
  w1.length = 8;
  w1.kind = "w";
  w1.backend = "perf";
  ASSERT_TRUE(w->AddWatch(w0).ok());
  ASSERT_TRUE(w->AddWatch(w1).ok());
  // A repeated id is the caller's mistake: refused, and the writer goes on.
  EXPECT_EQ(w->AddWatch(w1).code(), absl::StatusCode::kInvalidArgument);

  const SiteRecord s0{RemoteAddr{0x555555554010ULL}, "bump",     0x10, "server.c", 42,
                      "addq $0x1, 0x2f0e(%rip)",     "count_one"};
  const SiteRecord s1{RemoteAddr{0xffffffff81000000ULL}, "", 0, "", 0, "", ""};
  ASSERT_TRUE(w->AddSite(s0).ok());
  EXPECT_TRUE(w->HasSite(s0.ip));
  EXPECT_FALSE(w->HasSite(s1.ip));
  ASSERT_TRUE(w->AddSite(s1).ok());
  ASSERT_TRUE(w->AddSite(SiteRecord{s0.ip, "other", 1, "x.c", 1, "nop", ""}).ok());  // ignored

  const ProbeRecord p0{1,
                       "handle_request",
                       "handle_request req->len:u32",
                       RemoteAddr{0x555555555100ULL},
                       "handle_request",
                       "server.c",
                       17,
                       false};
  const ProbeRecord p1{2,
                       "handle_request__return",
                       "handle_request%return $retval",
                       RemoteAddr{0x555555555100ULL},
                       "handle_request",
                       "server.c",
                       17,
                       true};
  ASSERT_TRUE(w->AddProbe(p0).ok());
  ASSERT_TRUE(w->AddProbe(p1).ok());
  EXPECT_EQ(w->AddProbe(p1).code(), absl::StatusCode::kInvalidArgument);

  std::vector<AccessEvent> events;
  for (uint64_t i = 0; i < 100; ++i) {
    events.push_back(MakeEvent(i));
    ASSERT_TRUE(w->Append(events.back()).ok());
  }
  HitRecord h0{6'000'000'000ULL,
               4240,
               4243,
               1,
               1,
               RemoteAddr{0x555555555100ULL},
               false,
               {{"len", "42"}, {"name", "\"GET /\"\n"}, {"len", "dup"}}};
  HitRecord h1{
      6'000'000'500ULL, 4251, 4251, kUnknownCpu, 2, RemoteAddr{0x555555555180ULL}, true, {}};
  ASSERT_TRUE(w->AppendHit(h0).ok());
  ASSERT_TRUE(w->AppendHit(h1).ok());
  SessionEnd end;
  end.end_wall_ns = 1'700'000'009'000'000'000ULL;
  end.end_mono_ns = 14'000'000'000ULL;
  end.exit_status = 3;
  end.exit_reason = "target exited with status 3";
  end.lost_count = 7;
  ASSERT_TRUE(w->Finish(end).ok());
  EXPECT_EQ(w->events_committed(), 100u);
  EXPECT_EQ(w->hits_committed(), 2u);
  EXPECT_EQ(w->Finish(end).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Append(events[0]).code(), absl::StatusCode::kFailedPrecondition);
  w.reset();

  // One file, out of WAL mode.
  EXPECT_FALSE(Exists(path + "-wal"));
  EXPECT_FALSE(Exists(path + "-shm"));
  EXPECT_EQ(Sql(path, "PRAGMA journal_mode"), "delete");

  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  const SessionRecord want = TestSession();
  EXPECT_EQ(r->session().command_line, want.command_line);
  EXPECT_EQ(r->session().pid, want.pid);
  EXPECT_EQ(r->session().kernel, want.kernel);
  EXPECT_EQ(r->session().host, want.host);
  EXPECT_EQ(r->session().start_wall_ns, want.start_wall_ns);
  EXPECT_EQ(r->session().start_mono_ns, want.start_mono_ns);
  EXPECT_EQ(r->session().kwatch_version, want.kwatch_version);
  EXPECT_EQ(r->session().mode, want.mode);
  EXPECT_EQ(r->session().backend, want.backend);
  EXPECT_TRUE(r->complete());
  ASSERT_TRUE(r->end().has_value());
  EXPECT_EQ(r->end()->end_wall_ns, end.end_wall_ns);
  EXPECT_EQ(r->end()->end_mono_ns, end.end_mono_ns);
  EXPECT_EQ(r->end()->exit_status, 3);
  EXPECT_EQ(r->end()->exit_reason, end.exit_reason);
  EXPECT_EQ(r->end()->lost_count, 7u);

  ASSERT_EQ(r->watches().size(), 2u);
  const WatchRecord& g0 = r->watches()[0];
  EXPECT_EQ(g0.id, 0u);
  EXPECT_EQ(g0.expr, w0.expr);
  EXPECT_EQ(g0.address, w0.address);
  EXPECT_EQ(g0.length, w0.length);
  EXPECT_EQ(g0.kind, w0.kind);
  EXPECT_EQ(g0.backend, w0.backend);
  EXPECT_EQ(g0.coverage, w0.coverage);
  EXPECT_EQ(g0.type_name, w0.type_name);
  ASSERT_EQ(g0.fields.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(g0.fields[i].path, w0.fields[i].path);
    EXPECT_EQ(g0.fields[i].type_name, w0.fields[i].type_name);
    EXPECT_EQ(g0.fields[i].offset, w0.fields[i].offset);
    EXPECT_EQ(g0.fields[i].size, w0.fields[i].size);
    EXPECT_EQ(g0.fields[i].bit_offset, w0.fields[i].bit_offset);
    EXPECT_EQ(g0.fields[i].bit_size, w0.fields[i].bit_size);
    EXPECT_EQ(g0.fields[i].depth, w0.fields[i].depth);
    EXPECT_EQ(g0.fields[i].is_leaf, w0.fields[i].is_leaf);
    EXPECT_EQ(g0.fields[i].is_union, w0.fields[i].is_union);
  }
  EXPECT_EQ(r->watches()[1].address, w1.address);
  EXPECT_EQ(r->watches()[1].coverage, "");
  EXPECT_TRUE(r->watches()[1].fields.empty());

  ASSERT_EQ(r->sites().size(), 2u);
  const SiteRecord* g = r->FindSite(s0.ip);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->function, "bump");
  EXPECT_EQ(g->offset, 0x10u);
  EXPECT_EQ(g->file, "server.c");
  EXPECT_EQ(g->line, 42);
  EXPECT_EQ(g->disassembly, s0.disassembly);
  EXPECT_EQ(g->inlined, s0.inlined);
  ASSERT_NE(r->FindSite(s1.ip), nullptr);
  EXPECT_EQ(r->sites()[1].ip, s1.ip);  // unsigned order: the kernel address last
  EXPECT_EQ(r->FindSite(RemoteAddr{0x1234}), nullptr);

  ASSERT_EQ(r->probes().size(), 2u);
  EXPECT_EQ(r->probes()[0].id, 1u);
  EXPECT_EQ(r->probes()[0].event, p0.event);
  EXPECT_EQ(r->probes()[0].spec, p0.spec);
  EXPECT_EQ(r->probes()[0].address, p0.address);
  EXPECT_EQ(r->probes()[0].function, p0.function);
  EXPECT_EQ(r->probes()[0].file, p0.file);
  EXPECT_EQ(r->probes()[0].line, 17);
  EXPECT_FALSE(r->probes()[0].is_return);
  EXPECT_TRUE(r->probes()[1].is_return);

  const std::vector<AccessEvent> got = ReadAll(*r);
  ASSERT_EQ(got.size(), events.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectSameEvent(got[i], events[i], i);
  }
  std::vector<HitRecord> hits;
  ASSERT_TRUE(r->ForEachHit({}, [&](const HitRecord& h) {
                 hits.push_back(h);
                 return true;
               }).ok());
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[0], h0);
  EXPECT_EQ(hits[1], h1);
  EXPECT_EQ(hits[0].pid, 4240);  // each hit keeps its process (a child followed with -f)
  EXPECT_EQ(hits[1].pid, 4251);
  EXPECT_EQ(*r->CountEvents(), 100u);
  EXPECT_EQ(*r->CountHits(), 2u);

  // The documented storage: NULL for absent values and unknown CPUs, and trap_ip NULL when
  // it equals ip; args are JSON that SQLite's own functions read.
  auto count = [&](std::function<bool(const AccessEvent&)> pred) {
    return std::to_string(std::count_if(events.begin(), events.end(), pred));
  };
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM events WHERE value IS NULL"),
            count([](const AccessEvent& e) { return !e.value.has_value(); }));
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM events WHERE old_value IS NULL"),
            count([](const AccessEvent& e) { return !e.old_value.has_value(); }));
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM events WHERE cpu IS NULL"),
            count([](const AccessEvent& e) { return e.cpu == kUnknownCpu; }));
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM events WHERE trap_ip IS NULL"),
            count([](const AccessEvent& e) { return e.trap_ip == e.ip; }));
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM events WHERE kind = 'x'"),
            count([](const AccessEvent& e) { return e.kind == AccessKind::kExec; }));
  EXPECT_EQ(Sql(path, "SELECT printf('0x%x', address) FROM watches WHERE id = 1"),
            "0xffffffff82a0c000");
  EXPECT_EQ(Sql(path, "SELECT json_extract(args, '$.name') FROM hits WHERE probe_id = 1"),
            "\"GET /\"\n");
  EXPECT_EQ(Sql(path, "SELECT args FROM hits WHERE probe_id = 2"), "{}");
  EXPECT_EQ(Sql(path, "PRAGMA application_id"), std::to_string(0x6b776462));
  EXPECT_EQ(Sql(path, "PRAGMA user_version"), "8");
  EXPECT_EQ(Sql(path, "SELECT event_count || ' ' || hit_count || ' ' || complete FROM session"),
            "100 2 1");
}

TEST(TraceStoreTest, AbsentEndValuesStayAbsent) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  const uint64_t before = MonotonicClockNs();
  auto w = NewWriter(path);
  ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
  const uint64_t after = MonotonicClockNs();
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->end().has_value());
  EXPECT_FALSE(r->end()->exit_status.has_value());
  EXPECT_EQ(r->end()->exit_reason, "");
  EXPECT_EQ(r->end()->lost_count, 0u);
  // Zero clocks in Finish mean now.
  EXPECT_GE(r->end()->end_mono_ns, before);
  EXPECT_LE(r->end()->end_mono_ns, after);
  EXPECT_GT(r->end()->end_wall_ns, 1'600'000'000'000'000'000ULL);
  EXPECT_EQ(Sql(path, "SELECT exit_status IS NULL FROM session"), "1");
  EXPECT_EQ(*r->CountEvents(), 0u);
  EXPECT_TRUE(ReadAll(*r).empty());
  EXPECT_TRUE(r->watches().empty());
}

class BatchBoundaryTest : public ::testing::TestWithParam<int> {};

// N-1 events stay pending, the N-th commits the batch, N+1 leaves one pending; a reader
// running beside the writer sees exactly what is committed.
TEST_P(BatchBoundaryTest, CommitsExactlyFullBatches) {
  constexpr uint64_t kN = TraceWriter::kDefaultBatchSize;
  const uint64_t count = kN + GetParam();
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  auto w = NewWriter(path);
  for (uint64_t i = 0; i < count; ++i) {
    ASSERT_TRUE(w->Append(MakeEvent(i)).ok());
  }
  const uint64_t committed = count >= kN ? kN : 0;
  EXPECT_EQ(w->events_committed(), committed);
  EXPECT_EQ(w->pending(), count - committed);
  {
    auto live = OpenOk(path);
    ASSERT_NE(live, nullptr);
    EXPECT_FALSE(live->complete());
    EXPECT_FALSE(live->end().has_value());
    EXPECT_EQ(*live->CountEvents(), committed);
    const std::vector<AccessEvent> got = ReadAll(*live);
    ASSERT_EQ(got.size(), committed);
    for (uint64_t i = 0; i < committed; i += 997) {
      ExpectSameEvent(got[i], MakeEvent(i), i);
    }
  }
  ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->complete());
  const std::vector<AccessEvent> got = ReadAll(*r);
  ASSERT_EQ(got.size(), count);
  for (uint64_t i = 0; i < count; ++i) {
    ExpectSameEvent(got[i], MakeEvent(i), i);
  }
}

INSTANTIATE_TEST_SUITE_P(NMinusOneNNPlusOne, BatchBoundaryTest, ::testing::Values(-1, 0, 1));

TEST(TraceStoreTest, FlushCommitsPendingEventsHitsAndSites) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  auto w = NewWriter(path);
  ASSERT_TRUE(w->Append(MakeEvent(0)).ok());
  ASSERT_TRUE(w->AppendHit(HitRecord{1, 2, 2, 0, 1, RemoteAddr{3}, false, {{"a", "b"}}}).ok());
  ASSERT_TRUE(w->AddSite(SiteRecord{RemoteAddr{3}, "f", 0, "f.c", 1, "ret", ""}).ok());
  {
    auto r = OpenOk(path);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(*r->CountEvents(), 0u);
    EXPECT_EQ(*r->CountHits(), 0u);
    EXPECT_TRUE(r->sites().empty());
  }
  ASSERT_TRUE(w->Flush().ok());
  ASSERT_TRUE(w->Flush().ok());  // nothing pending: no-op
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(*r->CountEvents(), 1u);
  EXPECT_EQ(*r->CountHits(), 1u);
  ASSERT_EQ(r->sites().size(), 1u);
  EXPECT_EQ(r->sites()[0].function, "f");
  EXPECT_FALSE(r->complete());
}

TEST(TraceStoreTest, StacksAndTheHitsNamingThemRoundTrip) {
  TempDir dir;
  const std::string path = dir.File("stacks.kwdb");
  auto w = NewWriter(path);
  const StackRecord deep{1,
                         {{
                              RemoteAddr{0x1000},
                              "tick",
                              0,
                              "t.c",
                              17,
                          },
                          {RemoteAddr{0x2010}, "run", 15, "t.c", 25},
                          {RemoteAddr{0x3020}, "", 0, "", 0}}};
  const StackRecord shallow{2, {{RemoteAddr{0x1000}, "tick", 0, "t.c", 17}}};
  ASSERT_TRUE(w->AddStack(deep).ok());
  ASSERT_TRUE(w->AddStack(shallow).ok());
  ASSERT_TRUE(w->AddStack(deep).ok());  // an id already added: ignored
  HitRecord a{1, 2, 2, 0, 1, RemoteAddr{0x1000}, false, {{"i", "1"}}, 1};
  HitRecord b{2, 2, 2, 0, 1, RemoteAddr{0x1000}, false, {{"i", "2"}}, 2};
  HitRecord c{3, 2, 2, 0, 1, RemoteAddr{0x1000}, false, {{"i", "3"}}, 0};
  ASSERT_TRUE(w->AppendHit(a).ok());
  ASSERT_TRUE(w->AppendHit(b).ok());
  ASSERT_TRUE(w->AppendHit(c).ok());
  ASSERT_TRUE(w->Flush().ok());
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  const absl::StatusOr<std::vector<StackRecord>> stacks = r->Stacks();
  ASSERT_TRUE(stacks.ok()) << stacks.status();
  EXPECT_EQ(*stacks, (std::vector<StackRecord>{deep, shallow}));
  std::vector<HitRecord> hits;
  ASSERT_TRUE(r->ForEachHit({}, [&](const HitRecord& h) {
                 hits.push_back(h);
                 return true;
               }).ok());
  EXPECT_EQ(hits, (std::vector<HitRecord>{a, b, c}));
}

// The writer's process dies by SIGKILL after committing a known number of batches and with
// more events pending: the recording opens, is marked cut short, and holds exactly the
// committed events.
TEST(TraceStoreTest, WriterKilledMidRecordingLeavesCommittedBatches) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  constexpr size_t kBatch = 1000;
  constexpr uint64_t kCommitted = 3 * kBatch + 250;  // 3 full batches, then a Flush
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    char result = 'E';
    auto w = TraceWriter::Create(path, TestSession(), kBatch);
    if (w.ok()) {
      WatchRecord watch;
      watch.id = 0;
      watch.expr = "g_stats";
      bool ok = (*w)->AddWatch(watch).ok();
      uint64_t i = 0;
      for (; ok && i < kCommitted; ++i) {
        ok = (*w)->Append(MakeEvent(i)).ok();
      }
      ok = ok && (*w)->Flush().ok() && (*w)->events_committed() == kCommitted;
      for (; ok && i < kCommitted + 500; ++i) {  // pending, never committed
        ok = (*w)->Append(MakeEvent(i)).ok();
      }
      result = ok ? 'R' : 'E';
    }
    (void)!::write(ready[1], &result, 1);
    for (;;) {
      ::pause();
    }
  }
  ::close(ready[1]);
  char result = 0;
  ASSERT_EQ(::read(ready[0], &result, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(result, 'R');
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  EXPECT_TRUE(Exists(path + "-wal"));  // still a WAL recording
  const std::string wal_before = ReadFile(path + "-wal");
  const std::string db_before = ReadFile(path);
  for (int pass = 0; pass < 2; ++pass) {  // reading changes nothing
    auto r = OpenOk(path);
    ASSERT_NE(r, nullptr);
    EXPECT_FALSE(r->complete());
    EXPECT_FALSE(r->end().has_value());
    EXPECT_EQ(r->session().command_line, TestSession().command_line);
    ASSERT_EQ(r->watches().size(), 1u);
    EXPECT_EQ(*r->CountEvents(), kCommitted);
    const std::vector<AccessEvent> got = ReadAll(*r);
    ASSERT_EQ(got.size(), kCommitted);
    for (uint64_t i = 0; i < kCommitted; ++i) {
      ExpectSameEvent(got[i], MakeEvent(i), i);
    }
  }
  EXPECT_TRUE(ReadFile(path) == db_before);
  EXPECT_TRUE(ReadFile(path + "-wal") == wal_before);
}

TEST(TraceStoreTest, WriterDestroyedWithoutFinishCommitsPendingAndStaysCutShort) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  {
    auto w = NewWriter(path);
    for (uint64_t i = 0; i < 10; ++i) {
      ASSERT_TRUE(w->Append(MakeEvent(i)).ok());
    }
  }
  EXPECT_FALSE(Exists(path + "-wal"));
  EXPECT_FALSE(Exists(path + "-shm"));
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->complete());
  EXPECT_FALSE(r->end().has_value());
  EXPECT_EQ(ReadAll(*r).size(), 10u);
  r.reset();
  EXPECT_FALSE(Exists(path + "-wal"));  // reading created nothing beside it
  EXPECT_FALSE(Exists(path + "-shm"));
}

// Batches that overlap in time: each batch is sorted, the recording is flagged out of order,
// reading still comes in time order (sorted by SQLite while unfinished, through the index
// Finish creates afterwards).
TEST(TraceStoreTest, OutOfOrderBatchesReadInTimeOrder) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  auto w = NewWriter(path, 100);
  std::vector<AccessEvent> events;
  for (uint64_t i = 0; i < 250; ++i) {
    events.push_back(MakeEvent(249 - i));  // newest first
    ASSERT_TRUE(w->Append(events.back()).ok());
  }
  ASSERT_TRUE(w->Flush().ok());
  std::sort(events.begin(), events.end(),
            [](const AccessEvent& a, const AccessEvent& b) { return a.time_ns < b.time_ns; });
  EXPECT_EQ(Sql(path, "SELECT events_in_order FROM session"), "0");
  for (int finished = 0; finished < 2; ++finished) {
    SCOPED_TRACE(finished);
    if (finished == 1) {
      ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
      EXPECT_EQ(Sql(path, "SELECT count(*) FROM sqlite_schema WHERE name = 'events_by_time'"), "1");
    }
    auto r = OpenOk(path);
    ASSERT_NE(r, nullptr);
    const std::vector<AccessEvent> got = ReadAll(*r);
    ASSERT_EQ(got.size(), events.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ExpectSameEvent(got[i], events[i], i);
    }
    EventFilter f;
    f.from_ns = events[100].time_ns;
    f.to_ns = events[119].time_ns;
    const std::vector<AccessEvent> window = ReadAll(*r, f);
    ASSERT_EQ(window.size(), 20u);
    EXPECT_EQ(window.front().time_ns, events[100].time_ns);
    EXPECT_EQ(window.back().time_ns, events[119].time_ns);
  }
}

TEST(TraceStoreTest, InOrderRecordingNeedsNoIndex) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFinished(path, 500);
  EXPECT_EQ(Sql(path, "SELECT events_in_order FROM session"), "1");
  EXPECT_EQ(Sql(path,
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND "
                "tbl_name = 'events'"),
            "0");
}

class FilterTest : public ::testing::TestWithParam<bool> {};

// Every filter, alone and combined, against a brute-force selection; in-order and
// out-of-order recordings.
TEST_P(FilterTest, SelectsExactlyTheMatchingEventsAndHits) {
  const bool shuffled = GetParam();
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  std::vector<AccessEvent> events;
  std::vector<HitRecord> hits;
  for (uint64_t i = 0; i < 3000; ++i) {
    events.push_back(MakeEvent(i));
    hits.push_back(HitRecord{MakeEvent(i).time_ns + 1,
                             static_cast<pid_t>(4240 + i % 2),
                             static_cast<pid_t>(4242 + i % 4),
                             static_cast<uint32_t>(i % 2),
                             static_cast<uint32_t>(1 + i % 3),
                             RemoteAddr{0x1000 + i},
                             i % 2 == 0,
                             {{"i", std::to_string(i)}}});
  }
  std::vector<size_t> order(events.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  if (shuffled) {
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
  }
  {
    auto w = NewWriter(path, 256);
    for (size_t i : order) {
      ASSERT_TRUE(w->Append(events[i]).ok());
      ASSERT_TRUE(w->AppendHit(hits[i]).ok());
    }
    ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
  }
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  const uint64_t t0 = events[0].time_ns;
  std::vector<EventFilter> filters(7);
  filters[1].from_ns = t0 + 1000 * 1234 + 1;  // between two events
  filters[2].to_ns = t0 + 1000 * 77;
  filters[3].tid = 4243;
  filters[4].watch_id = 1;
  filters[5].from_ns = t0 + 1000 * 500;
  filters[5].to_ns = t0 + 1000 * 2500;
  filters[5].tid = 4244;
  filters[5].watch_id = 0;
  filters[6].from_ns = t0 + 1000 * 5000;  // after everything
  for (size_t k = 0; k < filters.size(); ++k) {
    SCOPED_TRACE(k);
    const EventFilter& f = filters[k];
    std::vector<AccessEvent> want;
    for (const AccessEvent& e : events) {
      if ((!f.from_ns || e.time_ns >= *f.from_ns) && (!f.to_ns || e.time_ns <= *f.to_ns) &&
          (!f.tid || e.tid == *f.tid) && (!f.watch_id || e.watch_id == *f.watch_id)) {
        want.push_back(e);
      }
    }
    const std::vector<AccessEvent> got = ReadAll(*r, f);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ExpectSameEvent(got[i], want[i], i);
    }
    EXPECT_EQ(*r->CountEvents(f), want.size());

    HitFilter hf;
    hf.from_ns = f.from_ns;
    hf.to_ns = f.to_ns;
    hf.tid = f.tid;
    if (f.watch_id) {
      hf.probe_id = 2;
    }
    std::vector<HitRecord> want_hits;
    for (const HitRecord& h : hits) {
      if ((!hf.from_ns || h.time_ns >= *hf.from_ns) && (!hf.to_ns || h.time_ns <= *hf.to_ns) &&
          (!hf.tid || h.tid == *hf.tid) && (!hf.probe_id || h.probe_id == *hf.probe_id)) {
        want_hits.push_back(h);
      }
    }
    std::vector<HitRecord> got_hits;
    ASSERT_TRUE(r->ForEachHit(hf, [&](const HitRecord& h) {
                   got_hits.push_back(h);
                   return true;
                 }).ok());
    EXPECT_EQ(got_hits, want_hits);
    EXPECT_EQ(*r->CountHits(hf), want_hits.size());
  }
  // The callback stops the stream.
  int seen = 0;
  ASSERT_TRUE(r->ForEachEvent({}, [&](const AccessEvent&) { return ++seen < 5; }).ok());
  EXPECT_EQ(seen, 5);
}

INSTANTIATE_TEST_SUITE_P(InOrderAndShuffled, FilterTest, ::testing::Bool());

TEST(TraceStoreTest, MissingFileIsNotFound) {
  TempDir dir;
  const std::string path = dir.File("nope.kwdb");
  auto r = TraceReader::Open(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(r.status().message(), path)) << r.status();
  EXPECT_FALSE(Exists(path));  // opening created nothing
}

TEST(TraceStoreTest, GarbageFileIsNotARecording) {
  TempDir dir;
  const std::string path = dir.File("garbage.kwdb");
  std::string bytes(64 * 1024, '\0');
  std::mt19937 rng(1);
  for (char& c : bytes) {
    c = static_cast<char>(rng());
  }
  for (const std::string& content : {bytes, std::string("hello, world\n")}) {
    WriteFile(path, content);
    auto r = TraceReader::Open(path);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "not a kwatch recording or corrupted: "))
        << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), path));
    EXPECT_EQ(ReadFile(path), content);  // untouched
  }
  // An empty file is an empty SQLite database, of no application.
  WriteFile(path, "");
  auto r = TraceReader::Open(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "not a kwatch recording")) << r.status();
}

TEST(TraceStoreTest, OtherApplicationsDatabaseIsNotARecording) {
  TempDir dir;
  const std::string path = dir.File("other.db");
  EXPECT_EQ(Sql(path, "CREATE TABLE events(x)"), "");  // creates the file
  for (const char* id : {"0", "1234"}) {
    Sql(path, std::string("PRAGMA application_id=") + id);
    auto r = TraceReader::Open(path);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE(absl::StartsWith(r.status().message(), "not a kwatch recording: " + path))
        << r.status();
    EXPECT_FALSE(absl::StrContains(r.status().message(), "corrupted")) << r.status();
  }
}

TEST(TraceStoreTest, SchemaOneRecordingsReadTheirHitsWithPidZero) {
  // Schema 1 stored no pid per probe hit; its recordings stay readable.
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  {
    auto w = NewWriter(path);
    ASSERT_TRUE(w->AppendHit(HitRecord{5, 4300, 4301, 1, 0, RemoteAddr{0x400000}, false, {}}).ok());
    ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
  }
  EXPECT_EQ(Sql(path, "SELECT pid || '/' || tid FROM hits"), "4300/4301");
  EXPECT_EQ(Sql(path, "ALTER TABLE hits DROP COLUMN pid"), "");
  Sql(path, "PRAGMA user_version=1");
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  std::vector<HitRecord> hits;
  ASSERT_TRUE(r->ForEachHit({}, [&](const HitRecord& h) {
                 hits.push_back(h);
                 return true;
               }).ok());
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].pid, 0);
  EXPECT_EQ(hits[0].tid, 4301);
  EXPECT_EQ(hits[0].ip, RemoteAddr{0x400000});
}

TEST(TraceStoreTest, SchemaTwoRecordingsReadTheirUnionsAsNotUnions) {
  // Schema 2 stored no union flag (its unions' members were counted apart); still readable.
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  {
    auto w = NewWriter(path);
    WatchRecord wr;
    wr.id = 0;
    wr.expr = "g_u";
    wr.address = RemoteAddr{0x601000};
    wr.length = 4;
    wr.kind = "w";
    wr.backend = "perf";
    symbols::FieldLayout u;
    u.path = ".u";
    u.type_name = "union {...}";
    u.size = 4;
    u.is_leaf = false;
    u.is_union = true;
    symbols::FieldLayout i;
    i.path = ".u.i";
    i.type_name = "int";
    i.size = 4;
    i.depth = 1;
    wr.fields = {u, i};
    ASSERT_TRUE(w->AddWatch(wr).ok());
    ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
  }
  EXPECT_EQ(Sql(path, "SELECT group_concat(is_union) FROM fields"), "1,0");
  EXPECT_EQ(Sql(path, "ALTER TABLE fields DROP COLUMN is_union"), "");
  Sql(path, "PRAGMA user_version=2");
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->watches().size(), 1u);
  const std::vector<symbols::FieldLayout>& f = r->watches()[0].fields;
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].path, ".u");
  EXPECT_FALSE(f[0].is_union);
  EXPECT_FALSE(f[0].is_leaf);
  EXPECT_TRUE(f[1].is_leaf);
}

TEST(TraceStoreTest, TheTargetsOwnPidInItsNamespaceIsKeptAndSchemaThreeReadsNone) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  {
    SessionRecord s;
    s.command_line = "kwatch --write g -p 8538";
    s.pid = 8538;
    s.ns_pid = 1;
    s.mode = "watch";
    s.backend = "page";
    auto w = TraceWriter::Create(path, s);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Finish(SessionEnd{}).ok());
  }
  {
    auto r = OpenOk(path);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->session().pid, 8538);
    EXPECT_EQ(r->session().ns_pid, 1);
  }
  // A process in kwatch's namespace: NULL, read as 0.
  const std::string same = dir.File("same.kwdb");
  WriteFinished(same, 1);
  EXPECT_EQ(Sql(same, "SELECT ifnull(ns_pid, 'null') FROM session"), "null");
  // Schema 3 had no column.
  EXPECT_EQ(Sql(path, "ALTER TABLE session DROP COLUMN ns_pid"), "");
  Sql(path, "PRAGMA user_version=3");
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->session().pid, 8538);
  EXPECT_EQ(r->session().ns_pid, 0);
}

TEST(TraceStoreTest, NewerSchemaIsRefusedWithTheVersions) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFinished(path, 10);
  Sql(path, "PRAGMA user_version=99");
  auto r = TraceReader::Open(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            path + ": recorded by a newer kwatch (schema 99); this kwatch reads schema <= 8");
}

TEST(TraceStoreTest, MissingTableIsCorrupted) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFinished(path, 10);
  Sql(path, "DROP TABLE probes");
  auto r = TraceReader::Open(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "not a kwatch recording or corrupted"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "probes")) << r.status();
}

// Truncated copies of a finished recording: Open names the truncation (never a crash, never
// a silently short recording).
TEST(TraceStoreTest, TruncatedFileIsAClearError) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFinished(path, 20000);
  const std::string full = ReadFile(path);
  ASSERT_GT(full.size(), 500'000u);
  const std::string cut = dir.File("cut.kwdb");
  for (size_t size : {full.size() / 2, full.size() / 8, full.size() - 1, size_t{16384},
                      size_t{4096}, size_t{100}, size_t{50}}) {
    SCOPED_TRACE(size);
    WriteFile(cut, full.substr(0, size));
    auto r = TraceReader::Open(cut);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_TRUE(
        absl::StartsWith(r.status().message(), "not a kwatch recording or corrupted: " + cut))
        << r.status();
    if (size >= 4096) {
      EXPECT_TRUE(absl::StrContains(r.status().message(), "truncated")) << r.status();
    }
  }
}

// Damaged pages in the middle: whatever Open and the stream report, every event delivered
// is the recorded one at its position, and a short stream ends in DataLoss.
TEST(TraceStoreTest, DamagedPagesGiveAPrefixAndDataLoss) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  constexpr uint64_t kEvents = 20000;
  WriteFinished(path, kEvents);
  const std::string full = ReadFile(path);
  const std::string bad = dir.File("bad.kwdb");
  int short_streams = 0;
  for (int k = 1; k <= 7; ++k) {
    SCOPED_TRACE(k);
    std::string damaged = full;
    const size_t at = (full.size() / 8 * k) / 16384 * 16384;
    for (size_t i = at; i < at + 16384 && i < damaged.size(); ++i) {
      damaged[i] = static_cast<char>(0xa5 ^ (i * 31));
    }
    WriteFile(bad, damaged);
    auto r = TraceReader::Open(bad);
    if (!r.ok()) {
      EXPECT_TRUE(absl::StrContains(r.status().message(), "not a kwatch recording or corrupted"))
          << r.status();
      continue;
    }
    absl::Status s;
    const std::vector<AccessEvent> got = ReadAll(**r, {}, &s);
    for (size_t i = 0; i < got.size(); ++i) {
      ExpectSameEvent(got[i], MakeEvent(i), i);
    }
    if (s.ok()) {
      EXPECT_EQ(got.size(), kEvents);
    } else {
      ++short_streams;
      EXPECT_LT(got.size(), kEvents);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "not a kwatch recording or corrupted: " + bad))
          << s;
    }
  }
  EXPECT_GT(short_streams, 0);  // some damage hit event pages
}

TEST(TraceStoreTest, SymlinkAtOutputPathIsRefused) {
  TempDir dir;
  const std::string target = dir.File("precious.txt");
  WriteFile(target, "keep me");
  const std::string link = dir.File("run.kwdb");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  auto w = TraceWriter::Create(link, TestSession());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(w.status().message(), "symbolic link")) << w.status();
  EXPECT_EQ(ReadFile(target), "keep me");

  // A dangling one too: nothing is created through it.
  const std::string dangling = dir.File("dangling.kwdb");
  const std::string nowhere = dir.File("nowhere");
  ASSERT_EQ(::symlink(nowhere.c_str(), dangling.c_str()), 0);
  EXPECT_FALSE(TraceWriter::Create(dangling, TestSession()).ok());
  EXPECT_FALSE(Exists(nowhere));

  // A directory is not replaced either.
  const std::string sub = dir.File("sub");
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  EXPECT_EQ(TraceWriter::Create(sub, TestSession()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(TraceStoreTest, RecordingIsMode0600AndReplacesAnExistingFileOnlyWhenComplete) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFile(path, "an old file, world-readable");
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  WriteFile(path + "-wal", "stale wal of an older recording");
  const mode_t old_umask = ::umask(0);
  auto w = TraceWriter::Create(path, TestSession());
  ::umask(old_umask);
  ASSERT_TRUE(w.ok()) << w.status();
  // Written beside the old file, which stays as it was until the new one is complete.
  const std::string aside = path + ".new-" + std::to_string(::getpid());
  EXPECT_EQ((*w)->path(), aside);
  EXPECT_EQ((*w)->replaces(), path);
  ASSERT_TRUE((*w)->Append(MakeEvent(0)).ok());
  ASSERT_TRUE((*w)->Flush().ok());
  EXPECT_EQ(ReadFile(path), "an old file, world-readable");
  EXPECT_EQ(ModeOf(aside), 0600u);
  EXPECT_EQ(ModeOf(aside + "-wal"), 0600u);
  EXPECT_EQ(ModeOf(aside + "-shm"), 0600u);
  ASSERT_TRUE((*w)->Finish(SessionEnd{}).ok());
  EXPECT_EQ((*w)->path(), path);
  EXPECT_EQ((*w)->replaces(), "");
  EXPECT_EQ((*w)->finish_warning(), "");
  EXPECT_EQ(ModeOf(path), 0600u);
  EXPECT_FALSE(Exists(aside));
  EXPECT_FALSE(Exists(path + "-wal"));  // the old recording's WAL went with it
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(ReadAll(*r).size(), 1u);
  EXPECT_TRUE(r->complete());
}

// kwatch killed, or the session failed, while replacing a recording: the old one is intact,
// the new one is readable beside it (cut short).
TEST(TraceStoreTest, AnUnfinishedReplacementLeavesTheOldRecordingAsItWas) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFinished(path, 10);
  const std::string aside = path + ".new-" + std::to_string(::getpid());
  {
    auto w = NewWriter(path);
    ASSERT_EQ(w->path(), aside);
    for (uint64_t i = 0; i < 5; ++i) {
      ASSERT_TRUE(w->Append(MakeEvent(i)).ok());
    }
    ASSERT_TRUE(w->Flush().ok());
  }  // destroyed without Finish
  auto old = OpenOk(path);
  ASSERT_NE(old, nullptr);
  EXPECT_EQ(ReadAll(*old).size(), 10u);
  EXPECT_TRUE(old->complete());
  auto partial = OpenOk(aside);
  ASSERT_NE(partial, nullptr);
  EXPECT_EQ(ReadAll(*partial).size(), 5u);
  EXPECT_FALSE(partial->complete());
}

// A recording whose file holds a rolled-back transaction's hot journal (a writer killed in the
// middle of a write in rollback-journal mode, as during Finish's switch out of WAL mode): a
// read-only open alone fails with "attempt to write a readonly database"; the reader rolls the
// journal back and reads the recording as it was before the interrupted write.
TEST(TraceStoreTest, AHotJournalIsRolledBackAndTheRecordingReadsWhole) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFinished(path, 3000);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      ::_exit(2);
    }
    // A tiny cache spills the changed pages into the file before the commit.
    if (sqlite3_exec(
            db, "PRAGMA cache_size=2; BEGIN; DELETE FROM events; UPDATE session SET complete=0;",
            nullptr, nullptr, nullptr) != SQLITE_OK) {
      ::_exit(3);
    }
    ::_exit(0);  // killed before COMMIT
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_TRUE(Exists(path + "-journal"));
  sqlite3* ro = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &ro, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  EXPECT_NE(sqlite3_exec(ro, "SELECT count(*) FROM events", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_TRUE(absl::StrContains(sqlite3_errmsg(ro), "readonly")) << sqlite3_errmsg(ro);
  sqlite3_close(ro);

  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->complete());
  EXPECT_EQ(ReadAll(*r).size(), 3000u);
  EXPECT_FALSE(Exists(path + "-journal"));
}

// A user who cannot write the file is told what to do instead of "corrupted".
TEST(TraceStoreTest, AHotJournalTheReaderCannotRollBackSaysWhoCan) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFinished(path, 10);
  WriteFile(path + "-journal", std::string(512, 'j'));
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  ASSERT_EQ(::chmod(path.substr(0, path.rfind('/')).c_str(), 0755), 0);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
      ::_exit(99);
    }
    auto r = TraceReader::Open(path);
    const std::string report =
        r.ok() ? "opened"
               : absl::StrCat(static_cast<int>(r.status().code()), " ", r.status().message());
    (void)!::write(pipe_fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) {
    report.append(buf, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_NE(WEXITSTATUS(status), 99) << "cannot switch to uid 65534 (are tests running as root?)";
  EXPECT_EQ(
      report,
      absl::StrCat(static_cast<int>(absl::StatusCode::kFailedPrecondition), " ", path, ": ", path,
                   "-journal holds a write that was interrupted (kwatch killed while "
                   "finishing the recording); opening the recording once with write access "
                   "rolls it back, which this user cannot: run `kwatch report ",
                   path, "` as the file's owner (or `sqlite3 ", path, " 'PRAGMA quick_check'`)"));
}

TEST(TraceStoreTest, MissingDirectoryIsAnError) {
  TempDir dir;
  auto w = TraceWriter::Create(dir.File("no/such/dir/run.kwdb"), TestSession());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
  EXPECT_TRUE(absl::StrContains(w.status().message(), "no/such/dir/run.kwdb")) << w.status();
}

// A write error (here: the file-size limit, as a full disk would) is a Status naming the
// path and SQLite's message; the batches committed before it stay readable.
TEST(TraceStoreTest, WriteErrorKeepsCommittedData) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{2 << 20, 2 << 20};
    std::string report = "E setrlimit";
    if (::setrlimit(RLIMIT_FSIZE, &lim) == 0) {
      auto w = TraceWriter::Create(path, TestSession(), 1000);
      if (!w.ok()) {
        report = "E " + std::string(w.status().message());
      } else {
        absl::Status s;
        uint64_t i = 0;
        for (; s.ok() && i < 1'000'000; ++i) {
          s = (*w)->Append(MakeEvent(i));
        }
        const absl::Status again = (*w)->Flush();
        report = std::to_string((*w)->events_committed()) + " " +
                 std::to_string(static_cast<int>(again == s)) + " " + std::string(s.message());
      }
    }
    (void)!::write(pipe_fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string report;
  char buf[512];
  ssize_t n = 0;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) {
    report.append(buf, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_FALSE(absl::StartsWith(report, "E ")) << report;
  const uint64_t committed = std::stoull(report);
  EXPECT_GT(committed, 0u);
  EXPECT_EQ(committed % 1000, 0u);
  EXPECT_TRUE(absl::StrContains(report, " 1 ")) << report;  // the error is sticky
  EXPECT_TRUE(absl::StrContains(report, path)) << report;
  EXPECT_TRUE(absl::StrContains(report, "disk I/O error") ||
              absl::StrContains(report, "disk is full"))
      << report;
  EXPECT_TRUE(absl::StrContains(report, "(write")) << report;

  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->complete());
  EXPECT_EQ(*r->CountEvents(), committed);
  const std::vector<AccessEvent> got = ReadAll(*r);
  ASSERT_EQ(got.size(), committed);
  for (uint64_t i = 0; i < committed; i += 101) {
    ExpectSameEvent(got[i], MakeEvent(i), i);
  }
}

// Appending flat out, the WAL stays bounded: the checkpoint thread copies it into the
// database and the writer restarts it (TraceWriter::kRestartPages).
// A reader that holds the recording open while kwatch finishes (kwatch-gui --follow) keeps
// the WAL from being folded in: the recording is complete all the same, Finish succeeds with
// a warning naming the -wal file, and the recording reads whole.
TEST(TraceStoreTest, ReaderHoldingTheFileAtFinishLeavesACompleteRecordingAndAWarning) {
  TempDir dir;
  const std::string path = dir.File("held.kwdb");
  auto w = NewWriter(path);
  WatchRecord watch;
  watch.id = 0;
  watch.expr = "g";
  ASSERT_TRUE(w->AddWatch(watch).ok());
  for (uint64_t i = 0; i < 500; ++i) {
    ASSERT_TRUE(w->Append(MakeEvent(i)).ok());
  }
  ASSERT_TRUE(w->Flush().ok());
  sqlite3* reader = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &reader, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(reader, "BEGIN; SELECT count(*) FROM events;", nullptr, nullptr, nullptr),
            SQLITE_OK);
  const absl::Status finished = w->Finish(SessionEnd{});
  EXPECT_TRUE(finished.ok()) << finished;
  EXPECT_TRUE(
      absl::StrContains(w->finish_warning(),
                        "the recording is complete, but its last batches stay in " + path + "-wal"))
      << w->finish_warning();
  sqlite3_exec(reader, "COMMIT", nullptr, nullptr, nullptr);
  sqlite3_close(reader);
  w.reset();
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(ReadAll(*r).size(), 500u);
  // Without a reader, nothing to warn about.
  const std::string plain = dir.File("plain.kwdb");
  auto w2 = NewWriter(plain);
  ASSERT_TRUE(w2->AddWatch(watch).ok());
  ASSERT_TRUE(w2->Finish(SessionEnd{}).ok());
  EXPECT_EQ(w2->finish_warning(), "");
}

TEST(TraceStoreTest, WalStaysBoundedWhileRecording) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  // About 180 MiB of events: a WAL that grew with the recording would pass 160 MiB. The writer
  // restarts it from 64 MiB (waiting from 68 MiB); under load the checkpoint thread may hold it
  // up for a batch or two more, so the bound leaves room above that (a run under ctest -j2
  // right after a lint measured 76 MiB).
  constexpr uint64_t kEvents = 3'000'000;
  auto w = NewWriter(path);
  uint64_t max_wal = 0;
  for (uint64_t i = 0; i < kEvents; ++i) {
    ASSERT_TRUE(w->Append(MakeEvent(i)).ok());
    if (i % 100'000 == 0) {
      struct stat st {};
      ASSERT_EQ(::stat((path + "-wal").c_str(), &st), 0);
      max_wal = std::max<uint64_t>(max_wal, static_cast<uint64_t>(st.st_size));
    }
  }
  ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
  const uint64_t db_size = ReadFile(path).size();
  EXPECT_GT(db_size, 160u << 20);
  EXPECT_LT(max_wal, 96u << 20) << "database " << db_size;
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(*r->CountEvents(), kEvents);
}

}  // namespace
}  // namespace kwatch::core::store

namespace kwatch::core::store {
namespace {

std::vector<AggregateRecord> SampleAggregates() {
  AggregateRecord count;
  count.probe_id = 0;
  count.event = "add_ints";
  count.agg = "count() by tid";
  count.func = "count";
  count.rows = {{{{"tid", "24912"}}, "5", 5, {}}, {{{"tid", "24913"}}, "2", 2, {}}};
  AggregateRecord sum;
  sum.probe_id = 0;
  sum.event = "add_ints";
  sum.agg = "sum(a) by comm,a";
  sum.func = "sum";
  sum.no_value = 3;
  sum.rows = {{{{"comm", "\"prog\""}, {"a", "-7"}}, "-14", 2, {}},
              {{{"comm", "\"\xc3\xa9\x1b\""}, {"a", "x"}}, "18446744073709551615", 1, {}}};
  AggregateRecord avg;
  avg.probe_id = 1;
  avg.event = "fact";
  avg.agg = "avg(n)";
  avg.func = "avg";
  avg.rows = {{{}, "2.5", 4, {}}};
  AggregateRecord avg_whole = avg;
  avg_whole.rows = {{{}, "3", 5, {}}};
  AggregateRecord hist;
  hist.probe_id = 1;
  hist.event = "fact";
  hist.agg = "hist(n)";
  hist.func = "hist";
  hist.rows = {{{},
                "",
                6,
                {{std::nullopt, 0, 1},
                 {0, 1, 0},
                 {1, 2, 1},
                 {2, 4, 2},
                 {4, 8, 2},
                 {int64_t{1} << 62, std::nullopt, 0}}}};
  AggregateRecord lhist;
  lhist.probe_id = 1;
  lhist.event = "fact";
  lhist.agg = "lhist(n, 0, 10, 5) by tid";
  lhist.func = "lhist";
  lhist.rows = {{{{"tid", "1"}}, "", 3, {{std::nullopt, 0, 1}, {0, 5, 2}}},
                {{{"tid", "2"}}, "", 1, {{10, std::nullopt, 1}}}};
  AggregateRecord empty;
  empty.probe_id = 1;
  empty.event = "fact";
  empty.agg = "max(n)";
  empty.func = "max";
  empty.no_value = 9;
  return {count, sum, avg, avg_whole, hist, lhist, empty};
}

TEST(TraceStoreTest, AggregationsReadBackExactly) {
  TempDir dir;
  const std::string path = dir.File("agg.kwdb");
  const std::vector<AggregateRecord> aggs = SampleAggregates();
  {
    auto w = NewWriter(path);
    // Two calls: the second's come after the first's.
    ASSERT_TRUE(w->AddAggregates({aggs.begin(), aggs.begin() + 2}).ok());
    ASSERT_TRUE(w->AddAggregates({aggs.begin() + 2, aggs.end()}).ok());
    ASSERT_TRUE(w->AddAggregates({}).ok());
    ASSERT_TRUE(w->Finish(SessionEnd{}).ok());
  }
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->aggregates().size(), aggs.size());
  for (size_t i = 0; i < aggs.size(); ++i) {
    EXPECT_EQ(r->aggregates()[i], aggs[i]) << i << " " << aggs[i].agg;
  }
  // As sqlite3 shows them: numbers where they fit, buckets with NULL bounds.
  EXPECT_EQ(Sql(path,
                "SELECT group_concat(id || ':' || func || ':' || no_value, ' ') FROM "
                "aggregates"),
            "0:count:0 1:sum:3 2:avg:0 3:avg:0 4:hist:0 5:lhist:0 6:max:9");
  EXPECT_EQ(Sql(path,
                "SELECT group_concat(typeof(value) || '=' || ifnull(value, '-'), ' ') FROM "
                "aggregate_rows"),
            "integer=5 integer=2 integer=-14 text=18446744073709551615 real=2.5 integer=3 null=- "
            "null=- null=-");
  EXPECT_EQ(Sql(path, "SELECT key FROM aggregate_rows WHERE aggregate_id = 1 AND idx = 0"),
            R"({"comm":"\"prog\"","a":"-7"})");
  EXPECT_EQ(Sql(path,
                "SELECT group_concat(ifnull(low, 'null') || '..' || ifnull(high, 'null') || "
                "':' || count, ' ') FROM aggregate_buckets WHERE aggregate_id = 4"),
            "null..0:1 0..1:0 1..2:1 2..4:2 4..8:2 4611686018427387904..null:0");
}

TEST(TraceStoreTest, SchemaFourRecordingsReadWithoutAggregations) {
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  WriteFinished(path, 10);
  for (const char* table : {"aggregates", "aggregate_rows", "aggregate_buckets"}) {
    EXPECT_EQ(Sql(path, absl::StrCat("DROP TABLE ", table)), "");
  }
  Sql(path, "PRAGMA user_version=4");
  auto r = OpenOk(path);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->aggregates().empty());
  EXPECT_EQ(r->CountEvents().value_or(0), 10u);
}

}  // namespace
}  // namespace kwatch::core::store
