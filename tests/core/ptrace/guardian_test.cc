#include "core/ptrace/guardian.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "core/ptrace/process.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::core::ptrace {
namespace {

using ::kwatch::testing::TargetPath;

// A stopped fixture process and the address of one of its functions.
struct Fixture {
  std::unique_ptr<Process> proc;
  RemoteAddr tick;
  uint8_t original = 0;
};

Fixture LaunchFixture() {
  Fixture f;
  auto proc = Process::Launch({TargetPath("uprobe_loop"), "1000"});
  EXPECT_TRUE(proc.ok()) << proc.status();
  f.proc = std::move(*proc);
  EXPECT_TRUE(f.proc->RunToEntry().ok());
  auto syms = symbols::Symbols::ForProcess(f.proc->pid());
  EXPECT_TRUE(syms.ok());
  auto fn = (*syms)->FindFunction("tick");
  EXPECT_TRUE(fn.has_value());
  f.tick = fn->start;
  std::array<uint8_t, 1> b{};
  EXPECT_TRUE(f.proc->ReadMemory(f.tick, b).ok());
  f.original = b[0];
  return f;
}

uint8_t ByteAt(const Process& p, RemoteAddr a) {
  std::array<uint8_t, 1> b{};
  EXPECT_TRUE(p.ReadMemory(a, b).ok());
  return b[0];
}

TEST(Guardian, RestoresPatchesWhenItsOwnerIsKilled) {
  Fixture f = LaunchFixture();
  const pid_t target = f.proc->pid();
  // A child plays kwatch: starts the guardian, patches an INT3 into tick(), dies by SIGKILL.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t owner = fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    auto g = Guardian::Start(target);
    if (!g.ok()) {
      _exit(1);
    }
    const std::array<uint8_t, 1> orig{f.original};
    const std::array<uint8_t, 1> int3{0xcc};
    if (!(*g)->Record(f.tick, orig, int3).ok()) {
      _exit(2);
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/mem", target);
    FILE* mem = fopen(path, "r+");
    if (mem == nullptr || fseek(mem, static_cast<long>(f.tick.value), SEEK_SET) != 0 ||
        fwrite(int3.data(), 1, 1, mem) != 1 || fflush(mem) != 0) {
      _exit(3);
    }
    (void)!write(ready[1], "r", 1);
    pause();
    _exit(4);
  }
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  EXPECT_EQ(ByteAt(*f.proc, f.tick), 0xcc);
  kill(owner, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(owner, &status, 0), owner);
  // The guardian (now an orphan) restores the byte right after the owner's files close.
  uint8_t now = 0xcc;
  for (int i = 0; i < 500 && now == 0xcc; ++i) {
    usleep(2000);
    now = ByteAt(*f.proc, f.tick);
  }
  EXPECT_EQ(now, f.original);
  // And the target runs to its normal end.
  ASSERT_TRUE(f.proc->ResumeAll().ok());
  while (f.proc->alive()) {
    ASSERT_TRUE(f.proc->Poll(true).ok());
  }
  EXPECT_FALSE(f.proc->exit_info()->signaled);
  EXPECT_EQ(f.proc->exit_info()->code, 0);
}

TEST(Guardian, DismissedGuardianRestoresNothing) {
  Fixture f = LaunchFixture();
  auto g = Guardian::Start(f.proc->pid());
  ASSERT_TRUE(g.ok()) << g.status();
  const std::array<uint8_t, 1> orig{f.original};
  const std::array<uint8_t, 1> other{0x90};
  ASSERT_TRUE((*g)->Record(f.tick, orig, other).ok());
  ASSERT_TRUE(f.proc->WriteMemory(f.tick, other).ok());
  ASSERT_TRUE((*g)->Dismiss().ok());
  usleep(20000);
  EXPECT_EQ(ByteAt(*f.proc, f.tick), 0x90);  // dismissed: the journal is not replayed
  ASSERT_TRUE(f.proc->WriteMemory(f.tick, orig).ok());
  (void)f.proc->Kill();
}

TEST(Guardian, RestoreSkipsBytesThatChangedAndForgottenEntries) {
  Fixture f = LaunchFixture();
  std::array<PatchEntry, 2> entries{};
  // Entry 0 claims tick() holds 0xcc, but it holds the original: skipped.
  entries[0].len = 1;
  entries[0].addr = f.tick.value;
  entries[0].original[0] = 0x11;
  entries[0].patched[0] = 0xcc;
  entries[0].state.store(1);
  // Entry 1 matches but is free (forgotten): skipped.
  entries[1].len = 1;
  entries[1].addr = f.tick.value;
  entries[1].original[0] = 0x22;
  entries[1].patched[0] = f.original;
  EXPECT_EQ(RestorePatches(f.proc->pid(), entries), 0u);
  EXPECT_EQ(ByteAt(*f.proc, f.tick), f.original);
  entries[1].state.store(1);
  EXPECT_EQ(RestorePatches(f.proc->pid(), entries), 1u);
  EXPECT_EQ(ByteAt(*f.proc, f.tick), 0x22);
  (void)f.proc->Kill();
}

TEST(Guardian, JournalFullIsAnError) {
  Fixture f = LaunchFixture();
  auto g = Guardian::Start(f.proc->pid(), 2);
  ASSERT_TRUE(g.ok());
  const std::array<uint8_t, 1> a{1};
  const std::array<uint8_t, 1> b{2};
  auto h0 = (*g)->Record(RemoteAddr{0x1000}, a, b);
  ASSERT_TRUE(h0.ok());
  ASSERT_TRUE((*g)->Record(RemoteAddr{0x2000}, a, b).ok());
  auto full = (*g)->Record(RemoteAddr{0x3000}, a, b);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  (*g)->Forget(*h0);
  EXPECT_EQ((*g)->active(), 1u);
  EXPECT_TRUE((*g)->Record(RemoteAddr{0x3000}, a, b).ok());
  (void)f.proc->Kill();
}

// A forked child with one page it made read-only itself (as page mode leaves a write watch's
// page): it reports the page's address, waits for a byte on `go` (a blocking read, which the
// restore interrupts and which must resume), writes the page and exits 0, or dies of SIGSEGV
// if the page is still read-only.
struct ReadOnlyChild {
  pid_t pid = -1;
  uint64_t page = 0;
  int go = -1;
  ReadOnlyChild() = default;
  ReadOnlyChild(ReadOnlyChild&& o) noexcept
      : pid(std::exchange(o.pid, -1)), page(o.page), go(std::exchange(o.go, -1)) {}
  ReadOnlyChild& operator=(ReadOnlyChild&&) = delete;
  ~ReadOnlyChild() {  // a test that failed early leaves no child behind
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

ReadOnlyChild StartReadOnlyChild() {
  int up[2];
  int down[2];
  EXPECT_EQ(pipe(up), 0);
  EXPECT_EQ(pipe(down), 0);
  ReadOnlyChild c;
  c.pid = fork();
  if (c.pid == 0) {
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p, 4096, PROT_READ) != 0) {
      _exit(2);
    }
    const auto addr = reinterpret_cast<uint64_t>(p);
    (void)!write(up[1], &addr, sizeof(addr));
    char b = 0;
    while (read(down[0], &b, 1) < 0) {
    }
    ::signal(SIGSEGV, SIG_DFL);  // die of it, even under ASan (which catches it otherwise)
    static_cast<volatile uint8_t*>(p)[0] = 0x77;
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  EXPECT_EQ(read(up[0], &c.page, sizeof(c.page)), static_cast<ssize_t>(sizeof(c.page)));
  close(up[0]);
  c.go = down[1];
  return c;
}

// The permissions column of the child's mapping at `page` ("rw-p"), empty when unmapped.
std::string PermsAt(pid_t pid, uint64_t page) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uint64_t lo = 0;
    uint64_t hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) == 3 && page >= lo && page < hi) {
      return perms;
    }
  }
  return "";
}

