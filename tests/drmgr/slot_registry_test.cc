// drmgr/slot_registry.h: publishing allocator snapshots for `kwatch slots`, and reading the
// files back as untrusted input.
#include "drmgr/slot_registry.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "drmgr/slot_allocator.h"

namespace kwatch::drmgr {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

namespace fs = std::filesystem;

// A fresh private run directory in KWATCH_RUN_DIR for each test.
class SlotRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = absl::StrCat(::testing::TempDir(), "/kwatch-registry-XXXXXX");
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = absl::StrCat(root_, "/run");
    ::setenv("KWATCH_RUN_DIR", dir_.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): one thread
  }
  void TearDown() override {
    UnpublishSlots();
    ::unsetenv("KWATCH_RUN_DIR");  // NOLINT(concurrency-mt-unsafe): one thread
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  void WriteFile(const std::string& name, const std::string& text) {
    fs::create_directories(dir_);
    fs::permissions(dir_, fs::perms::owner_all);
    std::ofstream(absl::StrCat(dir_, "/", name)) << text;
  }

  std::string root_;
  std::string dir_;
};

// A snapshot with every kind of state: hardware, shared, multiplexed with coverage,
// preempted, pages, failed, external slots.
drmgr::AllocatorSnapshot RichSnapshot(pid_t pid) {
  drmgr::SlotAllocator a;
  const drmgr::ClientId w = a.AddClient(drmgr::ClientKind::kWatchpoint, "kwatch");
  const drmgr::ClientId g = a.AddClient(drmgr::ClientKind::kDebugger, "gdb");
  const auto req = [&](uint64_t addr, uint64_t len, drmgr::DrKind kind, drmgr::Scope scope,
                       drmgr::ShortagePolicy policy, const std::string& label) {
    drmgr::SlotRequest r;
    r.addr = core::RemoteAddr{addr};
    r.len = len;
    r.kind = kind;
    r.scope = scope;
    r.policy = policy;
    r.label = label;
    return r;
  };
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  a.AdvanceClock(t0);
  const drmgr::Scope proc = drmgr::Scope::Process(pid);
  const drmgr::Scope thread = drmgr::Scope::Thread(pid, pid + 1);
  EXPECT_TRUE(
      a.Request(w, req(0x1000, 8, drmgr::DrKind::kWrite, proc, drmgr::ShortagePolicy::kFail, "g_a"))
          .ok());
  EXPECT_TRUE(a.Request(w, req(0x1000, 8, drmgr::DrKind::kReadWrite, proc,
                               drmgr::ShortagePolicy::kFail, "g_a (rw)"))
                  .ok());
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(a.Request(w, req(0x2000 + 8 * i, 8, drmgr::DrKind::kWrite, thread,
                                 drmgr::ShortagePolicy::kMultiplex, absl::StrCat("m", i)))
                    .ok());
  }
  EXPECT_TRUE(a.Request(w, req(0x3000, 48, drmgr::DrKind::kWrite, thread,
                               drmgr::ShortagePolicy::kFallbackPages, "big"))
                  .ok());
  EXPECT_TRUE(a.Request(w, req(0x4000, 48, drmgr::DrKind::kWrite, thread,
                               drmgr::ShortagePolicy::kFail, "too big"))
                  .ok());
  EXPECT_TRUE(a.Request(g, req(0x5000, 1, drmgr::DrKind::kExec, thread,
                               drmgr::ShortagePolicy::kPreemptLower, "gdb break"))
                  .ok());
  EXPECT_TRUE(a.MarkExternallyHeld(drmgr::Scope::Thread(pid, pid + 2), 3).ok());
  for (int i = 1; i <= 5; ++i) {
    a.Rotate(t0 + absl::Milliseconds(10 * i));
  }
  a.AdvanceClock(t0 + absl::Milliseconds(57));
  return a.Snapshot();
}

