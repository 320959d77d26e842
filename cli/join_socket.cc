#include "cli/join_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/base/proc_status.h"
#include "core/base/syscall_status.h"

namespace kwatch::cli {

namespace {

std::string JoinSocketDir(uid_t uid) {
  const std::string run = absl::StrCat("/run/user/", uid);
  struct stat st {};
  if (::stat(run.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid) {
    return absl::StrCat(run, "/kwatch");
  }
  return absl::StrCat("/tmp/kwatch-", uid);
}

absl::StatusOr<sockaddr_un> AddressOf(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// The directory of the sockets: made 0700 if missing; refused unless it is a directory of ours
// that nobody else can enter (someone else's /tmp/kwatch-UID would let them replace sockets).
absl::Status PrivateDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("mkdir ", dir));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("lstat ", dir));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        dir, " is not a directory of uid ", ::geteuid(), " closed to others (mode 0700)",
        "; remove it so that kwatch can make its control sockets there"));
  }
  return absl::OkStatus();
}

// Removes the sockets of `dir` left by sessions that were killed, over processes that are gone
// (PID.sock whose PID no longer exists): a live target's socket is left to the session that
// replaces it (a listener racing to bind one must not lose it).
void RemoveStaleSockets(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    pid_t pid = 0;
    if (!absl::EndsWith(name, ".sock") ||
        !absl::SimpleAtoi(name.substr(0, name.size() - 5), &pid) || pid <= 0) {
      continue;
    }
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      (void)::unlink(entry.path().c_str());
    }
  }
}

// The arguments of process `pid` (/proc/PID/cmdline).
std::vector<std::string> ArgsOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"), std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) {
    args.push_back(arg);
  }
  return args;
}

// Whether kwatch `pid` runs `kwatch probe` (its second argument).
bool IsProbeSession(pid_t pid) {
  const std::vector<std::string> args = ArgsOf(pid);
  return args.size() > 1 && args[1] == "probe";
}

// The --arm-at SPEC of kwatch `pid` (its session starts when a thread runs SPEC), or "".
std::string ArmAtOf(pid_t pid) {
  const std::vector<std::string> args = ArgsOf(pid);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "--arm-at" && i + 1 < args.size()) {
      return args[i + 1];
    }
    if (absl::StartsWith(args[i], "--arm-at=")) {
      return args[i].substr(9);
    }
  }
  return {};
}

}  // namespace

std::string JoinSocketPath(uid_t uid, pid_t target) {
  return absl::StrCat(JoinSocketDir(uid), "/", target, ".sock");
}

std::optional<KwatchTracer> TracingKwatch(pid_t pid) {
  int tracer = 0;
  if (!absl::SimpleAtoi(core::ProcStatusFieldOf(pid, "TracerPid"), &tracer) || tracer <= 0) {
    return std::nullopt;
  }
  if (core::ProcStatusFieldOf(tracer, "Name") != "kwatch") {
    return std::nullopt;
  }
  // Uid: real, effective, saved, filesystem; the socket is the effective uid's.
  const std::vector<std::string> uids = absl::StrSplit(core::ProcStatusFieldOf(tracer, "Uid"),
                                                       absl::ByAnyChar(" \t"), absl::SkipEmpty());
  uid_t uid = 0;
  if (uids.size() < 2 || !absl::SimpleAtoi(uids[1], &uid)) {
    return std::nullopt;
  }
  return KwatchTracer{tracer, uid};
}

