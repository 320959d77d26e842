#include "tests/test_util.h"

#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kwatch::testing {

std::string TargetPath(const std::string& name) {
  return std::string(KWATCH_TARGETS_DIR) + "/" + name;
}

std::string KwatchPath() {
  return KWATCH_BINARY;
}

bool AllowSkip() {
  const char* v = std::getenv("KWATCH_ALLOW_SKIP");  // NOLINT(concurrency-mt-unsafe)
  return v != nullptr && std::strcmp(v, "1") == 0;
}

RunResult KwatchProbe(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {KwatchPath(), "probe"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = Run(argv);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv, int timeout_s) {
  auto child = Spawned::Start(argv);
  if (!child.ok()) {
    return child.status();
  }
  return (*child)->Finish(timeout_s);
}

absl::StatusOr<std::unique_ptr<Spawned>> Spawned::Start(const std::vector<std::string>& argv) {
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe2 failed");
  }
  std::vector<char*> args;
  for (const auto& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));  // NOLINT
  }
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  auto s = std::unique_ptr<Spawned>(new Spawned());
  s->pid_ = pid;
  s->out_fd_ = out_pipe[0];
  s->err_fd_ = err_pipe[0];
  return s;
}

Spawned::~Spawned() {
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) {
    close(out_fd_);
  }
  if (err_fd_ >= 0) {
    close(err_fd_);
  }
}

bool Spawned::Pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (out_fd_ < 0 && err_fd_ < 0) {
    return false;
  }
  if (poll(fds, 2, timeout_ms) <= 0) {
    return true;
  }
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP)) == 0) {
      continue;
    }
    char buf[65536];
    const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
    if (n <= 0) {
      close(fds[i].fd);
      (i == 0 ? out_fd_ : err_fd_) = -1;
      continue;
    }
    (i == 0 ? result_.out : result_.err).append(buf, static_cast<size_t>(n));
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

namespace {

absl::Status WaitFor(const std::string& needle, int timeout_s, const std::string& text,
                     const std::function<bool(int)>& pump, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (text.find(needle) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline || !pump(100)) {
      if (text.find(needle) != std::string::npos) {
        break;
      }
      return absl::DeadlineExceededError(
          absl::StrCat("'", needle, "' did not appear on ", what, "; got:\n", text));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Spawned::WaitForStdout(const std::string& needle, int timeout_s) {
  return WaitFor(
      needle, timeout_s, result_.out, [this](int ms) { return Pump(ms); }, "stdout");
}

absl::Status Spawned::WaitForStderr(const std::string& needle, int timeout_s) {
  return WaitFor(
      needle, timeout_s, result_.err, [this](int ms) { return Pump(ms); }, "stderr");
}

absl::StatusOr<RunResult> Spawned::Finish(int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (Pump(100)) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      return absl::DeadlineExceededError(absl::StrCat("timed out after ", timeout_s, "s; stdout:\n",
                                                      result_.out, "\nstderr:\n", result_.err));
    }
  }
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
  result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result_;
}

namespace {

// A disabled, not inherited 8-byte write breakpoint on `addr` in thread `tid`, user space
// only; invalid (errno set) when the kernel refuses.
core::UniqueFd OpenDisabledBreakpoint(pid_t tid, uint64_t addr) {
  perf_event_attr attr{};
  attr.type = PERF_TYPE_BREAKPOINT;
  attr.size = sizeof(attr);
  attr.bp_type = HW_BREAKPOINT_W;
  attr.bp_addr = addr;
  attr.bp_len = HW_BREAKPOINT_LEN_8;
  attr.sample_period = 1;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  attr.disabled = 1;
  return core::UniqueFd(
      static_cast<int>(::syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC)));
}

}  // namespace

int FreeDebugRegisters(pid_t tid, uint64_t addr) {
  std::vector<core::UniqueFd> held;
  for (int i = 0; i <= 4; ++i) {
    core::UniqueFd fd = OpenDisabledBreakpoint(tid, addr);
    if (!fd.valid()) {
      EXPECT_EQ(errno, ENOSPC) << "perf_event_open on " << tid << ": " << std::strerror(errno);
      break;
    }
    held.push_back(std::move(fd));
  }
  return static_cast<int>(held.size());
}

core::UniqueFd HoldBreakpointSlot(pid_t tid, uint64_t addr) {
  core::UniqueFd fd = OpenDisabledBreakpoint(tid, addr);
  EXPECT_TRUE(fd.valid()) << "perf_event_open(breakpoint) on tid " << tid << ": "
                          << std::strerror(errno);
  return fd;
}

}  // namespace kwatch::testing
