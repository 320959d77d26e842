#include "core/guardian.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "core/syscall_status.h"

namespace kwatch::core {

namespace {

constexpr uint32_t kFree = 0;
constexpr uint32_t kActive = 1;
constexpr char kDismiss = 'D';

// The guardian process: waits for kwatch to dismiss it or to die. Only async-signal-safe
// calls after fork (kwatch may have threads), and nothing from kwatch's state but the
// journal, the pipe and stderr.
[[noreturn]] void GuardianMain(int read_fd, pid_t target, std::span<PatchEntry> entries) {
  ::setpgid(0, 0);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_NAME, "kwatch-guard", 0, 0, 0);
  // Keep only the pipe and stderr: kwatch's perf events, signalfd and target fds must not
  // stay alive through the guardian.
  if (read_fd != 3) {
    ::dup2(read_fd, 3);
  }
  ::syscall(SYS_close_range, 4U, ~0U, 0U);
  ::close(0);
  ::close(1);
  char c = 0;
  ssize_t n = 0;
  do {
    n = ::read(3, &c, 1);
  } while (n < 0 && errno == EINTR);
  if (n == 1 && c == kDismiss) {
    ::_exit(0);
  }
  const size_t restored = RestorePatches(target, entries);
  if (restored > 0) {
    char msg[160];
    const int len = std::snprintf(msg, sizeof(msg),
                                  "kwatch-guard: kwatch ended without cleaning up; restored %zu "
                                  "patched location%s in pid %d\n",
                                  restored, restored == 1 ? "" : "s", target);
    if (len > 0) {
      (void)!::write(2, msg, static_cast<size_t>(len));
    }
  }
  ::_exit(0);
}

}  // namespace

size_t RestorePatches(pid_t target, std::span<PatchEntry> entries) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/mem", target);
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
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
    uint8_t now[16];
    const auto off = static_cast<off_t>(e.addr);
    if (::pread(fd, now, e.len, off) != static_cast<ssize_t>(e.len) ||
        std::memcmp(now, e.patched, e.len) != 0) {
      continue;  // unmapped, or no longer holds kwatch's bytes
    }
    if (::pwrite(fd, e.original, e.len, off) == static_cast<ssize_t>(e.len)) {
      ++restored;
    }
  }
  ::close(fd);
  return restored;
}

absl::StatusOr<std::unique_ptr<Guardian>> Guardian::Start(pid_t target, size_t capacity) {
  KW_CHECK(capacity > 0);
  auto g = std::unique_ptr<Guardian>(new Guardian());
  g->target_ = target;
  const size_t bytes = capacity * sizeof(PatchEntry);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    return SyscallError(err, "mmap(guardian journal)");
  }
  g->journal_ = UniqueMmap(mem, bytes);
  g->entries_ = std::span<PatchEntry>(static_cast<PatchEntry*>(mem), capacity);  // zeroed: kFree
  g->free_.reserve(capacity);
  for (size_t i = capacity; i-- > 0;) {
    g->free_.push_back(static_cast<Handle>(i));
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
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
    GuardianMain(read_end.get(), target, g->entries_);
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
  if (free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the guardian's journal is full (%d patched locations); kwatch cannot promise to "
        "restore more",
        entries_.size()));
  }
  const Handle h = free_.back();
  free_.pop_back();
  PatchEntry& e = entries_[h];
  e.len = static_cast<uint32_t>(original.size());
  e.addr = addr.value;
  std::memcpy(e.original, original.data(), original.size());
  std::memcpy(e.patched, patched.data(), patched.size());
  e.state.store(kActive, std::memory_order_release);
  ++active_;
  return h;
}

void Guardian::Forget(Handle h) {
  KW_CHECK(h < entries_.size());
  PatchEntry& e = entries_[h];
  if (e.state.load(std::memory_order_relaxed) == kActive) {
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
  (void)!::write(pipe_.get(), &c, 1);
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

}  // namespace kwatch::core