TEST_F(SlotRegistryTest, PublishThenReadBackEqualSnapshot) {
  const drmgr::AllocatorSnapshot snap = RichSnapshot(4242);
  // The snapshot holds what the display needs: check it is not trivially empty.
  ASSERT_THAT(snap.requests, SizeIs(9));
  ASSERT_TRUE(PublishSlots(4242, snap, "kwatch --write g_a -p 4242").ok());

  const struct stat dir_st = [&] {
    struct stat st {};
    EXPECT_EQ(::lstat(dir_.c_str(), &st), 0);
    return st;
  }();
  EXPECT_EQ(dir_st.st_mode & 0777, 0700U);
  const std::string file = absl::StrCat(dir_, "/kwatch-", ::getpid(), ".json");
  struct stat st {};
  ASSERT_EQ(::lstat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600U);

  std::vector<std::string> notes;
  auto read = ReadPublishedSlots(4242, &notes);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(notes, IsEmpty());
  ASSERT_THAT(*read, SizeIs(1));
  EXPECT_EQ((*read)[0].kwatch_pid, ::getpid());
  EXPECT_EQ((*read)[0].target, 4242);
  EXPECT_EQ((*read)[0].command_line, "kwatch --write g_a -p 4242");
  const auto now = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  EXPECT_LE((*read)[0].updated_ns, now);
  EXPECT_GT((*read)[0].updated_ns, now - uint64_t{60} * 1000000000);
  EXPECT_EQ((*read)[0].snapshot, snap) << "published:\n"
                                       << snap.ToString() << "read:\n"
                                       << (*read)[0].snapshot.ToString();

  // All targets; another target; then gone after UnpublishSlots.
  EXPECT_THAT(*ReadPublishedSlots(0, &notes), SizeIs(1));
  EXPECT_THAT(*ReadPublishedSlots(4243, &notes), IsEmpty());
  UnpublishSlots();
  EXPECT_FALSE(fs::exists(file));
  EXPECT_THAT(*ReadPublishedSlots(0, &notes), IsEmpty());
  UnpublishSlots();  // twice is fine
}

TEST_F(SlotRegistryTest, RepublishReplacesTheFileAndLeavesNoTemporary) {
  ASSERT_TRUE(PublishSlots(10, RichSnapshot(10), "first").ok());
  ASSERT_TRUE(PublishSlots(11, drmgr::AllocatorSnapshot{}, "second").ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::ElementsAre(absl::StrCat("kwatch-", ::getpid(), ".json")));
  auto read = ReadPublishedSlots(0, nullptr);
  ASSERT_TRUE(read.ok());
  ASSERT_THAT(*read, SizeIs(1));
  EXPECT_EQ((*read)[0].target, 11);
  EXPECT_EQ((*read)[0].command_line, "second");
  EXPECT_EQ((*read)[0].snapshot, drmgr::AllocatorSnapshot{});
}

TEST_F(SlotRegistryTest, NoDirectoryMeansNoSessions) {
  std::vector<std::string> notes;
  auto read = ReadPublishedSlots(0, &notes);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(*read, IsEmpty());
  EXPECT_FALSE(fs::exists(dir_));  // reading creates nothing
}

TEST_F(SlotRegistryTest, FileOfADeadKwatchIsSkippedAndRemoved) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  PublishedSlots dead;
  dead.kwatch_pid = child;
  dead.target = 77;
  dead.command_line = "kwatch (killed)";
  dead.snapshot = RichSnapshot(77);
  const std::string dead_name = absl::StrCat("kwatch-", child, ".json");
  WriteFile(dead_name, PublishedSlotsToJson(dead, 1));
  // pid 1 is alive, but started at another time than this file says: a reused pid.
  PublishedSlots reused = dead;
  reused.kwatch_pid = 1;
  WriteFile("kwatch-1.json", PublishedSlotsToJson(reused, 999999999999));

  std::vector<std::string> notes;
  auto read = ReadPublishedSlots(0, &notes);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(*read, IsEmpty());
  EXPECT_THAT(notes, IsEmpty());
  EXPECT_FALSE(fs::exists(absl::StrCat(dir_, "/", dead_name)));
  EXPECT_FALSE(fs::exists(absl::StrCat(dir_, "/kwatch-1.json")));
}

