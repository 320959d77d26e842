#include "core/ptrace/guardian.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/maps.h"

namespace kwatch::core::ptrace {

namespace {

constexpr uint32_t kFree = 0;
constexpr uint32_t kActive = 1;      // bytes
constexpr uint32_t kProtection = 2;  // page protections
constexpr char kDismiss = 'D';
constexpr int kDetached = SIGUSR2;  // the guardian's parent-death signal

ProtectionRestore RestoreProtectionsOrSayWhy(pid_t target, std::span<PatchEntry> entries,
                                             int wait_ms);

// The guardian process: waits for kwatch to dismiss it or to die. Only async-signal-safe
// calls after fork (kwatch may have threads), and nothing from kwatch's state but the
// journal, the pipe and stderr.
[[noreturn]] void GuardianMain(int read_fd, pid_t target, const JournalHeader* header,
                               std::span<PatchEntry> entries) {
  ::setpgid(0, 0);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_NAME, "kwatch-guard", 0, 0, 0);
  // kDetached arrives when the kwatch thread that started the guardian ends, right after the
  // kernel detached its tracees (exit_notify: exit_ptrace, then the parent-death signal):
  // the moment page protections can be restored. Blocked: it is waited for, not handled.
  sigset_t detached;
  sigemptyset(&detached);
  sigaddset(&detached, kDetached);
  ::pthread_sigmask(SIG_BLOCK, &detached, nullptr);
  ::prctl(PR_SET_PDEATHSIG, kDetached, 0, 0, 0);
  // Keep only the pipe and stderr: kwatch's perf events, signalfd and target fds must not
  // stay alive through the guardian.
  if (read_fd != 3) {
    ::dup2(read_fd, 3);
  }
  ::syscall(SYS_close_range, 4U, ~0U, 0U);
  ::close(0);
  ::close(1);
  // Open the target's memory now, while kwatch is alive: once kwatch is dying its tracees
  // keep running, and each INT3 they hit before the restore kills one of them.
  std::array<char, 64> mem_path{};
  std::snprintf(mem_path.data(), mem_path.size(), "/proc/%d/mem", target);
  const int mem_fd = ::open(mem_path.data(), O_RDWR | O_CLOEXEC);
  char c = 0;
  ssize_t n = 0;
  do {
    n = ::read(3, &c, 1);
  } while (n < 0 && errno == EINTR);
  if (n == 1 && c == kDismiss) {
    ::_exit(0);
  }
  // Only the entries kwatch ever used: reading the rest of the journal (1 MiB of a shared
  // mapping never touched) costs a page allocation per 4 KiB, 3.4 ms at the moment that counts.
  entries =
      entries.first(std::min<size_t>(entries.size(), header->used.load(std::memory_order_acquire)));
  const size_t restored = RestorePatches(target, entries, mem_fd);
  if (restored > 0) {
    std::array<char, 160> msg{};
    const int len = std::snprintf(msg.data(), msg.size(),
                                  "kwatch-guard: kwatch ended without cleaning up; restored %zu "
                                  "patched location%s in pid %d\n",
                                  restored, restored == 1 ? "" : "s", target);
    if (len > 0) {
      // Best effort: nowhere to report a failure.
      [[maybe_unused]] const ssize_t n =
          ::write(2, msg.data(), std::min(static_cast<size_t>(len), msg.size() - 1));
    }
  }
  // Page protections wait for the kernel to let kwatch's tracees go, and every access to a
  // protected page in the meantime kills the target: get the CPU first where allowed
  // (CAP_SYS_NICE), and sleep no longer than asked. (Not before the bytes above: the call
  // itself took 120 us here.)
  if (std::ranges::any_of(entries, [](const PatchEntry& e) {
        return e.state.load(std::memory_order_acquire) == kProtection;
      })) {
    ::setpriority(PRIO_PROCESS, 0, -20);
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  }
  const ProtectionRestore prot = RestoreProtectionsOrSayWhy(target, entries, /*wait_ms=*/10'000);
  if (prot.journaled > 0) {
    std::array<char, 400> msg{};
    std::array<char, 96> held{};
    if (prot.saved > 0) {
      std::snprintf(held.data(), held.size(), " (%zu access%s to them held meanwhile, then run)",
                    prot.saved, prot.saved == 1 ? "" : "es");
    }
    const int len =
        prot.restored == prot.journaled
            ? std::snprintf(msg.data(), msg.size(),
                            "kwatch-guard: kwatch ended without cleaning up; restored the "
                            "protections of %zu page range%s in pid %d%s\n",
                            prot.restored, prot.restored == 1 ? "" : "s", target, held.data())
            : std::snprintf(msg.data(), msg.size(),
                            "kwatch-guard: kwatch ended without cleaning up; restored the "
                            "protections of %zu of %zu page ranges in pid %d: %s\n",
                            prot.restored, prot.journaled, target, prot.error.data());
    if (len > 0) {
      [[maybe_unused]] const ssize_t n =  // best effort, as above
          ::write(2, msg.data(), std::min(static_cast<size_t>(len), msg.size() - 1));
    }
  }
  ::_exit(0);
}

void SleepUs(long us) {
  timespec ts{0, us * 1000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Sleeps `us` microseconds, or until kDetached is pending (the guardian blocks it: the
// wait ends the moment kwatch's tracees are let go).
void WaitForDetach(long us) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, kDetached);
  sigset_t blocked;
  if (::pthread_sigmask(SIG_BLOCK, nullptr, &blocked) != 0 ||
      sigismember(&blocked, kDetached) != 1) {
    SleepUs(us);  // not the guardian (a test): nothing to wait for
    return;
  }
  const timespec ts{0, us * 1000};
  (void)::sigtimedwait(&set, nullptr, &ts);
}

bool Alive(char state) {
  return state != 0 && state != 'Z' && state != 'X';
}

// Calls fn(tid) for each thread in /proc/PID/task until it returns false (getdents64: no
// allocation, async-signal-safe).
template <typename Fn>
void ForEachTask(pid_t pid, Fn fn) {
  std::array<char, 64> path{};
  std::snprintf(path.data(), path.size(), "/proc/%d/task", pid);
  const int fd = ::open(path.data(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return;
  }
  alignas(8) std::array<char, 4096> buf{};
  long n = 0;
  bool more = true;
  while (more && (n = ::syscall(SYS_getdents64, fd, buf.data(), buf.size())) > 0) {
    for (long off = 0; off < n && more;) {
      const auto* d = reinterpret_cast<const struct dirent64*>(buf.data() + off);
      off += d->d_reclen;
      pid_t tid = 0;
      for (const char* c = d->d_name; *c >= '0' && *c <= '9'; ++c) {
        tid = tid * 10 + (*c - '0');
      }
      if (tid > 0) {
        more = fn(tid);
      }
    }
  }
  ::close(fd);
}

// A thread of `pid` that can still run code: the main thread, else the first live one in
// /proc/PID/task (the main thread may have ended with pthread_exit). 0 when none.
pid_t LiveThread(pid_t pid) {
  if (Alive(TaskStateLetter(pid, pid))) {
    return pid;
  }
  pid_t found = 0;
  ForEachTask(pid, [&](pid_t tid) {
    if (Alive(TaskStateLetter(pid, tid))) {
      found = tid;
    }
    return found == 0;
  });
  return found;
}

// The threads the guardian seized, and what each reported. Waiting for one thread alone can
// hang: when the process is dying, its main thread's end is reported only after every other
// traced thread's (the kernel delays a group leader), so each wait collects them all.
class SeizedThreads {
 public:
  // Seizes `tid` (without stopping it); false when the kernel refuses (errno set).
  bool Seize(pid_t tid) {
    if (n_ == threads_.size() || ::ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
      return false;
    }
    threads_[n_++] = {tid, 0, kRunning};
    return true;
  }
  size_t size() const { return n_; }
  pid_t tid(size_t i) const { return threads_[i].tid; }

  // Waits for `tid`'s next stop (true, its status) or end (false), collecting the other
  // threads' reports meanwhile. Gives up (false) after `wait_ms`.
  bool WaitStop(pid_t tid, int& status, int wait_ms = 2000) {
    Thread* want = Find(tid);
    if (want == nullptr) {
      return false;
    }
    for (int waited_us = 0; want->state == kRunning; waited_us += 20) {
      bool any = false;
      for (size_t i = 0; i < n_; ++i) {
        any = Collect(threads_[i]) || any;
      }
      if (want->state == kRunning) {
        if (waited_us >= wait_ms * 1000) {
          return false;
        }
        if (!any) {
          SleepUs(20);
        }
      }
    }
    if (want->state == kGone) {
      return false;
    }
    status = want->status;
    want->state = kRunning;  // its next report is a new one
    return true;
  }

 private:
  enum State : uint8_t { kRunning, kReported, kGone };
  struct Thread {
    pid_t tid;
    int status;
    State state;
  };

  Thread* Find(pid_t tid) {
    for (size_t i = 0; i < n_; ++i) {
      if (threads_[i].tid == tid) {
        return &threads_[i];
      }
    }
    return nullptr;
  }
  // A report of `t` not yet taken; true when one came.
  static bool Collect(Thread& t) {
    if (t.state != kRunning) {
      return false;
    }
    int status = 0;
    pid_t r = 0;
    do {
      r = ::waitpid(t.tid, &status, __WALL | WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) {
      return false;
    }
    t.status = status;
    t.state = (r == t.tid && WIFSTOPPED(status)) ? kReported : kGone;
    return true;
  }
  std::array<Thread, 512> threads_{};
  size_t n_ = 0;
};

// The text of errno `err` without the locale (strerrordesc_np: async-signal-safe, unlike
// strerror).
const char* ErrnoDescription(int err) {
  const char* text = strerrordesc_np(err);
  return text != nullptr ? text : "unknown error";
}

void SetError(ProtectionRestore& out, const char* call, int err) {
  std::snprintf(out.error.data(), out.error.size(), "%s: %s", call, ErrnoDescription(err));
}

// Whether a fault at `addr` lies in a journaled range.
bool InJournaledRange(std::span<PatchEntry> entries, uint64_t addr) {
  return std::ranges::any_of(entries, [addr](const PatchEntry& e) {
    return e.state.load(std::memory_order_acquire) == kProtection && addr >= e.addr &&
           addr - e.addr < e.span;
  });
}

// ptrace(2) takes the signal to deliver as its data pointer.
void Detach(pid_t tid, int deliver) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  (void)::ptrace(PTRACE_DETACH, tid, nullptr, reinterpret_cast<void*>(static_cast<long>(deliver)));
}

// The signal to deliver when detaching `tid`, stopped with `status`: none for an interrupt
// stop, or a fault on a journaled page (restored by then: the access runs again, counted in
// `saved`), else the signal it stopped with.
int SignalToDeliver(pid_t tid, int status, std::span<PatchEntry> entries, size_t& saved) {
  const int sig = WSTOPSIG(status);
  if ((status >> 16) != 0 || sig == SIGTRAP) {
    return 0;
  }
  siginfo_t si{};
  const bool journaled_fault = sig == SIGSEGV &&
                               ::ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si) == 0 &&
                               si.si_code == SEGV_ACCERR &&
                               InJournaledRange(entries, reinterpret_cast<uint64_t>(si.si_addr));
  saved += journaled_fault ? 1 : 0;
  return journaled_fault ? 0 : sig;
}

// Lets the seized threads other than `keep` go once the protections are back: each is
// interrupted (if it is not stopped at a fault already) and detached with the signal it
// stopped with, unless that was a fault on a journaled page.
void ReleaseSeized(SeizedThreads& seized, pid_t keep, std::span<PatchEntry> entries,
                   size_t& saved) {
  for (size_t i = 0; i < seized.size(); ++i) {
    if (seized.tid(i) != keep) {
      (void)::ptrace(PTRACE_INTERRUPT, seized.tid(i), nullptr, nullptr);
    }
  }
  for (size_t i = 0; i < seized.size(); ++i) {
    const pid_t t = seized.tid(i);
    int status = 0;
    if (t != keep && seized.WaitStop(t, status)) {
      Detach(t, SignalToDeliver(t, status, entries, saved));
    }
  }
}

// Runs mprotect for every protection entry in the stopped thread `tid` (a `syscall`
// instruction patched over the code at its rip, single-stepped, everything put back). The
// signal to deliver when detaching is kept in `deliver`.
void MprotectIn(SeizedThreads& seized, pid_t tid, std::span<PatchEntry> entries, int& deliver,
                ProtectionRestore& out) {
  user_regs_struct saved{};
  if (::ptrace(PTRACE_GETREGS, tid, nullptr, &saved) != 0) {
    SetError(out, "ptrace(PTRACE_GETREGS)", errno);
    return;
  }
  const uint64_t at = saved.rip;
  errno = 0;
  const long word = ::ptrace(PTRACE_PEEKTEXT, tid, at, nullptr);
  if (errno != 0) {
    SetError(out, "ptrace(PTRACE_PEEKTEXT)", errno);
    return;
  }
  if (::ptrace(PTRACE_POKETEXT, tid, at, (word & ~0xffffL) | 0x050f) != 0) {
    SetError(out, "ptrace(PTRACE_POKETEXT)", errno);
    return;
  }
  for (PatchEntry& e : entries) {
    if (e.state.load(std::memory_order_acquire) != kProtection) {
      continue;
    }
    user_regs_struct regs = saved;
    regs.rax = SYS_mprotect;
    regs.orig_rax = static_cast<uint64_t>(-1);  // no restart logic for the injected call
    regs.rdi = e.addr;
    regs.rsi = e.span;
    regs.rdx = static_cast<uint64_t>(e.prot);
    regs.rip = at;
    bool ran = false;
    // A signal that arrives first stops the step before the instruction: keep it, step again.
    for (int attempt = 0; attempt < 8 && !ran; ++attempt) {
      if (::ptrace(PTRACE_SETREGS, tid, nullptr, &regs) != 0 ||
          ::ptrace(PTRACE_SINGLESTEP, tid, nullptr, nullptr) != 0) {
        SetError(out, "ptrace(PTRACE_SINGLESTEP)", errno);
        return;
      }
      int status = 0;
      if (!seized.WaitStop(tid, status)) {
        std::snprintf(out.error.data(), out.error.size(), "thread %d ended during mprotect", tid);
        return;
      }
      user_regs_struct after{};
      if (::ptrace(PTRACE_GETREGS, tid, nullptr, &after) != 0) {
        SetError(out, "ptrace(PTRACE_GETREGS)", errno);
        return;
      }
      const int sig = WSTOPSIG(status);
      if (after.rip == at + 2) {
        ran = true;
        if (static_cast<int64_t>(after.rax) == 0) {
          ++out.restored;
        } else {
          std::snprintf(out.error.data(), out.error.size(), "mprotect(0x%llx, %llu bytes): %s",
                        static_cast<unsigned long long>(e.addr),
                        static_cast<unsigned long long>(e.span),
                        ErrnoDescription(static_cast<int>(-static_cast<int64_t>(after.rax))));
        }
      }
      if (sig != SIGTRAP && deliver == 0) {
        deliver = sig;
      }
    }
  }
  (void)::ptrace(PTRACE_POKETEXT, tid, at, word);
  (void)::ptrace(PTRACE_SETREGS, tid, nullptr, &saved);
}

}  // namespace

size_t RestorePatches(pid_t target, std::span<PatchEntry> entries, int mem_fd) {
  int fd = mem_fd;
  if (fd < 0) {
    std::array<char, 64> path{};
    std::snprintf(path.data(), path.size(), "/proc/%d/mem", target);
    fd = ::open(path.data(), O_RDWR | O_CLOEXEC);
  }
  if (fd < 0) {
    return 0;
  }
  size_t restored = 0;
  // Newest first: a location patched twice is unwound in reverse order.
  for (size_t i = entries.size(); i-- > 0;) {
    PatchEntry& e = entries[i];
    if (e.state.load(std::memory_order_acquire) != kActive || e.len == 0 || e.len > 16) {
      continue;
    }
    std::array<uint8_t, 16> now{};
    const auto off = static_cast<off_t>(e.addr);
    if (::pread(fd, now.data(), e.len, off) != static_cast<ssize_t>(e.len) ||
        std::memcmp(now.data(), e.patched.data(), e.len) != 0) {
      continue;  // unmapped, or no longer holds kwatch's bytes
    }
    if (::pwrite(fd, e.original.data(), e.len, off) == static_cast<ssize_t>(e.len)) {
      ++restored;
    }
  }
  ::close(fd);
  return restored;
}

ProtectionRestore RestoreProtections(pid_t target, std::span<PatchEntry> entries, int wait_ms) {
  ProtectionRestore out;
  for (const PatchEntry& e : entries) {
    out.journaled += e.state.load(std::memory_order_acquire) == kProtection ? 1 : 0;
  }
  if (out.journaled == 0) {
    return out;
  }
  // kwatch's tracees are detached a moment after its files close: seize once the kernel
  // lets go (EPERM until then).
  SeizedThreads seized;
  pid_t tid = 0;
  for (int waited_us = 0;; waited_us += 20) {
    tid = LiveThread(target);
    if (tid == 0) {
      std::snprintf(out.error.data(), out.error.size(), "the process has no live thread left");
      return out;
    }
    if (seized.Seize(tid)) {
      break;
    }
    const int err = errno;
    if ((err != EPERM && err != ESRCH) || waited_us >= wait_ms * 1000) {
      SetError(out, "ptrace(PTRACE_SEIZE)", err);
      return out;
    }
    WaitForDetach(20);
  }
  // Seize the other threads at once too (without stopping them): from here a thread that
  // touches a protected page stops for the guardian instead of dying of its SIGSEGV, and the
  // access runs again once the protections are back. Until the mprotect below is done (a
  // stop, a syscall and a step in one thread: milliseconds on a busy machine) that is every
  // thread's only protection.
  ForEachTask(target, [&](pid_t other) {
    if (other != tid) {
      (void)seized.Seize(other);
    }
    return true;
  });
  int status = 0;
  if (::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0 || !seized.WaitStop(tid, status)) {
    SetError(out, "ptrace(PTRACE_INTERRUPT)", errno);
    ReleaseSeized(seized, tid, entries, out.saved);
    Detach(tid, 0);
    return out;
  }
  int deliver = SignalToDeliver(tid, status, entries, out.saved);
  MprotectIn(seized, tid, entries, deliver, out);
  ReleaseSeized(seized, tid, entries, out.saved);
  Detach(tid, deliver);
  return out;
}

namespace {

ProtectionRestore RestoreProtectionsOrSayWhy(pid_t target, std::span<PatchEntry> entries,
                                             int wait_ms) {
  ProtectionRestore out = RestoreProtections(target, entries, wait_ms);
  if (out.restored < out.journaled && LiveThread(target) == 0) {
    // Whatever failed, the reason is that the process is gone (likely a thread that touched a
    // protected page in the moment between kwatch's death and the restore).
    std::snprintf(out.error.data(), out.error.size(),
                  "the process ended first (a SIGSEGV on a protected page in the moment "
                  "between kwatch's death and the restore?)");
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Guardian>> Guardian::Start(pid_t target, size_t capacity) {
  KW_CHECK(capacity > 0);
  auto g = std::unique_ptr<Guardian>(new Guardian());
  g->target_ = target;
  const size_t bytes = sizeof(JournalHeader) + capacity * sizeof(PatchEntry);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    return SyscallError(err, "mmap(guardian journal)");
  }
  g->journal_ = UniqueMmap(mem, bytes);
  g->header_ = new (mem) JournalHeader();
  g->entries_ = std::span<PatchEntry>(  // zeroed: kFree
      reinterpret_cast<PatchEntry*>(static_cast<char*>(mem) + sizeof(JournalHeader)), capacity);
  g->free_.reserve(capacity);
  for (size_t i = capacity; i-- > 0;) {
    g->free_.push_back(static_cast<Handle>(i));
  }
  std::array<int, 2> fds{};
  if (::pipe2(fds.data(), O_CLOEXEC) != 0) {
    const int err = errno;
    return SyscallError(err, "pipe2(guardian)");
  }
  UniqueFd read_end(fds[0]);
  g->pipe_.Reset(fds[1]);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    return SyscallError(err, "fork(guardian)");
  }
  if (pid == 0) {
    ::close(fds[1]);
    GuardianMain(read_end.get(), target, g->header_, g->entries_);
  }
  g->pid_ = pid;
  return g;
}

Guardian::~Guardian() {
  (void)Dismiss();
}

absl::StatusOr<Guardian::Handle> Guardian::Record(RemoteAddr addr,
                                                  std::span<const uint8_t> original,
                                                  std::span<const uint8_t> patched) {
  KW_CHECK(original.size() == patched.size() && !original.empty() && original.size() <= 16);
  KW_ASSIGN_OR_RETURN(const Handle h, Take());
  PatchEntry& e = entries_[h];
  e.len = static_cast<uint32_t>(original.size());
  e.addr = addr.value;
  std::memcpy(e.original.data(), original.data(), original.size());
  std::memcpy(e.patched.data(), patched.data(), patched.size());
  e.state.store(kActive, std::memory_order_release);
  return h;
}

absl::StatusOr<Guardian::Handle> Guardian::RecordProtection(RemoteAddr page, uint64_t span,
                                                            int original_prot) {
  KW_CHECK(span > 0);
  KW_ASSIGN_OR_RETURN(const Handle h, Take());
  PatchEntry& e = entries_[h];
  e.len = 0;
  e.addr = page.value;
  e.span = span;
  e.prot = original_prot;
  e.state.store(kProtection, std::memory_order_release);
  return h;
}

absl::StatusOr<Guardian::Handle> Guardian::Take() {
  if (free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the guardian's journal is full (%d patched locations); kwatch cannot promise to "
        "restore more",
        entries_.size()));
  }
  const Handle h = free_.back();
  free_.pop_back();
  ++active_;
  if (h >= header_->used.load(std::memory_order_relaxed)) {
    header_->used.store(h + 1, std::memory_order_release);
  }
  return h;
}

void Guardian::Forget(Handle h) {
  KW_CHECK(h < entries_.size());
  PatchEntry& e = entries_[h];
  if (e.state.load(std::memory_order_relaxed) != kFree) {
    e.state.store(kFree, std::memory_order_release);
    free_.push_back(h);
    --active_;
  }
}

void Guardian::ForgetAll() {
  for (Handle h = 0; h < entries_.size(); ++h) {
    Forget(h);
  }
}

absl::Status Guardian::Dismiss() {
  if (pid_ <= 0) {
    return absl::OkStatus();
  }
  const char c = kDismiss;
  // Best effort: without the byte, the guardian reads EOF once pipe_ closes below.
  [[maybe_unused]] const ssize_t n = ::write(pipe_.get(), &c, 1);
  pipe_.Reset();
  int status = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  pid_ = -1;
  if (r < 0 && errno != ECHILD) {  // ECHILD: already reaped by a wait for any child
    const int err = errno;
    return SyscallError(err, "waitpid(guardian)");
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::ptrace
