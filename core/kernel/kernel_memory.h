#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"

namespace kwatch::core::kernel {

// One PT_LOAD program header of a kernel core file: the kernel virtual addresses
// [vaddr, vaddr + filesz) are the file's bytes at [offset, offset + filesz).
struct KernelMemorySegment {
  uint64_t vaddr = 0;   // absolute kernel virtual address
  uint64_t offset = 0;  // file offset of vaddr's byte
  uint64_t filesz = 0;  // bytes held by the file (p_filesz)
};

// Kernel memory read from an ELF core file whose PT_LOAD segments map kernel virtual
// addresses to file offsets: /proc/kcore of the running kernel (CONFIG_PROC_KCORE; opening it
// needs CAP_SYS_RAWIO and is refused under kernel lockdown), or a crash dump in the same
// format (/proc/vmcore, makedumpfile's ELF output). The program headers are read once with
// libelf at Open; the bytes are read with pread(2) at each Read, so /proc/kcore gives the
// memory as it is at that moment.
//
// Owns the file descriptor for its lifetime. Immutable after Open; Read is thread-safe.
class KernelMemory {
 public:
  // Opens `path` and reads its program headers. Errors name the file and the call:
  //  NotFound / PermissionDenied: open(2)'s errno (the caller turns it into advice);
  //  InvalidArgument: not an ELF file, not a core file (ET_CORE), unreadable program headers
  //   (a truncated file), a segment whose addresses or offsets overflow, or no PT_LOAD
  //   segment with bytes in the file.
  static absl::StatusOr<std::unique_ptr<KernelMemory>> Open(
      const std::string& path = "/proc/kcore");

  // Reads out.size() bytes of kernel memory at `addr` (absolute), across adjacent segments
  // when a read spans them. NotFound when a byte of the range lies in no segment: the message
  // gives that address and the file. DataLoss when the file ends before a segment's bytes
  // (a truncated file); pread(2)'s errno otherwise. On error `out` holds unspecified bytes.
  absl::Status Read(uint64_t addr, std::span<uint8_t> out) const;

  const std::string& path() const { return path_; }
  // PT_LOAD segments with bytes in the file, in file order.
  const std::vector<KernelMemorySegment>& segments() const { return segments_; }

 private:
  KernelMemory(UniqueFd fd, std::string path, std::vector<KernelMemorySegment> segments)
      : fd_(std::move(fd)), path_(std::move(path)), segments_(std::move(segments)) {}

  // The first segment holding `addr`; nullptr when none does.
  const KernelMemorySegment* SegmentAt(uint64_t addr) const;

  UniqueFd fd_;
  std::string path_;
  std::vector<KernelMemorySegment> segments_;
};

}  // namespace kwatch::core::kernel
