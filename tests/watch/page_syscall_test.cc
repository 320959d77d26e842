// Page-protection watches and the kernel: system calls that use memory on a protected page
// (futex on a mutex next to watched data, read() into a watched buffer...) must work as
// without kwatch, and what the kernel did to watched bytes is reported exactly where known.
#include <errno.h>
#include <sys/syscall.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/test_util.h"
#include "watch/page_backend.h"
#include "watch/page_syscalls.h"
#include "watch/session.h"

namespace kwatch::watch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr uint64_t kPrivate = 128;  // FUTEX_PRIVATE_FLAG

// ---- The model (no process) ----

bool NoMemory(uint64_t /*addr*/, std::span<uint8_t> /*out*/) {
  return false;
}

TEST(PageSyscallModel, ReadWriteAndFriendsHaveABounceBuffer) {
  const SyscallModel r = ModelSyscall(SYS_read, {3, 0x5000, 100, 0, 0, 0}, NoMemory);
  EXPECT_TRUE(r.known);
  ASSERT_EQ(r.ranges.size(), 1u);
  EXPECT_EQ(r.ranges[0].addr, 0x5000u);
  EXPECT_EQ(r.ranges[0].size, 100u);
  EXPECT_EQ(r.ranges[0].use, KernelUse::kWrite);
  ASSERT_TRUE(r.bounce.has_value());
  EXPECT_EQ(r.bounce->arg, 1);
  EXPECT_FALSE(r.bounce->in);
  EXPECT_TRUE(r.bounce->out);

  const SyscallModel w = ModelSyscall(SYS_write, {1, 0x6000, 8, 0, 0, 0}, NoMemory);
  ASSERT_TRUE(w.bounce.has_value());
  EXPECT_TRUE(w.bounce->in);
  EXPECT_FALSE(w.bounce->out);
  EXPECT_EQ(w.ranges[0].use, KernelUse::kRead);

  const SyscallModel e = ModelSyscall(SYS_epoll_wait, {5, 0x7000, 4, 100, 0, 0}, NoMemory);
  ASSERT_TRUE(e.bounce.has_value());
  EXPECT_EQ(e.bounce->size, 48u);
  EXPECT_EQ(BounceOutBytes(*e.bounce, 3), 36u);  // 3 events of 12 bytes
  EXPECT_EQ(BounceOutBytes(*e.bounce, -EINTR), 0u);

  // A null or empty buffer: nothing to bounce, nothing touched.
  EXPECT_FALSE(ModelSyscall(SYS_read, {3, 0, 100, 0, 0, 0}, NoMemory).bounce.has_value());
  EXPECT_FALSE(ModelSyscall(SYS_read, {3, 0x5000, 0, 0, 0, 0}, NoMemory).bounce.has_value());
}

TEST(PageSyscallModel, FutexWordsByOperation) {
  // FUTEX_WAIT_PRIVATE reads the word (and the timeout) before it sleeps.
  SyscallModel m = ModelSyscall(SYS_futex, {0x8000, 0 | kPrivate, 2, 0x9000, 0, 0}, NoMemory);
  EXPECT_TRUE(m.known);
  EXPECT_TRUE(m.start_only);
  ASSERT_EQ(m.ranges.size(), 2u);
  EXPECT_EQ(m.ranges[0].addr, 0x8000u);
  EXPECT_EQ(m.ranges[0].size, 4u);
  EXPECT_EQ(m.ranges[0].use, KernelUse::kRead);
  EXPECT_EQ(m.ranges[1].addr, 0x9000u);
  EXPECT_EQ(m.ranges[1].size, 16u);
  // FUTEX_WAKE_PRIVATE touches no memory at all; a shared wake needs the page.
  EXPECT_TRUE(ModelSyscall(SYS_futex, {0x8000, 1 | kPrivate, 1, 0, 0, 0}, NoMemory).ranges.empty());
  m = ModelSyscall(SYS_futex, {0x8000, 1, 1, 0, 0, 0}, NoMemory);
  ASSERT_EQ(m.ranges.size(), 1u);
  EXPECT_EQ(m.ranges[0].use, KernelUse::kPage);
  // FUTEX_WAKE_OP changes the second word; FUTEX_LOCK_PI may write after it slept.
  m = ModelSyscall(SYS_futex, {0x8000, 5 | kPrivate, 1, 1, 0x8010, 0}, NoMemory);
  ASSERT_EQ(m.ranges.size(), 1u);
  EXPECT_EQ(m.ranges[0].addr, 0x8010u);
  EXPECT_EQ(m.ranges[0].use, KernelUse::kReadWrite);
  m = ModelSyscall(SYS_futex, {0x8000, 6 | kPrivate, 0, 0, 0, 0}, NoMemory);
  EXPECT_FALSE(m.start_only);
  EXPECT_EQ(m.ranges[0].use, KernelUse::kReadWrite);

  // The word is read unless the call was refused.
  const SyscallModel wait = ModelSyscall(SYS_futex, {0x8000, 0 | kPrivate, 2, 0, 0, 0}, NoMemory);
  EXPECT_EQ(TouchedRanges(SYS_futex, wait, 0).size(), 1u);
  EXPECT_EQ(TouchedRanges(SYS_futex, wait, -EAGAIN).size(), 1u);
  EXPECT_EQ(TouchedRanges(SYS_futex, wait, -EFAULT).size(), 0u);
}

