// TraceWriter when the disk fills up (a real, small tmpfs in a private mount namespace) and
// when the recording's file or directory disappears or moves while recording.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/event.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#include "tests/core/store/private_tmpfs.h"
#include "tests/test_util.h"

namespace kwatch::core::store {
namespace {

SessionRecord Session() {
  SessionRecord s;
  s.command_line = "kwatch --rw g -o run.kwdb -- ./t";
  s.pid = 4242;
  s.kernel = "6.1.0-test";
  s.host = "host";
  s.start_wall_ns = 1'700'000'000'000'000'000ULL;
  s.start_mono_ns = 1'000'000ULL;
  s.kwatch_version = "0.1.0";
  s.mode = "watch";
  s.backend = "page";
  return s;
}

// Event number i (from 1): time i, value i.
AccessEvent Event(uint64_t i) {
  AccessEvent e;
  e.time_ns = 1'000'000ULL + i;
  e.pid = 4242;
  e.tid = static_cast<pid_t>(4242 + (i % 3));
  e.cpu = static_cast<uint32_t>(i % 2);
  e.watch_id = 1;
  e.ip = RemoteAddr{0x555555554000ULL + (i % 7) * 0x10};
  e.trap_ip = e.ip;
  e.addr = RemoteAddr{0x555555558010ULL};
  e.len = 8;
  e.access_addr = e.addr;
  e.access_size = 8;
  e.kind = AccessKind::kWrite;
  e.value = i;
  e.old_value = i - 1;
  e.value_exact = true;
  return e;
}

WatchRecord Watch() {
  WatchRecord w;
  w.id = 1;
  w.expr = "g";
  w.address = RemoteAddr{0x555555558010ULL};
  w.length = 8;
  w.kind = "rw";
  w.backend = "page";
  w.type_name = "long";
  return w;
}

// The events of a recording are exactly 1..n, in order.
void ExpectEventsOneTo(const TraceReader& r, uint64_t n) {
  uint64_t next = 1;
  bool in_sequence = true;
  ASSERT_TRUE(r.ForEachEvent({}, [&](const AccessEvent& e) {
                 in_sequence = in_sequence && e.time_ns == 1'000'000ULL + next && e.value == next;
                 ++next;
                 return true;
               }).ok());
  EXPECT_TRUE(in_sequence);
  EXPECT_EQ(next - 1, n);
  auto count = r.CountEvents();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, n);
}

TEST(TraceWriterFullDisk, StopsWithEnospcAndLeavesTheCommittedEventsReadable) {
  auto fs = testing::PrivateTmpfs::Mount(2 << 20);
  KW_REQUIRE_FEATURE(fs.ok(), std::string(fs.status().message()));
  const std::string path = (*fs)->File("run.kwdb");
  uint64_t committed = 0;
  std::string message;
  {
    auto w = TraceWriter::Create(path, Session(), /*batch_size=*/256);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->AddWatch(Watch()).ok());
    absl::Status s;
    uint64_t i = 1;
    for (; i <= 10'000'000 && s.ok(); ++i) {
      s = (*w)->Append(Event(i));
      if (s.ok() && i % 1000 == 0) {
        s = (*w)->Flush();
      }
    }
    ASSERT_FALSE(s.ok()) << "2 MiB never filled up";
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    message = std::string(s.message());
    committed = (*w)->events_committed();
    EXPECT_GT(committed, 1000u);
    EXPECT_LT(committed, i);
    // Dead: every later call gives the same error.
    EXPECT_EQ((*w)->Append(Event(i)), s);
    EXPECT_EQ((*w)->Flush(), s);
    EXPECT_EQ((*w)->Finish({}), s);
    EXPECT_FALSE((*w)->location_lost());
  }
  EXPECT_TRUE(absl::StrContains(message, path)) << message;
  EXPECT_TRUE(absl::StrContains(message, "No space left on device")) << message;
  EXPECT_TRUE(absl::StrContains(message, absl::StrCat("recording stopped with ", committed,
                                                      " events and 0 probe hits committed")))
      << message;
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)->complete());
  EXPECT_FALSE((*r)->end().has_value());
  EXPECT_TRUE(absl::StartsWith((*r)->cut_reason(), "recording cut short: ")) << (*r)->cut_reason();
  EXPECT_TRUE(absl::StrContains((*r)->cut_reason(), "No space left on device"));
  ASSERT_EQ((*r)->watches().size(), 1u);
  ExpectEventsOneTo(**r, committed);
}

TEST(TraceWriterVanished, RemovedFileSaysTheRecordingIsLost) {
  std::string dir = ::testing::TempDir() + "kwatch_vanish_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/run.kwdb";
  auto w = TraceWriter::Create(path, Session());
  ASSERT_TRUE(w.ok()) << w.status();
  for (uint64_t i = 1; i <= 100; ++i) {
    ASSERT_TRUE((*w)->Append(Event(i)).ok());
  }
  ASSERT_TRUE((*w)->Flush().ok());
  std::filesystem::remove_all(dir);  // rm -rf of the output directory
  for (uint64_t i = 101; i <= 110; ++i) {
    ASSERT_TRUE((*w)->Append(Event(i)).ok());
  }
  const absl::Status s = (*w)->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the recording is lost")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "100 events")) << s;
  EXPECT_TRUE((*w)->location_lost());
  EXPECT_TRUE((*w)->moved_to().empty());
  EXPECT_EQ((*w)->Finish({}), s);
  w->reset();
  struct stat st {};
  EXPECT_NE(::stat(path.c_str(), &st), 0) << "the writer re-created " << path;
}

TEST(TraceWriterVanished, RenamedDirectoryStopsAndNamesTheNewPath) {
  std::string dir = ::testing::TempDir() + "kwatch_moved_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string moved = dir + ".moved";
  const std::string path = dir + "/run.kwdb";
  {
    auto w = TraceWriter::Create(path, Session());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->AddWatch(Watch()).ok());
    for (uint64_t i = 1; i <= 100; ++i) {
      ASSERT_TRUE((*w)->Append(Event(i)).ok());
    }
    ASSERT_TRUE((*w)->Flush().ok());
    ASSERT_EQ(::rename(dir.c_str(), moved.c_str()), 0);
    for (uint64_t i = 101; i <= 107; ++i) {
      ASSERT_TRUE((*w)->Append(Event(i)).ok());
    }
    const absl::Status s = (*w)->Flush();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "the recording is now " + moved + "/run.kwdb")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(),
                                  "recording stopped with 100 events and 0 probe hits committed, "
                                  "7 lost with the failed batch"))
        << s;
    EXPECT_EQ((*w)->moved_to(), moved + "/run.kwdb");
    EXPECT_FALSE((*w)->location_lost());
  }
  // Everything is in the file itself (the WAL was folded in), so the file alone reads.
  ASSERT_EQ(::rename((moved + "/run.kwdb").c_str(), (moved + "/alone.kwdb").c_str()), 0);
  auto r = TraceReader::Open(moved + "/alone.kwdb");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)->complete());
  EXPECT_TRUE(absl::StrContains((*r)->cut_reason(), "renamed")) << (*r)->cut_reason();
  ExpectEventsOneTo(**r, 100);
  r->reset();
  std::filesystem::remove_all(moved);
}

}  // namespace
}  // namespace kwatch::core::store
