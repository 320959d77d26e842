#include "watch/slots_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "drmgr/debug_regs.h"
#include "watch/perf_util.h"

namespace kwatch::watch {

namespace {

// The breakpoints' addresses: perf only checks that they are aligned user addresses, in any
// process, so kwatch's own buffer will do (the events stay disabled and never fire).
alignas(64) std::array<uint64_t, drmgr::kNumDebugRegisters> g_probe_buffer{};

// The first line of a small /proc file, trimmed; "" when it cannot be read.
std::string ReadLine(const std::string& path) {
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return {};
  }
  std::array<char, 256> buf{};
  const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
  if (n <= 0) {
    return {};
  }
  return std::string(
      absl::StripAsciiWhitespace(absl::string_view(buf.data(), static_cast<size_t>(n))));
}

}  // namespace

absl::StatusOr<int> CountFreeSlots(pid_t tid) {
  std::vector<core::UniqueFd> held;
  for (int i = 0; i < drmgr::kNumDebugRegisters; ++i) {
    perf_event_attr attr{};
    attr.type = PERF_TYPE_BREAKPOINT;
    attr.size = sizeof(attr);
    attr.bp_type = HW_BREAKPOINT_W;
    attr.bp_addr = reinterpret_cast<uintptr_t>(&g_probe_buffer[static_cast<size_t>(i)]);
    attr.bp_len = HW_BREAKPOINT_LEN_8;
    attr.sample_period = 1;
    attr.disabled = 1;  // the kernel reserves the slot at creation, enabled or not
    attr.inherit = 0;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    const int fd =
        static_cast<int>(::syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd >= 0) {
      held.emplace_back(fd);
      continue;
    }
    const int err = errno;
    const std::string call = absl::StrCat("perf_event_open(disabled breakpoint ", i + 1, " of ",
                                          drmgr::kNumDebugRegisters, ", tid ", tid, ")");
    switch (err) {
      case ENOSPC:
        return static_cast<int>(held.size());  // `held` closes them all on return
      case ESRCH:
        return absl::NotFoundError(absl::StrCat("thread ", tid, " exited"));
      case EACCES:
      case EPERM:
        return core::SyscallError(
            err, call,
            absl::StrCat("counting the free debug registers of another process's thread ",
                         PerfPermissionAdvice()));
      case ENODEV:
      case ENOENT:
      case EOPNOTSUPP:
        return core::SyscallError(err, call, NoBreakpointSupportAdvice());
      default:
        return core::SyscallError(err, call);
    }
  }
  return static_cast<int>(held.size());
}

absl::StatusOr<std::vector<pid_t>> ProcessThreads(pid_t pid) {
  core::UniqueFd status(
      ::open(absl::StrCat("/proc/", pid, "/status").c_str(), O_RDONLY | O_CLOEXEC));
  if (!status.valid()) {
    const int err = errno;
    if (err == ENOENT || err == ESRCH) {
      return absl::NotFoundError(absl::StrCat("process ", pid, " does not exist (or has exited)"));
    }
    return core::SyscallError(err, absl::StrCat("open(/proc/", pid, "/status)"));
  }
  std::string text(4096, '\0');
  const ssize_t n = ::read(status.get(), text.data(), text.size());
  if (n > 0) {
    text.resize(static_cast<size_t>(n));
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      pid_t tgid = 0;
      if (absl::ConsumePrefix(&line, "Tgid:") &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &tgid) && tgid != pid) {
        return absl::InvalidArgumentError(
            absl::StrCat(pid, " is a thread of process ", tgid, ": give -p ", tgid));
      }
    }
  }
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
    }
    return core::SyscallError(err, absl::StrCat("opendir(", dir, ")"));
  }
  absl::Cleanup close_dir = [d] { ::closedir(d); };
  std::vector<pid_t> tids;
  while (const dirent* e = ::readdir(d)) {  // NOLINT(concurrency-mt-unsafe): own DIR*
    pid_t tid = 0;
    if (absl::SimpleAtoi(e->d_name, &tid) && tid > 0) {
      tids.push_back(tid);
    }
  }
  std::sort(tids.begin(), tids.end());
  if (tids.empty()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  return tids;
}

absl::StatusOr<ProcessSlots> ReadProcessSlots(pid_t pid,
                                              std::vector<drmgr::PublishedSlots> sessions,
                                              std::vector<std::string>& notes) {
  ProcessSlots p;
  p.pid = pid;
  KW_ASSIGN_OR_RETURN(const std::vector<pid_t> tids, ProcessThreads(pid));
  p.comm = ReadLine(absl::StrCat("/proc/", pid, "/comm"));
  p.sessions = std::move(sessions);
  for (const pid_t tid : tids) {
    absl::StatusOr<int> free = CountFreeSlots(tid);
    if (absl::IsNotFound(free.status())) {
      continue;  // the thread exited meanwhile
    }
    KW_RETURN_IF_ERROR(free.status());
    std::string comm = ReadLine(absl::StrCat("/proc/", pid, "/task/", tid, "/comm"));
    p.threads.push_back(drmgr::ComposeThreadSlots(pid, tid, *free, p.sessions, notes));
    p.threads.back().comm = std::move(comm);
  }
  if (p.threads.empty()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  p.not_in_hardware = drmgr::NotInHardware(pid, p.sessions);
  return p;
}

absl::StatusOr<SlotsView> ReadSlotsView(pid_t pid) {
  SlotsView view;
  KW_ASSIGN_OR_RETURN(std::vector<drmgr::PublishedSlots> published,
                      drmgr::ReadPublishedSlots(pid, &view.notes));
  std::map<pid_t, std::vector<drmgr::PublishedSlots>> by_target;
  for (drmgr::PublishedSlots& s : published) {
    if (s.target > 0) {
      by_target[s.target].push_back(std::move(s));
    } else if (pid == 0) {
      view.kernel.push_back(std::move(s));
    }
  }
  if (pid > 0) {
    KW_ASSIGN_OR_RETURN(ProcessSlots p,
                        ReadProcessSlots(pid, std::move(by_target[pid]), view.notes));
    view.processes.push_back(std::move(p));
    return view;
  }
  for (auto& [target, sessions] : by_target) {
    const pid_t kw = sessions.front().kwatch_pid;
    absl::StatusOr<ProcessSlots> p = ReadProcessSlots(target, std::move(sessions), view.notes);
    if (absl::IsNotFound(p.status())) {
      view.notes.push_back(
          absl::StrCat("process ", target, " (watched by kwatch ", kw, ") has exited"));
      continue;
    }
    KW_RETURN_IF_ERROR(p.status());
    view.processes.push_back(*std::move(p));
  }
  return view;
}

}  // namespace kwatch::watch