TEST(PageSyscallModel, IovecsAreReadThroughTheCallbackAndFilledInOrder) {
  // Two iovecs at 0x1000: {0x5000, 10}, {0x6000, 10}.
  const auto memory = [](uint64_t addr, std::span<uint8_t> out) {
    if (addr != 0x1000 || out.size() != 32) {
      return false;
    }
    const uint64_t iov[4] = {0x5000, 10, 0x6000, 10};
    std::memcpy(out.data(), iov, sizeof(iov));
    return true;
  };
  const SyscallModel m = ModelSyscall(SYS_readv, {3, 0x1000, 2, 0, 0, 0}, memory);
  EXPECT_TRUE(m.known);
  ASSERT_EQ(m.ranges.size(), 3u);
  EXPECT_EQ(m.ranges[0].use, KernelUse::kRead);  // the array itself
  EXPECT_EQ(m.ranges[0].size, 32u);
  EXPECT_EQ(m.data_first, 1);
  // 15 bytes read: the first buffer whole, 5 bytes of the second.
  const std::vector<KernelRange> t = TouchedRanges(SYS_readv, m, 15);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[1].addr, 0x5000u);
  EXPECT_EQ(t[1].size, 10u);
  EXPECT_EQ(t[1].use, KernelUse::kWrite);
  EXPECT_EQ(t[2].addr, 0x6000u);
  EXPECT_EQ(t[2].size, 5u);
  // An unreadable array: the call is not modelled any more.
  EXPECT_FALSE(ModelSyscall(SYS_readv, {3, 0x2000, 2, 0, 0, 0}, memory).known);
}

TEST(PageSyscallModel, UnknownCallsAndNames) {
  // A call not modelled: each argument may point somewhere (a small next argument is taken
  // as its length); nothing is claimed touched.
  const SyscallModel m = ModelSyscall(SYS_getdents64, {3, 0x5000, 4096, 0, 0, 0}, NoMemory);
  EXPECT_FALSE(m.known);
  bool found = false;
  for (const KernelRange& r : m.ranges) {
    if (r.addr == 0x5000) {
      found = true;
      EXPECT_EQ(r.size, 4096u);
      EXPECT_EQ(r.use, KernelUse::kUnknown);
    }
  }
  EXPECT_TRUE(found);
  EXPECT_TRUE(TouchedRanges(SYS_getdents64, m, 100).empty());
  EXPECT_TRUE(ModelSyscall(SYS_clone, {0, 0, 0, 0, 0, 0}, NoMemory).lifecycle);

  EXPECT_EQ(SyscallName(SYS_read), "read");
  EXPECT_EQ(SyscallName(SYS_futex), "futex");
  EXPECT_EQ(SyscallName(SYS_futex_waitv), "futex_waitv");
  EXPECT_EQ(SyscallName(9999), "syscall_9999");
  EXPECT_TRUE(IsRestartResult(-512));  // -ERESTARTSYS
  EXPECT_TRUE(IsRestartResult(-516));  // -ERESTART_RESTARTBLOCK
  EXPECT_FALSE(IsRestartResult(-EINTR));
  EXPECT_FALSE(IsRestartResult(0));
}

