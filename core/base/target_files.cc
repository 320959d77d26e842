#include "core/base/target_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/base/proc_status.h"
#include "core/base/syscall_status.h"

namespace kwatch::core {

absl::StatusOr<std::string> ExecutableLink(pid_t pid) {
  const std::string link = absl::StrCat("/proc/", pid, "/exe");
  std::array<char, 4096> buf{};
  const ssize_t n = ::readlink(link.c_str(), buf.data(), buf.size() - 1);
  if (n < 0) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("readlink(", link, ")"));
  }
  return std::string(buf.data(), static_cast<size_t>(n));
}

absl::StatusOr<std::string> OpenableExecutable(pid_t pid) {
  absl::StatusOr<std::string> path = ExecutableLink(pid);
  if (!path.ok()) {
    return path.status();
  }
  return ::access(path->c_str(), R_OK) == 0 ? *std::move(path)
                                            : absl::StrCat("/proc/", pid, "/exe");
}
namespace {

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

}  // namespace

bool SharesFilesystem(pid_t pid) {
  const std::string proc = absl::StrCat("/proc/", pid);
  // ns/mnt names the namespace by its inode; root is the directory the process sees as "/".
  return SameFile(proc + "/ns/mnt", "/proc/self/ns/mnt") && SameFile(proc + "/root", "/");
}

std::string PathInTarget(pid_t pid, const std::string& path) {
  if (path.empty() || path[0] != '/' || SharesFilesystem(pid)) {
    return path;
  }
  return absl::StrCat("/proc/", pid, "/root", path);
}

std::vector<std::string> TailsInTarget(pid_t pid, const std::string& path) {
  std::vector<std::string> out;
  const std::string root = absl::StrCat("/proc/", pid, "/root");
  for (size_t at = path.find('/', 1); at != std::string::npos && out.size() < 16;
       at = path.find('/', at + 1)) {
    out.push_back(root + path.substr(at));
  }
  return out;
}

std::vector<MappedFileCandidate> MappedFileCandidates(pid_t pid, bool shared,
                                                      const std::string& path, bool tails,
                                                      uint64_t start, uint64_t end) {
  using Kind = MappedFileCandidate::Kind;
  std::vector<MappedFileCandidate> out;
  if (!path.empty() && path[0] == '/' && !absl::EndsWith(path, " (deleted)")) {
    if (!shared) {
      out.push_back(
          {.path = absl::StrCat("/proc/", pid, "/root", path), .kind = Kind::kThroughRoot});
    }
    out.push_back({.path = path, .kind = Kind::kAsSeen});
    if (!shared && tails) {
      for (std::string& tail : TailsInTarget(pid, path)) {
        out.push_back({.path = std::move(tail), .kind = Kind::kTail});
      }
    }
  }
  if (end > start) {
    out.push_back({.path = absl::StrFormat("/proc/%d/map_files/%x-%x", pid, start, end),
                   .kind = Kind::kMapping});
  }
  return out;
}

std::string MappedFilePath(pid_t pid, const std::string& path, uint64_t inode, uint64_t start,
                           uint64_t end) {
  for (const MappedFileCandidate& c :
       MappedFileCandidates(pid, SharesFilesystem(pid), path, /*tails=*/true, start, end)) {
    struct stat st {};
    const bool same_file = c.kind == MappedFileCandidate::Kind::kMapping ||
                           (::stat(c.path.c_str(), &st) == 0 && st.st_ino == inode);
    if (same_file && ::access(c.path.c_str(), R_OK) == 0) {
      return c.path;
    }
  }
  return "";
}

bool TargetSeesOwnFile(pid_t pid, const std::string& path) {
  return SharesFilesystem(pid) || SameFile(PathInTarget(pid, path), path);
}

std::vector<pid_t> NamespacePids(pid_t pid) {
  std::vector<pid_t> out;
  for (absl::string_view field :
       absl::StrSplit(ProcStatusFieldOf(pid, "NSpid"), absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
    pid_t id = 0;
    if (absl::SimpleAtoi(field, &id)) {
      out.push_back(id);
    }
  }
  return out;
}

pid_t OwnPid(pid_t pid) {
  const std::vector<pid_t> ids = NamespacePids(pid);
  return ids.size() > 1 ? ids.back() : pid;
}

std::string PidText(pid_t pid) {
  const pid_t own = OwnPid(pid);
  return own == pid ? absl::StrCat("pid ", pid)
                    : absl::StrCat("pid ", pid, " (", own, " in its namespace)");
}

NamespaceIds::NamespaceIds(pid_t pid) : pid_(pid) {
  const std::vector<pid_t> ids = NamespacePids(pid);
  identity_ = ids.size() <= 1;
  if (!identity_) {
    host_[ids.back()] = pid;  // known for good, even once the process is gone
  }
}

pid_t NamespaceIds::Learn(pid_t own) {
  // Every thread of the process and of its descendants: own id -> kwatch's. Ids learnt
  // before stay (their threads may be gone; the agent's rings still hold their hits).
  std::vector<pid_t> processes = {pid_};
  for (size_t i = 0; i < processes.size() && i < 4096; ++i) {
    const std::string task_dir = absl::StrCat("/proc/", processes[i], "/task");
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(task_dir, ec)) {
      const std::string tid_name = e.path().filename().string();
      pid_t tid = 0;
      if (!absl::SimpleAtoi(tid_name, &tid)) {
        continue;
      }
      const std::vector<pid_t> ids = NamespacePids(tid);
      if (ids.size() > 1) {
        host_[ids.back()] = tid;
      }
      std::ifstream children(absl::StrCat(task_dir, "/", tid_name, "/children"));
      pid_t child = 0;
      while (children >> child) {
        processes.push_back(child);
      }
    }
  }
  auto it = host_.find(own);
  if (it == host_.end()) {
    host_[own] = own;  // gone, or never there: not looked for again until another id is new
    return own;
  }
  return it->second;
}

}  // namespace kwatch::core
