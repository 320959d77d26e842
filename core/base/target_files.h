#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kwatch::core {

// The files of a process in another mount namespace or under another root (a container, a
// chroot): /proc/PID/maps and /proc/PID/exe name them by their path in the target's
// filesystem, which kwatch's own may not have, or have with other contents (the host's
// libc.so.6 is not the container's). Such files are reached through /proc/PID/root.

// What /proc/PID/exe names (the program `pid` runs, by its path in its own filesystem).
// Errors: readlink's, as "readlink(/proc/PID/exe): <errno text>" with the errno's code.
absl::StatusOr<std::string> ExecutableLink(pid_t pid);

// A path kwatch can open the program of `pid` by: what /proc/PID/exe names when kwatch can read
// it, else the link itself (a deleted or replaced program, another filesystem). Errors: as
// ExecutableLink's.
absl::StatusOr<std::string> OpenableExecutable(pid_t pid);

// True when `pid` sees the filesystem kwatch sees: the same mount namespace and the same
// root directory. False also when that cannot be told (the process is gone).
bool SharesFilesystem(pid_t pid);

// The path under which kwatch opens the file `pid` names `path`: `path` itself when the two
// share their filesystem (or `path` is not absolute: "[vdso]", "" ...), else
// "/proc/PID/root" + `path`. The caller checks that what it opened is what the target maps
// (core/symbols/process_elf.h does, by build-id).
std::string PathInTarget(pid_t pid, const std::string& path);

// The paths under /proc/PID/root of `path`'s tails ("/mnt/ctr/usr/bin/app": .../root/ctr/usr/
// bin/app, .../root/usr/bin/app, .../root/bin/app, .../root/app): maps and /proc/PID/exe name a
// file of a chroot'ed process (a container) by its path from the root of its mount namespace,
// which its own root is below. Candidates only: check what they open.
std::vector<std::string> TailsInTarget(pid_t pid, const std::string& path);

// Where kwatch may open the file `pid` maps at [start, end) from `path` (a line of its maps),
// in order: through its root (when `pid` does not share kwatch's filesystem: `shared`
// false), as kwatch sees it, with `tails` the tails of the path under its root (a chroot's
// files: TailsInTarget; for a caller that checks what it opens), and the mapping itself
// (/proc/PID/map_files/START-END, when end > start). A deleted file (" (deleted)") has only
// the mapping. Candidates only: the caller checks what each opens.
struct MappedFileCandidate {
  enum class Kind : uint8_t { kThroughRoot, kAsSeen, kTail, kMapping };
  std::string path;
  Kind kind = Kind::kAsSeen;
};
std::vector<MappedFileCandidate> MappedFileCandidates(pid_t pid, bool shared,
                                                      const std::string& path, bool tails,
                                                      uint64_t start, uint64_t end);

// A path under which kwatch can open the file `pid` maps at [start, end) from `path` with
// inode `inode` (a line of its maps): PathInTarget, else `path` as kwatch sees it, when that
// file has that inode; else the mapping itself, /proc/PID/map_files/START-END (which needs
// CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE). "" when none opens.
std::string MappedFilePath(pid_t pid, const std::string& path, uint64_t inode, uint64_t start,
                           uint64_t end);

// True when `pid` reaches, at `path`, the very file kwatch has at `path` (same device and
// inode): a library kwatch asks it to load by name.
bool TargetSeesOwnFile(pid_t pid, const std::string& path);

// The ids of `pid` in each pid namespace it is in, outermost (kwatch's, when kwatch runs in
// the initial namespace) first: NSpid in /proc/PID/status. One id when the process is in
// kwatch's pid namespace; empty when the process is gone.
std::vector<pid_t> NamespacePids(pid_t pid);

// The id the process knows itself by (getpid() inside its namespace): the last of
// NamespacePids, or `pid` when it has only one or it is gone.
pid_t OwnPid(pid_t pid);

// "pid 7545", or "pid 7545 (1 in its namespace)" for a process in another pid namespace.
std::string PidText(pid_t pid);

// JSON's "ns_pid": `,"ns_pid":N` for a process in another pid namespace, "" otherwise; each
// pid's read from /proc once. Not thread-safe.
class NsPidField {
 public:
  const std::string& Of(pid_t pid) {
    auto [it, added] = text_.try_emplace(pid);
    if (added) {
      const pid_t own = OwnPid(pid);
      if (own != pid) {
        it->second = ",\"ns_pid\":" + std::to_string(own);
      }
    }
    return it->second;
  }

 private:
  absl::flat_hash_map<pid_t, std::string> text_;
};

// Turns the ids a process and its descendants know themselves by (their pid namespace's:
// what getpid and gettid return inside a container) into kwatch's. The identity when the
// process is in kwatch's pid namespace. Learns the ids from NSpid in /proc/PID/task/TID/status
// of the process and its descendants, again whenever an id is not known yet: an id that
// belongs to no live thread and was never seen (a thread that came and went between two
// looks) is returned as given. Not thread-safe.
class NamespaceIds {
 public:
  explicit NamespaceIds(pid_t pid);

  bool identity() const { return identity_; }
  // kwatch's id of the thread (or process) the target's namespace calls `own`.
  pid_t Host(pid_t own) {
    if (identity_ || own <= 0) {
      return own;
    }
    auto it = host_.find(own);
    return it != host_.end() ? it->second : Learn(own);
  }

 private:
  pid_t Learn(pid_t own);

  pid_t pid_;
  bool identity_ = true;
  absl::flat_hash_map<pid_t, pid_t> host_;
};

}  // namespace kwatch::core