TEST(PageSyscallModel, SummaryLinesAndJson) {
  KernelAccessStats k;
  EXPECT_TRUE(k.empty());
  EXPECT_TRUE(KernelAccessLines(k).empty());
  k.syscall_stops = 42;
  k.syscalls["futex"] = {
      .calls = 3, .bounced = 0, .opened = 3, .retried = 0, .events = 0, .unknown = 0};
  k.syscalls["read"] = {
      .calls = 2, .bounced = 2, .opened = 0, .retried = 0, .events = 2, .unknown = 0};
  k.unprotected[{0x5000, "readv"}] = {.times = 2, .ns = 1500000};
  EXPECT_THAT(KernelAccessLines(k),
              ::testing::ElementsAre(
                  "kernel: futex: 3 calls on watched pages (3 with the page opened, other "
                  "threads stopped)",
                  "kernel: read: 2 calls on watched pages (2 through a scratch buffer); 2 exact "
                  "accesses to watched bytes reported",
                  "kernel: page 0x5000 unprotected for 1.500 ms during readv() (2 times); "
                  "accesses by other threads then were not seen"));
  const json j = json::parse(KernelAccessJson(k));
  EXPECT_EQ(j["syscall_stops"], 42);
  ASSERT_EQ(j["syscalls"].size(), 2u);
  EXPECT_EQ(j["syscalls"][1]["name"], "read");
  EXPECT_EQ(j["syscalls"][1]["bounced"], 2);
  ASSERT_EQ(j["unprotected"].size(), 1u);
  EXPECT_EQ(j["unprotected"][0]["page"], "0x5000");
  EXPECT_EQ(j["unprotected"][0]["syscall"], "readv");
  EXPECT_DOUBLE_EQ(j["unprotected"][0]["ms"].get<double>(), 1.5);
}

// ---- A live target under a PageBackend ----

// Launches page_syscalls with `args`, resolves `exprs` (read-write) and arms a PageBackend of
// its own on them.
struct Live {
  std::unique_ptr<core::ptrace::Process> proc;
  std::unique_ptr<WatchSession> session;  // resolves the expressions; never armed
  std::unique_ptr<PageBackend> backend;   // destroyed first (declared last)
  std::vector<core::AccessEvent> events;

  static std::unique_ptr<Live> Start(const std::vector<std::string>& args,
                                     const std::vector<std::string>& exprs) {
    auto live = std::make_unique<Live>();
    std::vector<std::string> argv = {TargetPath("page_syscalls")};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = core::ptrace::Process::Launch(argv);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) {
      return nullptr;
    }
    live->proc = *std::move(p);
    EXPECT_TRUE(live->proc->RunToEntry().ok());
    std::vector<WatchRequest> reqs;
    for (const auto& e : exprs) {
      WatchRequest r;
      r.expr = e;
      r.kind = drmgr::DrKind::kReadWrite;
      reqs.push_back(r);
    }
    SessionOptions opts;
    opts.backend = BackendKind::kPage;
    auto s = WatchSession::Create(*live->proc, reqs, opts);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) {
      return nullptr;
    }
    live->session = *std::move(s);
    live->backend = std::make_unique<PageBackend>(*live->proc, live->session->watches());
    const absl::Status armed = live->backend->Arm();
    EXPECT_TRUE(armed.ok()) << armed;
    return armed.ok() ? std::move(live) : nullptr;
  }

  // Runs the target to its end; its exit status.
  int Finish() {
    while (proc->alive()) {
      auto ev = proc->Poll(true);
      EXPECT_TRUE(ev.ok()) << ev.status();
      if (!ev.ok()) {
        (void)proc->Kill();
        return -1;
      }
      backend->Collect(events);
    }
    backend->Collect(events);
    for (const std::string& line : KernelAccessLines(backend->kernel_stats())) {
      std::printf("  %s\n", line.c_str());  // what the summary would say
    }
    return proc->exit_info()->ShellStatus();
  }

  uint32_t WatchId(const std::string& display) const {
    for (const Watch& w : session->watches()) {
      if (w.target.display == display) {
        return w.id;
      }
    }
    ADD_FAILURE() << "no watch " << display;
    return 0;
  }
};

struct Counts {
  uint64_t reads = 0;
  uint64_t writes = 0;
};