absl::StatusOr<core::UniqueFd> ListenJoinSocket(pid_t target, std::string* path) {
  const std::string dir = JoinSocketDir(::geteuid());
  if (!absl::StartsWith(dir, "/run/user/")) {
    if (absl::Status s = PrivateDir(dir); !s.ok()) {
      return s;
    }
  } else if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("mkdir ", dir));
  }
  RemoveStaleSockets(dir);
  *path = absl::StrCat(dir, "/", target, ".sock");
  absl::StatusOr<sockaddr_un> addr = AddressOf(*path);
  if (!addr.ok()) {
    return addr.status();
  }
  core::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    const int err = errno;
    return core::SyscallError(err, "socket(AF_UNIX)");
  }
  // A socket left by a session that ended (killed) is replaced; a live one is refused.
  if (::access(path->c_str(), F_OK) == 0) {
    core::UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.valid() &&
        ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("another kwatch session listens on ", *path, " for pid ", target));
    }
    (void)::unlink(path->c_str());
  }
  const mode_t old_mask = ::umask(0177);  // the socket is made 0600
  const int rc = ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr));
  const int bind_err = errno;
  ::umask(old_mask);
  if (rc != 0) {
    return core::SyscallError(bind_err, absl::StrCat("bind ", *path));
  }
  if (::chmod(path->c_str(), 0600) != 0 || ::listen(fd.get(), 8) != 0) {
    const int err = errno;
    (void)::unlink(path->c_str());
    return core::SyscallError(err, absl::StrCat("listen ", *path));
  }
  return fd;
}

absl::StatusOr<core::UniqueFd> ConnectJoinSocket(const KwatchTracer& tracer, pid_t target) {
  const std::string path = JoinSocketPath(tracer.uid, target);
  absl::StatusOr<sockaddr_un> addr = AddressOf(path);
  if (!addr.ok()) {
    return addr.status();
  }
  core::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    const int err = errno;
    return core::SyscallError(err, "socket(AF_UNIX)");
  }
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    const int err = errno;
    std::string advice;
    if (err == EACCES || err == EPERM) {
      advice = absl::StrCat("the session belongs to uid ", tracer.uid, " and this is uid ",
                            ::geteuid(), ": only its own user may join it");
    } else if ((err == ENOENT || err == ECONNREFUSED) && IsProbeSession(tracer.pid)) {
      advice = absl::StrCat(
          "kwatch pid ", tracer.pid,
          " is a `kwatch probe` session (its ptrace backend), which takes no joiners yet; end it "
          "first, or start the watch session first and let `kwatch probe` join it (or use "
          "`kwatch probe` with its default agent backend, which leaves the process untraced)");
    } else if (const std::string at = ArmAtOf(tracer.pid);
               (err == ENOENT || err == ECONNREFUSED) && !at.empty()) {
      advice = absl::StrCat("kwatch pid ", tracer.pid, " waits for a thread to run --arm-at ", at,
                            ": its session, and the control socket joiners use, start there; "
                            "join once it says that its watches are armed");
    } else if (err == ENOENT || err == ECONNREFUSED) {
      advice = absl::StrCat("kwatch pid ", tracer.pid,
                            " has no control socket for it (a kwatch without joining, or one "
                            "that is ending); end it first, or run the watches in it");
    }
    return core::SyscallError(err,
                              absl::StrCat("joining the kwatch session (pid ", tracer.pid,
                                           ") that traces pid ", target, ": connect ", path),
                              advice);
  }
  return fd;
}

absl::StatusOr<uid_t> PeerUid(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    const int err = errno;
    return core::SyscallError(err, "getsockopt(SO_PEERCRED)");
  }
  return cred.uid;
}

absl::Status SendFrame(int fd, char channel, absl::string_view payload) {
  std::string frame(5, '\0');
  frame[0] = channel;
  const auto n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) {
    frame[1 + i] = static_cast<char>((n >> (8 * i)) & 0xff);
  }
  frame.append(payload.data(), payload.size());
  return SendAll(fd, frame);
}

absl::Status SendAll(int fd, absl::string_view bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t w = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (w < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return core::SyscallError(err, "send (kwatch control socket)");
    }
    off += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

std::optional<JoinFrame> TakeFrame(std::string& buf) {
  if (buf.size() < 5) {
    return std::nullopt;
  }
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) {
    n |= static_cast<uint32_t>(static_cast<unsigned char>(buf[1 + i])) << (8 * i);
  }
  if (buf.size() < 5 + static_cast<size_t>(n)) {
    return std::nullopt;
  }
  JoinFrame f{buf[0], buf.substr(5, n)};
  buf.erase(0, 5 + static_cast<size_t>(n));
  return f;
}

}  // namespace kwatch::cli
