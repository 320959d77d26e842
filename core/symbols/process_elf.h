#pragma once

#include <elfutils/libdwfl.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "core/base/unique_fd.h"

namespace kwatch::core::symbols {

// Finds the ELF file of each module of a live process for libdwfl, as the process maps it,
// in whatever filesystem it runs (a container's mount namespace, a chroot): the path from
// its maps, reached through /proc/PID/root when the process does not share kwatch's
// filesystem (core/base/target_files.h), then the path as kwatch sees it, then the mapping
// itself (/proc/PID/map_files/, which needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE). A file
// is taken only when its GNU build-id is the one in the mapped image (read from the process's
// memory), so another file at the same path (the host's libc.so.6, a rebuilt binary) is
// never silently used for the one the process runs; why each candidate was refused is kept,
// for the messages that list modules. Deleted files and the vdso go to libdwfl's own finder
// (from memory) when the mapping cannot be opened.
//
// Also looks for separate debug files under the target's root (/proc/PID/root/usr/lib/debug)
// before kwatch's own /usr/lib/debug.
class ProcessElfFinder {
 public:
  explicit ProcessElfFinder(pid_t pid);
  ProcessElfFinder(const ProcessElfFinder&) = delete;
  ProcessElfFinder& operator=(const ProcessElfFinder&) = delete;
  ~ProcessElfFinder() = default;

  // For dwfl_begin. The finder must outlive the Dwfl.
  const Dwfl_Callbacks* callbacks() const { return &callbacks_; }

  // After dwfl_report_end, before any module's ELF is asked for: every module of `dwfl`
  // finds its file through this finder.
  void Adopt(Dwfl* dwfl);

  // Why `mod` has no ELF file: each path tried and why it was refused; "" when its file was
  // found or not looked for yet.
  std::string Problem(Dwfl_Module* mod) const;

 private:
  static int FindElf(Dwfl_Module* mod, void** userdata, const char* name, Dwarf_Addr base,
                     char** file_name, Elf** elfp);
  int Find(Dwfl_Module* mod, void** userdata, const char* name, Dwarf_Addr base, char** file_name,
           Elf** elfp);
  // The GNU build-id of the ELF image mapped at `base`, read from the process's memory; ""
  // when there is none or it cannot be read.
  std::string MappedBuildId(uint64_t base) const;

  pid_t pid_;
  bool shared_;  // the process sees kwatch's filesystem
  UniqueFd mem_;
  absl::flat_hash_map<uint64_t, uint64_t> mapping_end_;  // file mappings: start -> end
  std::string debuginfo_path_;
  char* debuginfo_path_c_ = nullptr;
  Dwfl_Callbacks callbacks_{};
  absl::flat_hash_map<Dwfl_Module*, std::string> problems_;
};

}  // namespace kwatch::core::symbols