// Lets the child write its page; its exit status.
int Finish(ReadOnlyChild& c) {
  (void)!write(c.go, "g", 1);
  close(c.go);
  int status = 0;
  EXPECT_EQ(waitpid(c.pid, &status, 0), c.pid);
  c.pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(GuardianProtections, RestoredInsideTheProcessWhichRunsOn) {
  ReadOnlyChild c = StartReadOnlyChild();
  ASSERT_GT(c.pid, 0);
  ASSERT_EQ(PermsAt(c.pid, c.page), "r--p");
  std::array<PatchEntry, 3> entries{};
  entries[0].state.store(2);  // protection: the page goes back to read-write
  entries[0].addr = c.page;
  entries[0].span = 4096;
  entries[0].prot = PROT_READ | PROT_WRITE;
  entries[1].state.store(1);  // bytes: not a protection, left to RestorePatches
  entries[1].len = 1;
  entries[1].addr = c.page;
  entries[2].addr = c.page;  // free: ignored
  entries[2].span = 4096;
  entries[2].prot = PROT_NONE;
  const ProtectionRestore r = RestoreProtections(c.pid, entries, 1000);
  EXPECT_EQ(r.journaled, 1u);
  EXPECT_EQ(r.restored, 1u);
  EXPECT_STREQ(r.error.data(), "");
  EXPECT_EQ(PermsAt(c.pid, c.page), "rw-p");
  EXPECT_EQ(Finish(c), 0);  // its read resumed, and the write went through
}

TEST(GuardianProtections, ATracedProcessIsWaitedForThenTheCallIsNamed) {
  ReadOnlyChild c = StartReadOnlyChild();
  ASSERT_GT(c.pid, 0);
  // kwatch still holding the target: the guardian waits, then gives up naming the call.
  ASSERT_EQ(::ptrace(PTRACE_SEIZE, c.pid, nullptr, nullptr), 0);
  std::array<PatchEntry, 1> entries{};
  entries[0].state.store(2);
  entries[0].addr = c.page;
  entries[0].span = 4096;
  entries[0].prot = PROT_READ | PROT_WRITE;
  ProtectionRestore r = RestoreProtections(c.pid, entries, 20);
  EXPECT_EQ(r.journaled, 1u);
  EXPECT_EQ(r.restored, 0u);
  EXPECT_STREQ(r.error.data(), "ptrace(PTRACE_SEIZE): Operation not permitted");
  EXPECT_EQ(PermsAt(c.pid, c.page), "r--p");
  // Once the tracer lets go, the same journal restores the page.
  ASSERT_EQ(::ptrace(PTRACE_INTERRUPT, c.pid, nullptr, nullptr), 0);
  ASSERT_EQ(waitpid(c.pid, nullptr, __WALL), c.pid);
  ASSERT_EQ(::ptrace(PTRACE_DETACH, c.pid, nullptr, nullptr), 0);
  r = RestoreProtections(c.pid, entries, 1000);
  EXPECT_EQ(r.restored, 1u);
  EXPECT_EQ(PermsAt(c.pid, c.page), "rw-p");
  EXPECT_EQ(Finish(c), 0);
}

// The one-letter state of thread `tid` of `pid` ('S', 't', ...), 0 when gone.
char ThreadState(pid_t pid, pid_t tid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
}

// Whether the main thread of `pid` has a child (its vfork child).
bool HasChildren(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::string text;
  return static_cast<bool>(f >> text);
}

// Whether thread `tid` of `pid` has a tracer.
bool Traced(pid_t pid, pid_t tid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("TracerPid:", 0) == 0) {
      return std::stoi(line.substr(10)) != 0;
    }
  }
  return false;
}