TEST_F(SlotRegistryTest, GarbageOversizedAndSymlinkFilesAreIgnoredWithANote) {
  ASSERT_TRUE(PublishSlots(55, RichSnapshot(55), "good").ok());
  WriteFile("kwatch-900001.json", "this is not json {");
  WriteFile("kwatch-900002.json", R"({"format":"kwatch-slots","version":1})");
  WriteFile("kwatch-900003.json", std::string(static_cast<size_t>(kMaxRegistryFileBytes) + 1, ' '));
  // A file whose snapshot has a scope with three slots.
  PublishedSlots p;
  p.kwatch_pid = 900004;
  p.target = 55;
  p.snapshot = RichSnapshot(55);
  std::string text = PublishedSlotsToJson(p, 1);
  const std::string slot =
      R"({"addr":0,"coverage":1.0,"displaced":[],"holders":[],"kind":"write","len":0,"state":"free"},)";
  const size_t at = text.find(slot);
  ASSERT_NE(at, std::string::npos) << text;
  text.erase(at, slot.size());
  WriteFile("kwatch-900004.json", text);
  // Names another pid than its file name.
  p.kwatch_pid = ::getpid();
  WriteFile("kwatch-900005.json", PublishedSlotsToJson(p, 1));
  fs::create_symlink("/etc/passwd", absl::StrCat(dir_, "/kwatch-900006.json"));
  WriteFile("unrelated.txt", "x");

  std::vector<std::string> notes;
  auto read = ReadPublishedSlots(0, &notes);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_THAT(*read, SizeIs(1));
  EXPECT_EQ((*read)[0].command_line, "good");
  std::sort(notes.begin(), notes.end());
  ASSERT_THAT(notes, SizeIs(6)) << ::testing::PrintToString(notes);
  EXPECT_EQ(notes[0], absl::StrCat("ignoring ", dir_, "/kwatch-900001.json: not JSON"));
  EXPECT_EQ(notes[1],
            absl::StrCat("ignoring ", dir_, "/kwatch-900002.json: file has no \"kwatch_pid\""));
  EXPECT_EQ(notes[2],
            absl::StrCat("ignoring ", dir_, "/kwatch-900003.json: is larger than 4194304 bytes"));
  EXPECT_THAT(notes[3], HasSubstr("kwatch-900004.json: file.snapshot.scopes["));
  EXPECT_THAT(notes[3], HasSubstr("] does not have 4 slots"));
  EXPECT_EQ(notes[4], absl::StrCat("ignoring ", dir_, "/kwatch-900005.json: it names kwatch pid ",
                                   ::getpid()));
  EXPECT_EQ(notes[5], absl::StrCat("ignoring ", dir_, "/kwatch-900006.json: is a symlink"));
  // Nothing was removed: only files of dead kwatch processes are.
  EXPECT_TRUE(fs::exists(absl::StrCat(dir_, "/kwatch-900001.json")));
}

TEST_F(SlotRegistryTest, EveryTruncationIsACleanError) {
  PublishedSlots p;
  p.kwatch_pid = ::getpid();
  p.target = 9;
  p.command_line = "kwatch";
  p.snapshot = RichSnapshot(9);
  const std::string text = PublishedSlotsToJson(p, 1);
  ASSERT_TRUE(PublishedSlotsFromJson(text, nullptr).ok());
  for (size_t n = 0; n + 2 < text.size(); n += 7) {
    auto r = PublishedSlotsFromJson(absl::string_view(text).substr(0, n), nullptr);
    EXPECT_FALSE(r.ok()) << n;
  }
  // Wrong types and values in a valid document.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"("state":"armed")", R"("state":"on fire")"},
           {R"("len":8)", R"("len":3)"},
           {R"("kind":"process")", R"("kind":"galaxy")"},
           {R"("coverage":1.0)", R"("coverage":7.5)"},
           {R"("priority":10)", R"("priority":"high")"},
           {R"("scopes":[)", R"("scopes":{"a":[)"},
       }) {
    std::string bad = text;
    const size_t at = bad.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    bad.replace(at, from.size(), to);
    auto r = PublishedSlotsFromJson(bad, nullptr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << to;
  }
}

TEST_F(SlotRegistryTest, UnsafeDirectoryIsRefused) {
  fs::create_directories(dir_);
  fs::permissions(dir_, static_cast<fs::perms>(0755));
  absl::Status s = PublishSlots(1, drmgr::AllocatorSnapshot{}, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("`chmod 700 ", dir_, "`")));
  EXPECT_EQ(ReadPublishedSlots(0, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);

  fs::remove(dir_);
  const std::string real = absl::StrCat(root_, "/real");
  fs::create_directories(real);
  fs::permissions(real, fs::perms::owner_all);
  fs::create_directory_symlink(real, dir_);
  s = PublishSlots(1, drmgr::AllocatorSnapshot{}, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is not a directory (a symlink or a file)"));
  EXPECT_TRUE(fs::is_empty(real));
}

TEST_F(SlotRegistryTest, RunDirectoryComesFromTheEnvironmentFirst) {
  EXPECT_EQ(SlotRegistryDir(), dir_);
  ::unsetenv("KWATCH_RUN_DIR");  // NOLINT(concurrency-mt-unsafe): one thread
  // Tests run as root, for whom /run is writable.
  ASSERT_EQ(::geteuid(), 0U) << "this test expects to run as root";
  EXPECT_EQ(SlotRegistryDir(), "/run/kwatch");
  ::setenv("KWATCH_RUN_DIR", dir_.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): one thread
}

}  // namespace
}  // namespace kwatch::drmgr