TEST(PageSyscalls, ReadIntoAWatchedPageGetsItsDataAndExactEvents) {
  constexpr int kN = 100;
  auto live =
      Live::Start({"pipe", std::to_string(kN)}, {"g_page.value", "g_page.sent", "g_page.received"});
  ASSERT_NE(live, nullptr);
  ASSERT_EQ(live->Finish(), 0);
  const KernelAccessStats& k = live->backend->kernel_stats();
  // Every read() and write() that used the page ran on a scratch copy of its buffer.
  ASSERT_TRUE(k.syscalls.count("read"));
  ASSERT_TRUE(k.syscalls.count("write"));
  EXPECT_GE(k.syscalls.at("read").calls, 2u * kN);
  EXPECT_EQ(k.syscalls.at("read").bounced, k.syscalls.at("read").calls);
  EXPECT_EQ(k.syscalls.at("read").opened, 0u);
  EXPECT_EQ(k.syscalls.at("read").events, uint64_t{kN});  // the 8 bytes of g_page.value
  EXPECT_EQ(k.syscalls.at("write").calls, uint64_t{kN});  // main's write from g_page.value
  EXPECT_EQ(k.syscalls.at("write").bounced, uint64_t{kN});
  EXPECT_EQ(k.syscalls.at("write").events, uint64_t{kN});
  EXPECT_TRUE(k.unprotected.empty());
  // The kernel wrote 0, 1, ... N-1 into g_page.value, and read each back for write().
  const uint32_t value = live->WatchId("g_page.value");
  int64_t next = 0;
  uint64_t kernel_reads = 0;
  uint64_t user_reads = 0;
  for (const auto& ev : live->events) {
    if (ev.watch_id != value) {
      continue;
    }
    const bool in_syscall = ev.trap_ip.value == ev.ip.value + 2;
    if (ev.kind == core::AccessKind::kWrite) {
      ASSERT_TRUE(in_syscall);  // the program never stores to it
      EXPECT_EQ(ev.access_size, 8u);
      ASSERT_TRUE(ev.value.has_value());
      EXPECT_EQ(static_cast<int64_t>(*ev.value), next);
      EXPECT_EQ(static_cast<int64_t>(*ev.old_value), next == 0 ? 0 : next - 1);
      ++next;
    } else {
      (in_syscall ? kernel_reads : user_reads)++;
    }
  }
  EXPECT_EQ(next, kN);
  EXPECT_EQ(kernel_reads, uint64_t{kN});
  EXPECT_EQ(user_reads, uint64_t{kN} + 1);  // the check of each value, and the final printf
  // The writer thread's own stores, made while the reader sat in read(): none unseen.
  Counts sent;
  Counts received;
  for (const auto& ev : live->events) {
    Counts* c = ev.watch_id == live->WatchId("g_page.sent")       ? &sent
                : ev.watch_id == live->WatchId("g_page.received") ? &received
                                                                  : nullptr;
    if (c != nullptr) {
      (ev.kind == core::AccessKind::kWrite ? c->writes : c->reads)++;
    }
  }
  EXPECT_EQ(sent.writes, uint64_t{kN});
  EXPECT_EQ(sent.reads, uint64_t{kN});
  EXPECT_EQ(received.writes, uint64_t{kN});
  EXPECT_EQ(received.reads, uint64_t{kN});
}

TEST(PageSyscalls, MutexOnTheWatchedPageCountsExactlyWithNothingLeftOpen) {
  constexpr int kThreads = 3;
  constexpr int kIters = 300;
  auto live =
      Live::Start({"mutex", std::to_string(kThreads), std::to_string(kIters)}, {"g_page.counter"});
  ASSERT_NE(live, nullptr);
  ASSERT_EQ(live->Finish(), 0);
  Counts c;
  for (const auto& ev : live->events) {
    (ev.kind == core::AccessKind::kWrite ? c.writes : c.reads)++;
  }
  EXPECT_EQ(c.writes, uint64_t{kThreads * kIters});
  EXPECT_EQ(c.reads, uint64_t{kThreads * kIters} + 1);  // + main's printf
  const KernelAccessStats& k = live->backend->kernel_stats();
  // The lock word shares the page: contended locks went to the kernel and worked. A futex
  // wait protects its page again as soon as it sleeps: nothing stayed open.
  if (k.syscalls.count("futex") != 0) {
    EXPECT_EQ(k.syscalls.at("futex").calls, k.syscalls.at("futex").opened);
    EXPECT_EQ(k.syscalls.at("futex").events, 0u);  // the lock word is not watched
  }
  EXPECT_TRUE(k.unprotected.empty()) << KernelAccessLines(k).back();
}

