#pragma once

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/base/syscall_status.h"

namespace kwatch::testing {

// A small tmpfs, mounted in a private mount namespace of this (single-threaded) test process,
// for filling a filesystem for real. Every process the test starts afterwards inherits the
// namespace and sees the mount; nothing outside the test process does, and the mount goes
// away with the namespace. Unmounts and removes its directory on destruction.
class PrivateTmpfs {
 public:
  // Errors carry the failing call and errno (EPERM: needs root, CAP_SYS_ADMIN).
  static absl::StatusOr<std::unique_ptr<PrivateTmpfs>> Mount(uint64_t bytes) {
    if (::unshare(CLONE_NEWNS) != 0) {
      const int err = errno;
      return core::SyscallError(err, "unshare(CLONE_NEWNS)",
                                "a private mount namespace needs root (CAP_SYS_ADMIN)");
    }
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      const int err = errno;
      return core::SyscallError(err, "mount(/, MS_REC|MS_PRIVATE)");
    }
    std::string dir = "/tmp/kwatch_tmpfs_XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) {
      const int err = errno;
      return core::SyscallError(err, "mkdtemp(/tmp/kwatch_tmpfs_XXXXXX)");
    }
    const std::string opts = absl::StrCat("size=", bytes, ",mode=0700");
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      const int err = errno;
      ::rmdir(dir.c_str());
      return core::SyscallError(err, absl::StrCat("mount(tmpfs, ", dir, ", ", opts, ")"));
    }
    return std::unique_ptr<PrivateTmpfs>(new PrivateTmpfs(std::move(dir)));
  }

  ~PrivateTmpfs() {
    ::umount2(dir_.c_str(), MNT_DETACH);
    ::rmdir(dir_.c_str());
  }
  PrivateTmpfs(const PrivateTmpfs&) = delete;
  PrivateTmpfs& operator=(const PrivateTmpfs&) = delete;

  const std::string& dir() const { return dir_; }
  std::string File(const std::string& name) const { return dir_ + "/" + name; }

 private:
  explicit PrivateTmpfs(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace kwatch::testing