// A thread other than the one the guardian runs mprotect in touches the protected page after
// the guardian seized it but before the mprotect: its SIGSEGV stops it for the guardian,
// which drops the signal once the page is back, and the access runs again. Deterministic:
// the main thread, where mprotect runs, sits in vfork() (which no interrupt ends) until the
// other thread is seen stopped at its fault.
TEST(GuardianProtections, AThreadFaultingDuringTheRestoreIsHeldThenRunAgain) {
  int up[2];
  int poke[2];
  int release[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(poke), 0);
  ASSERT_EQ(pipe(release), 0);
  const pid_t child = fork();
  if (child == 0) {
    static volatile uint8_t* page = nullptr;
    static int poke_fd = poke[0];
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p, 4096, PROT_READ) != 0) {
      _exit(2);
    }
    page = static_cast<volatile uint8_t*>(p);
    ::signal(SIGSEGV, SIG_DFL);  // die of it, even under ASan (which catches it otherwise)
    pthread_t toucher;
    static pid_t toucher_tid = 0;
    static int ready[2];
    if (pipe(ready) != 0 ||
        pthread_create(
            &toucher, nullptr,
            [](void*) -> void* {
              toucher_tid = static_cast<pid_t>(syscall(SYS_gettid));
              (void)!write(ready[1], "r", 1);
              char b = 0;
              while (read(poke_fd, &b, 1) < 0) {
              }
              page[0] = 0x55;  // faults: the page is read-only until the guardian restores it
              return nullptr;
            },
            nullptr) != 0) {
      _exit(2);
    }
    char b = 0;
    (void)!read(ready[0], &b, 1);
    const uint64_t report[2] = {reinterpret_cast<uint64_t>(p), static_cast<uint64_t>(toucher_tid)};
    (void)!write(up[1], report, sizeof(report));
    if (vfork() == 0) {
      while (read(release[0], &b, 1) < 0) {
      }
      _exit(0);
    }
    pthread_join(toucher, nullptr);
    _exit(page[0] == 0x55 ? 0 : 3);
  }
  close(up[1]);
  close(poke[0]);
  close(release[0]);
  uint64_t report[2] = {0, 0};
  ASSERT_EQ(read(up[0], report, sizeof(report)), static_cast<ssize_t>(sizeof(report)));
  close(up[0]);
  const uint64_t page = report[0];
  const auto toucher = static_cast<pid_t>(report[1]);
  // Wait until the main thread is in vfork (its vfork child exists).
  for (int i = 0; i < 1000 && !HasChildren(child); ++i) {
    usleep(1000);
  }
  std::thread conductor([&] {
    // The guardian seized the toucher: let it touch the page, and once it is stopped at its
    // fault, let the main thread out of vfork (the guardian's mprotect runs there).
    for (int i = 0; i < 10000 && !Traced(child, toucher); ++i) {
      usleep(100);
    }
    (void)!write(poke[1], "p", 1);
    for (int i = 0; i < 10000 && ThreadState(child, toucher) != 't'; ++i) {
      usleep(100);
    }
    (void)!write(release[1], "g", 1);
  });
  std::array<PatchEntry, 1> entries{};
  entries[0].state.store(2);
  entries[0].addr = page;
  entries[0].span = 4096;
  entries[0].prot = PROT_READ | PROT_WRITE;
  const ProtectionRestore r = RestoreProtections(child, entries, 1000);
  conductor.join();
  close(poke[1]);
  close(release[1]);
  EXPECT_EQ(r.journaled, 1u);
  EXPECT_EQ(r.restored, 1u);
  EXPECT_EQ(r.saved, 1u) << "the toucher's fault was not held for the restore";
  EXPECT_STREQ(r.error.data(), "");
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                              : "exit " + std::to_string(WEXITSTATUS(status)));
}

TEST(GuardianProtections, WithoutTheRestoreTheChildDies) {
  // The fixture itself: a page left read-only kills the child at its write.
  ReadOnlyChild c = StartReadOnlyChild();
  ASSERT_GT(c.pid, 0);
  EXPECT_EQ(Finish(c), 128 + SIGSEGV);
}

}  // namespace
}  // namespace kwatch::core::ptrace