TEST(PageSyscalls, CallsWithStructuresAreOpenedOrRunAgain) {
  auto live = Live::Start({"misc"}, {"g_page.value"});
  ASSERT_NE(live, nullptr);
  ASSERT_EQ(live->Finish(), 0);
  const KernelAccessStats& k = live->backend->kernel_stats();
  // readv's iovecs are read by kwatch: the page is opened for it with the others stopped.
  ASSERT_TRUE(k.syscalls.count("readv"));
  EXPECT_EQ(k.syscalls.at("readv").opened, 1u);
  // recvmmsg's buffer is two structures deep: it fails with EFAULT and runs again.
  ASSERT_TRUE(k.syscalls.count("recvmmsg"));
  EXPECT_EQ(k.syscalls.at("recvmmsg").retried, 1u);
  EXPECT_TRUE(k.unprotected.empty());
  EXPECT_THAT(KernelAccessLines(k),
              ::testing::Contains(HasSubstr("recvmmsg: 1 call on watched pages (1 run again "
                                            "after EFAULT)")));
}

TEST(PageSyscalls, ABlockingCallLeftOpenIsReportedAsUnprotected) {
  // readv() cannot be bounced and blocks on the pipe: its page stays open while it sleeps,
  // and the writer thread's stores meanwhile are not seen. The summary says so.
  constexpr int kN = 50;
  auto live = Live::Start({"readvpipe", std::to_string(kN)}, {"g_page.sent"});
  ASSERT_NE(live, nullptr);
  ASSERT_EQ(live->Finish(), 0);
  const KernelAccessStats& k = live->backend->kernel_stats();
  ASSERT_TRUE(k.syscalls.count("readv"));
  EXPECT_EQ(k.syscalls.at("readv").calls, uint64_t{kN});
  EXPECT_EQ(k.syscalls.at("readv").opened, uint64_t{kN});
  uint64_t times = 0;
  for (const auto& [key, u] : k.unprotected) {
    EXPECT_EQ(key.second, "readv");
    EXPECT_GT(u.ns, 0u);
    times += u.times;
  }
  EXPECT_GT(times, 0u);
  EXPECT_LE(times, uint64_t{kN});
  uint64_t sent_writes = 0;
  for (const auto& ev : live->events) {
    sent_writes += ev.kind == core::AccessKind::kWrite ? 1 : 0;
  }
  EXPECT_LE(sent_writes, uint64_t{kN});
  EXPECT_THAT(KernelAccessLines(k),
              ::testing::Contains(
                  ::testing::AllOf(HasSubstr("unprotected for"), HasSubstr("during readv()"),
                                   HasSubstr("accesses by other threads then were not seen"))));
}

// ---- End to end, with the kwatch command ----

// The summary object of a --json run (the last line holding "watches").
json SummaryOf(const std::string& out) {
  json summary;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') {
      continue;
    }
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.contains("watches")) {
      summary = j;
    }
  }
  return summary;
}

std::map<std::string, std::pair<int, int>> FieldCounts(const json& watch) {
  std::map<std::string, std::pair<int, int>> out;
  for (const auto& f : watch["fields"]) {
    out[f["field"].get<std::string>()] = {f["reads"].get<int>(), f["writes"].get<int>()};
  }
  return out;
}

