// End-to-end tests of `kwatch slots`: the real binary on tests/targets/slot_holder.c, whose
// debug registers are taken by perf breakpoints the test opens, by a real gdb, or by a
// session published through drmgr/slot_registry.h.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/base/unique_fd.h"
#include "drmgr/slot_allocator.h"
#include "drmgr/slot_registry.h"
#include "tests/cli/cli_test_util.h"
#include "tests/test_util.h"

namespace kwatch::cli {
namespace {

using ::kwatch::clitest::RunKwatch;
using ::kwatch::testing::HoldBreakpointSlot;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

namespace fs = std::filesystem;

// slot_holder, started and described by its first line.
struct Holder {
  std::unique_ptr<Spawned> proc;
  pid_t pid = 0;
  std::vector<pid_t> tids;               // main thread first
  std::map<std::string, uint64_t> addr;  // "a".."d"
};

Holder StartHolder() {
  Holder h;
  auto p = Spawned::Start({TargetPath("slot_holder")});
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) {
    return h;
  }
  h.proc = *std::move(p);
  EXPECT_TRUE(h.proc->WaitForStdout("d=0x").ok()) << h.proc->out();
  const std::string line = h.proc->out().substr(0, h.proc->out().find('\n'));
  for (absl::string_view field : absl::StrSplit(line, ' ')) {
    const std::vector<std::string> kv = absl::StrSplit(field, '=');
    if (kv.size() != 2) {
      continue;
    }
    if (kv[0] == "pid") {
      EXPECT_TRUE(absl::SimpleAtoi(kv[1], &h.pid));
    } else if (kv[0] == "tids") {
      for (absl::string_view t : absl::StrSplit(kv[1], ',')) {
        pid_t tid = 0;
        EXPECT_TRUE(absl::SimpleAtoi(t, &tid));
        h.tids.push_back(tid);
      }
    } else {
      uint64_t a = 0;
      EXPECT_TRUE(absl::SimpleHexAtoi(kv[1], &a)) << kv[1];
      h.addr[kv[0]] = a;
    }
  }
  EXPECT_EQ(h.tids.size(), 3U) << line;
  return h;
}

// A private, empty run directory in KWATCH_RUN_DIR (the kwatch binary inherits it).
class SlotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = absl::StrCat(::testing::TempDir(), "/kwatch-slots-XXXXXX");
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ::setenv("KWATCH_RUN_DIR", dir_.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): one thread
  }
  void TearDown() override {
    drmgr::UnpublishSlots();
    ::unsetenv("KWATCH_RUN_DIR");  // NOLINT(concurrency-mt-unsafe): one thread
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

// `kwatch slots -p PID --json`, parsed. A CPU-wide breakpoint of a test running in parallel
// (kernel watches) takes a slot of every thread for a moment: while some thread shows more
// slots held outside kwatch than `max_external` allows, wait and ask again.
json SlotsJson(pid_t pid, const std::map<pid_t, int>& max_external) {
  json j;
  for (int attempt = 0; attempt < 50; ++attempt) {
    const RunResult r = RunKwatch({"slots", "-p", absl::StrCat(pid), "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    j = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    if (j.is_discarded() || j["processes"].size() != 1) {
      return j;
    }
    bool busy = false;
    for (const json& t : j["processes"][0]["threads"]) {
      auto it = max_external.find(t["tid"].get<pid_t>());
      busy |= t["external"].get<int>() > (it == max_external.end() ? 0 : it->second);
    }
    if (!busy) {
      return j;
    }
    ::usleep(100 * 1000);
  }
  return j;
}

TEST_F(SlotsTest, CountsPerfBreakpointsHeldOutsideKwatchPerThread) {
  Holder h = StartHolder();
  ASSERT_EQ(h.tids.size(), 3U);
  const std::vector<uint64_t> addrs = {h.addr["a"], h.addr["b"], h.addr["c"], h.addr["d"]};
  for (int n = 1; n <= 4; ++n) {
    const pid_t busy = h.tids[1];  // the first worker
    std::vector<core::UniqueFd> held;
    held.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      held.push_back(HoldBreakpointSlot(busy, addrs[static_cast<size_t>(i)]));
    }
    const json j = SlotsJson(h.pid, {{busy, n}});
    ASSERT_EQ(j["processes"].size(), 1U) << j.dump();
    const json& p = j["processes"][0];
    EXPECT_EQ(p["pid"], h.pid);
    EXPECT_EQ(p["comm"], "slot_holder");
    EXPECT_EQ(p["sessions"].size(), 0U);
    ASSERT_EQ(p["threads"].size(), 3U) << p.dump();
    for (const json& t : p["threads"]) {
      const bool is_busy = t["tid"] == busy;
      EXPECT_EQ(t["external"], is_busy ? n : 0) << "n=" << n << " " << t.dump();
      EXPECT_EQ(t["free"], is_busy ? 4 - n : 4) << "n=" << n << " " << t.dump();
      EXPECT_EQ(t["kwatch"], 0);
      ASSERT_EQ(t["slots"].size(), 4U);
      // Held outside kwatch from DR3 down, free from DR0 up.
      for (int dr = 0; dr < 4; ++dr) {
        const json& s = t["slots"][static_cast<size_t>(dr)];
        EXPECT_EQ(s["slot"], dr);
        EXPECT_EQ(s["state"], (is_busy && dr >= 4 - n) ? "external" : "free") << s.dump();
      }
    }
  }
  // All closed: nothing held anywhere, and the probe itself left nothing behind.
  const json j = SlotsJson(h.pid, {});
  for (const json& t : j["processes"][0]["threads"]) {
    EXPECT_EQ(t["free"], 4) << t.dump();
  }
}

TEST_F(SlotsTest, TextTableOfAThreadWithTwoSlotsHeldOutside) {
  Holder h = StartHolder();
  ASSERT_EQ(h.tids.size(), 3U);
  std::vector<core::UniqueFd> held;
  held.push_back(HoldBreakpointSlot(h.tids[2], h.addr["c"]));
  held.push_back(HoldBreakpointSlot(h.tids[2], h.addr["d"]));
  (void)SlotsJson(h.pid, {{h.tids[2], 2}});  // wait for parallel tests' slots to go
  const RunResult r = RunKwatch({"slots", "-p", absl::StrCat(h.pid)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::string free_table =
      "  SLOT  HOLDER  RANGE  KIND   STATE\n"
      "  DR0   -       -      -      free\n"
      "  DR1   -       -      -      free\n"
      "  DR2   -       -      -      free\n"
      "  DR3   -       -      -      free\n";
  EXPECT_EQ(r.out,
            absl::StrCat(
                "process ", h.pid, " (slot_holder): 3 threads\n",
                "  no kwatch session watches it\n",  //
                "\nthread ", h.tids[0], " (slot_holder): 0 kwatch, 0 held outside kwatch, 4 free\n",
                free_table,  //
                "\nthread ", h.tids[1], " (slot_holder): 0 kwatch, 0 held outside kwatch, 4 free\n",
                free_table,  //
                "\nthread ", h.tids[2], " (slot_holder): 0 kwatch, 2 held outside kwatch, 2 free\n",
                "  SLOT  HOLDER  RANGE  KIND   STATE\n"
                "  DR0   -       -      -      free\n"
                "  DR1   -       -      -      free\n"
                "  DR2   -       -      -      held outside kwatch\n"
                "  DR3   -       -      -      held outside kwatch\n"));
}

TEST_F(SlotsTest, BadInput) {
  // A pid that cannot exist (above pid_max).
  RunResult r = RunKwatch({"slots", "-p", "2147483600"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kwatch: error: process 2147483600 does not exist (or has exited)\n");
  EXPECT_EQ(r.out, "");
  // A thread id is not a process.
  Holder h = StartHolder();
  ASSERT_EQ(h.tids.size(), 3U);
  r = RunKwatch({"slots", "-p", absl::StrCat(h.tids[1])});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, absl::StrCat("kwatch: error: ", h.tids[1], " is a thread of process ", h.pid,
                                ": give -p ", h.pid, "\n"));
  // Usage errors exit 2.
  r = RunKwatch({"slots", "-p", "abc"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunKwatch({"slots", "--bogus"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunKwatch({"slots", "-p", "0"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunKwatch({"slots", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("kwatch slots"));
}

TEST_F(SlotsTest, NoSessionsWithoutPid) {
  const RunResult r = RunKwatch({"slots"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, absl::StrCat("no running kwatch session watches a process (sessions publish "
                                "their slots in ",
                                dir_, ")\n"));
  const RunResult j = RunKwatch({"slots", "--json"});
  EXPECT_EQ(j.exit_code, 0) << j.err;
  EXPECT_EQ(json::parse(j.out), json({{"registry", dir_},
                                      {"processes", json::array()},
                                      {"kernel_sessions", json::array()},
                                      {"notes", json::array()}}));
}

// A real gdb attached in non-stop mode with two hardware watchpoints, the inferior running in
// the background; `kwatch slots` runs from gdb's shell while they are inserted.
TEST_F(SlotsTest, GdbHardwareWatchpointsShowAsHeldOutsideKwatch) {
  KW_REQUIRE_FEATURE(::access("/usr/bin/gdb", X_OK) == 0, "gdb is not installed at /usr/bin/gdb");
  Holder h = StartHolder();
  ASSERT_EQ(h.tids.size(), 3U);
  // Several samples, in case a parallel test's CPU-wide breakpoint takes a slot for a moment.
  constexpr int kSamples = 10;
  const std::string loop = absl::StrFormat(
      "shell for i in $(seq 1 %d); do %s slots -p %d --json > %s/out.$i; sleep 0.1; done", kSamples,
      ::kwatch::testing::KwatchPath(), h.pid, dir_);
  const auto gdb = ::kwatch::testing::Run({"/usr/bin/gdb",
                                           "-nx",
                                           "-batch",
                                           "-ex",
                                           "set non-stop on",
                                           "-ex",
                                           "set can-use-hw-watchpoints 1",
                                           "-ex",
                                           absl::StrCat("attach ", h.pid),
                                           "-ex",
                                           "watch -l g_a",
                                           "-ex",
                                           "watch -l g_b",
                                           "-ex",
                                           "continue -a &",
                                           "-ex",
                                           loop,
                                           "-ex",
                                           "interrupt -a",
                                           "-ex",
                                           "detach"},
                                          120);
  ASSERT_TRUE(gdb.ok()) << gdb.status();
  ASSERT_THAT(gdb->out, HasSubstr("Hardware watchpoint 1: -location g_a")) << gdb->err;
  ASSERT_THAT(gdb->out, HasSubstr("Hardware watchpoint 2: -location g_b")) << gdb->err;
  json best;
  int best_total = 1 << 20;
  for (int i = 1; i <= kSamples; ++i) {
    std::ifstream in(absl::StrCat(dir_, "/out.", i));
    const json j = json::parse(in, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "sample " << i;
    ASSERT_EQ(j["processes"].size(), 1U) << j.dump();
    int total = 0;
    for (const json& t : j["processes"][0]["threads"]) {
      total += t["external"].get<int>();
    }
    if (total < best_total) {
      best_total = total;
      best = j;
    }
  }
  const json& threads = best["processes"][0]["threads"];
  ASSERT_EQ(threads.size(), 3U);
  // gdb (13.1) writes the debug registers of the thread it stopped in at attach (the main
  // thread) when it resumes it.
  EXPECT_EQ(threads[0]["tid"], h.pid);
  EXPECT_EQ(threads[0]["external"], 2) << threads[0].dump();
  EXPECT_EQ(threads[0]["free"], 2) << threads[0].dump();
  EXPECT_EQ(threads[0]["slots"][2]["state"], "external");
  EXPECT_EQ(threads[0]["slots"][3]["state"], "external");
}

// The allocator's reason for the request labelled `label`.
std::string Reason(const drmgr::AllocatorSnapshot& snap, const std::string& label) {
  for (const drmgr::RequestView& v : snap.requests) {
    if (v.request.label == label) {
      return v.reason;
    }
  }
  ADD_FAILURE() << "no request " << label;
  return {};
}

// `text` with each run of two or more blanks turned into " | " (one at a line start into
// "| "), and the seconds of "published N.N s ago" dropped.
std::string Cells(const std::string& text) {
  std::string out =
      std::regex_replace(text, std::regex("published [0-9]+\\.[0-9] s ago"), "published 0.| s ago");
  out = std::regex_replace(out, std::regex("(^|\n)  +"), "$1| ");
  return std::regex_replace(out, std::regex("  +"), " | ");
}

// Opens, for each slot a snapshot arms, one breakpoint on each thread of the slot's scope, as
// the perf applier would: the kernel then agrees with the published decisions.
std::vector<core::UniqueFd> ApplyInKernel(const drmgr::AllocatorSnapshot& snap,
                                          const std::vector<pid_t>& tids) {
  std::vector<core::UniqueFd> fds;
  for (const drmgr::ScopeView& s : snap.scopes) {
    for (const drmgr::SlotView& v : s.slots) {
      if (v.holders.empty()) {
        continue;
      }
      for (const pid_t tid : tids) {
        if (s.scope.kind == drmgr::Scope::Kind::kProcess || s.scope.tid == tid) {
          fds.push_back(HoldBreakpointSlot(tid, v.chunk.addr.value & ~uint64_t{7}));
        }
      }
    }
  }
  return fds;
}

// A session's decisions, made by drmgr::SlotAllocator from requests on the live target and
// published through the registry: `kwatch slots` shows them row by row.
TEST_F(SlotsTest, ShowsPublishedSessionRowByRow) {
  Holder h = StartHolder();
  ASSERT_EQ(h.tids.size(), 3U);
  const pid_t t0 = h.tids[0];
  const pid_t t1 = h.tids[1];
  const pid_t t2 = h.tids[2];
  const uint64_t a = h.addr["a"];
  const uint64_t b = h.addr["b"];
  const uint64_t c = h.addr["c"];
  const uint64_t d = h.addr["d"];

  drmgr::SlotAllocator alloc;
  const drmgr::ClientId w = alloc.AddClient(drmgr::ClientKind::kWatchpoint, "kwatch");
  const drmgr::ClientId g = alloc.AddClient(drmgr::ClientKind::kDebugger, "debugger");
  const auto ask = [&](drmgr::ClientId client, uint64_t addr, uint64_t len, drmgr::DrKind kind,
                       drmgr::Scope scope, drmgr::ShortagePolicy policy, const char* label) {
    drmgr::SlotRequest r;
    r.addr = core::RemoteAddr{addr};
    r.len = len;
    r.kind = kind;
    r.scope = scope;
    r.priority = drmgr::DefaultPriority(client == g ? drmgr::ClientKind::kDebugger
                                                    : drmgr::ClientKind::kWatchpoint);
    r.policy = policy;
    r.label = label;
    auto grant = alloc.Request(client, r);
    EXPECT_TRUE(grant.ok()) << grant.status();
  };
  const absl::Time start = absl::FromUnixSeconds(1000);
  alloc.AdvanceClock(start);
  using drmgr::DrKind;
  using drmgr::Scope;
  using drmgr::ShortagePolicy;
  // Every thread: g_a. Main thread: g_b read-write.
  ask(w, a, 8, DrKind::kWrite, Scope::Process(h.pid), ShortagePolicy::kFail, "g_a");
  ask(w, b, 8, DrKind::kReadWrite, Scope::Thread(h.pid, t0), ShortagePolicy::kFail, "g_b");
  // First worker: four multiplexed watches for its three free slots.
  ask(w, c, 8, DrKind::kWrite, Scope::Thread(h.pid, t1), ShortagePolicy::kMultiplex, "g_c");
  ask(w, d, 8, DrKind::kWrite, Scope::Thread(h.pid, t1), ShortagePolicy::kMultiplex, "g_d");
  ask(w, b, 8, DrKind::kWrite, Scope::Thread(h.pid, t1), ShortagePolicy::kMultiplex, "g_b@1");
  ask(w, a + 16, 8, DrKind::kWrite, Scope::Thread(h.pid, t1), ShortagePolicy::kMultiplex, "g_a+16");
  // Second worker: three watchpoints fill it, then a debugger takes one of their slots; a
  // 40-byte range falls back to pages, another one fails.
  ask(w, c, 8, DrKind::kWrite, Scope::Thread(h.pid, t2), ShortagePolicy::kPreemptLower, "g_c@2");
  ask(w, d, 8, DrKind::kWrite, Scope::Thread(h.pid, t2), ShortagePolicy::kPreemptLower, "g_d@2");
  ask(w, b, 8, DrKind::kWrite, Scope::Thread(h.pid, t2), ShortagePolicy::kPreemptLower, "g_b@2");
  ask(g, a + 8, 1, DrKind::kExec, Scope::Thread(h.pid, t2), ShortagePolicy::kPreemptLower,
      "gdb break");
  ask(w, d, 40, DrKind::kWrite, Scope::Thread(h.pid, t2), ShortagePolicy::kFallbackPages, "big");
  ask(w, d, 40, DrKind::kWrite, Scope::Thread(h.pid, t2), ShortagePolicy::kFail, "big2");
  for (int i = 1; i <= 3; ++i) {
    alloc.Rotate(start + absl::Milliseconds(10 * i));
  }
  const drmgr::AllocatorSnapshot snap = alloc.Snapshot();
  std::vector<core::UniqueFd> fds = ApplyInKernel(snap, h.tids);
  ASSERT_TRUE(drmgr::PublishSlots(h.pid, snap, "kwatch --test").ok());

  std::map<pid_t, int> none = {};
  (void)SlotsJson(h.pid, none);  // wait for parallel tests' slots to go
  const RunResult r = RunKwatch({"slots", "-p", absl::StrCat(h.pid)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // Cells: runs of two or more blanks separate them; a table's columns line up.
  EXPECT_EQ(Cells(r.out), absl::StrFormat(R"(process %1$d (slot_holder): 3 threads
| kwatch %2$d: kwatch --test (published 0.| s ago)

thread %1$d (slot_holder): 2 kwatch, 0 held outside kwatch, 2 free
| SLOT | HOLDER | RANGE | KIND | STATE
| DR0 | g_a (kwatch %2$d) | 8 bytes at 0x%3$x | write | armed
| DR1 | g_b (kwatch %2$d) | 8 bytes at 0x%4$x | rw | armed
| DR2 | - | - | - | free
| DR3 | - | - | - | free

thread %5$d (slot_holder): 4 kwatch, 0 held outside kwatch, 0 free
| SLOT | HOLDER | RANGE | KIND | STATE
| DR0 | g_a (kwatch %2$d) | 8 bytes at 0x%3$x | write | armed
| DR1 | g_c (kwatch %2$d) | 8 bytes at 0x%7$x | write | multiplexed 67%%
| DR2 | g_d (kwatch %2$d) | 8 bytes at 0x%8$x | write | multiplexed 67%%
| DR3 | g_a+16 (kwatch %2$d) | 8 bytes at 0x%9$x | write | multiplexed 67%%

thread %6$d (slot_holder): 4 kwatch, 0 held outside kwatch, 0 free
| SLOT | HOLDER | RANGE | KIND | STATE
| DR0 | g_a (kwatch %2$d) | 8 bytes at 0x%3$x | write | armed
| DR1 | g_d@2 (kwatch %2$d) | 8 bytes at 0x%8$x | write | armed
| DR2 | gdb break (kwatch %2$d) | 1 byte at 0x%10$x | exec | preempted (waiting: g_b@2, big)
| DR3 | g_c@2 (kwatch %2$d) | 8 bytes at 0x%7$x | write | armed

not in hardware:
| g_b@1 (kwatch %2$d): 8 bytes at 0x%4$x write, multiplexed 100%%: %11$s
| g_b@2 (kwatch %2$d): 8 bytes at 0x%4$x write, preempted: %12$s
| big (kwatch %2$d): 40 bytes at 0x%8$x write, page-protected: %13$s
| big2 (kwatch %2$d): 40 bytes at 0x%8$x write, failed: %14$s
)",
                                          h.pid, ::getpid(), a, b, t1, t2, c, d, a + 16, a + 8,
                                          Reason(snap, "g_b@1"), Reason(snap, "g_b@2"),
                                          Reason(snap, "big"), Reason(snap, "big2")))
      << r.out;
  // The waiting multiplexed request was armed the whole time until the last rotation; the
  // three in hardware were armed 20 of 30 ms each (rotations at 10, 20 and 30 ms).
  for (const drmgr::RequestView& v : snap.requests) {
    if (v.request.label == "g_b@1") {
      EXPECT_FALSE(v.armed);
      EXPECT_EQ(v.time_armed, absl::Milliseconds(30));
    }
    if (v.request.label == "g_c" || v.request.label == "g_d" || v.request.label == "g_a+16") {
      EXPECT_TRUE(v.armed);
      EXPECT_EQ(v.time_armed, absl::Milliseconds(20)) << v.request.label;
      EXPECT_EQ(v.time_enabled, absl::Milliseconds(30)) << v.request.label;
    }
  }
  // Columns line up: in each table, a column starts where its header does.
  size_t range_col = std::string::npos;
  for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
    if (absl::StartsWith(line, "  SLOT")) {
      range_col = line.find("RANGE");
    } else if (absl::StartsWith(line, "  DR") && range_col != std::string::npos) {
      EXPECT_EQ(line.substr(range_col - 2, 2), "  ") << line;
      EXPECT_NE(line[range_col], ' ') << line;
    }
  }
}

}  // namespace
}  // namespace kwatch::cli