TEST(PageSyscalls, FalseSharingWithABarrierOnTheWatchedPage) {
  // The target's pthread_barrier_t lives on the page of g_shared: futex() on it used to fail
  // with EFAULT and glibc aborted the target.
  const auto r =
      ::kwatch::testing::Run({KwatchPath(), "--backend", "page", "--rw", "g_shared", "g_padded",
                              "--json", "--", TargetPath("false_sharing"), "2000"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->err;
  EXPECT_THAT(r->out, HasSubstr("done a=1999 b=1999\n"));
  int left = 0;
  int right = 0;
  for (absl::string_view line : absl::StrSplit(r->out, '\n')) {
    if (absl::ConsumePrefix(&line, "left ")) {
      left = std::stoi(std::string(line));
    } else if (absl::ConsumePrefix(&line, "right ")) {
      right = std::stoi(std::string(line));
    }
  }
  ASSERT_NE(left, 0);
  ASSERT_NE(right, 0);
  const json summary = SummaryOf(r->out);
  ASSERT_EQ(summary["watches"].size(), 2u) << r->out.substr(r->out.size() - 2000);
  const auto shared = FieldCounts(summary["watches"][0]);
  EXPECT_EQ(shared.at("g_shared.a"), std::make_pair(1, 2000));  // + main's final read
  EXPECT_EQ(shared.at("g_shared.b"), std::make_pair(1, 2000));
  EXPECT_EQ(shared.at("g_shared.flags"), std::make_pair(1000, 0));  // every 4th of 2 x 2000
  const auto padded = FieldCounts(summary["watches"][1]);
  EXPECT_EQ(padded.at("g_padded.a"), std::make_pair(0, 2000));
  EXPECT_EQ(padded.at("g_padded.b"), std::make_pair(0, 2000));
  EXPECT_EQ(padded.at("g_padded.flags"), std::make_pair(1000, 0));
  for (const auto& w : summary["watches"]) {
    for (const auto& t : w["threads"]) {
      const int tid = t["tid"].get<int>();
      if (tid == left || tid == right) {
        EXPECT_EQ(t["writes"], 2000) << w["display"] << " tid " << tid;
        EXPECT_EQ(t["reads"], 500) << w["display"] << " tid " << tid;
      }
    }
  }
}

TEST(PageSyscalls, PipeReaderUnderKwatchGetsItsData) {
  const auto r = ::kwatch::testing::Run({KwatchPath(), "--backend", "page", "--rw", "g_page.value",
                                         "g_page.sent", "--json", "--", TargetPath("page_syscalls"),
                                         "pipe", "200"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->err;
  EXPECT_THAT(r->out, HasSubstr("pipe 200 last=199 text='msg 199'\n"));
  const json summary = SummaryOf(r->out);
  ASSERT_EQ(summary["watches"].size(), 2u);
  // g_page.value: the kernel's 200 writes (read) and 200 reads (write), the program's 201
  // reads (its check of each value, and the final printf).
  EXPECT_EQ(FieldCounts(summary["watches"][0]).at("g_page.value"), std::make_pair(401, 200));
  EXPECT_EQ(FieldCounts(summary["watches"][1]).at("g_page.sent"), std::make_pair(200, 200));
}

TEST(PageSyscalls, ContendedMutexOnTheWatchedPageUnderKwatch) {
  const auto r =
      ::kwatch::testing::Run({KwatchPath(), "--backend", "page", "--rw", "g_page.counter", "--json",
                              "--", TargetPath("page_syscalls"), "mutex", "4", "250"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->err;
  EXPECT_THAT(r->out, HasSubstr("mutex counter=1000\n"));
  const json summary = SummaryOf(r->out);
  ASSERT_EQ(summary["watches"].size(), 1u);
  EXPECT_EQ(FieldCounts(summary["watches"][0]).at("g_page.counter"), std::make_pair(1001, 1000));
}

TEST(PageSyscalls, SignalsInterruptingABouncedReadUnderKwatch) {
  // A 1 ms timer interrupts read()s blocked on a slow writer: each interrupted call gets its
  // own buffer back before the handler runs and is bounced again when it restarts.
  const auto r = ::kwatch::testing::Run({KwatchPath(), "--backend", "page", "--rw", "g_page.value",
                                         "g_page.ticks", "--json", "--",
                                         TargetPath("page_syscalls"), "signals", "60"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->err;
  const size_t at = r->out.find("signals 60 last=59 ticks=");
  ASSERT_NE(at, std::string::npos) << r->out.substr(0, 2000);
  const int ticks = std::stoi(r->out.substr(at + std::strlen("signals 60 last=59 ticks=")));
  EXPECT_GT(ticks, 0);
  const json summary = SummaryOf(r->out);
  ASSERT_EQ(summary["watches"].size(), 2u);
  // g_page.value: 60 kernel writes (read), 61 reads by the program (its checks, the printf).
  EXPECT_EQ(FieldCounts(summary["watches"][0]).at("g_page.value"), std::make_pair(61, 60));
  // g_page.ticks: one load and one store per signal handled, and the final printf.
  EXPECT_EQ(FieldCounts(summary["watches"][1]).at("g_page.ticks"),
            std::make_pair(ticks + 1, ticks));
}

}  // namespace
}  // namespace kwatch::watch
