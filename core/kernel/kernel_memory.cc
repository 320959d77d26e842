#include "core/kernel/kernel_memory.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/syscall_status.h"

namespace kwatch::core::kernel {

namespace {

struct ElfDeleter {
  void operator()(Elf* e) const { elf_end(e); }
};

std::string ElfError(absl::string_view call) {
  return absl::StrCat(call, ": ", elf_errmsg(-1));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelMemory>> KernelMemory::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("open(", path, ")"));
  }
  elf_version(EV_CURRENT);
  // ELF_C_READ reads the headers with pread: /proc/kcore cannot be mapped, and its size is
  // the kernel's whole address space.
  const std::unique_ptr<Elf, ElfDeleter> elf(elf_begin(fd.get(), ELF_C_READ, nullptr));
  if (elf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", ElfError("elf_begin")));
  }
  if (elf_kind(elf.get()) != ELF_K_ELF) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an ELF file"));
  }
  GElf_Ehdr ehdr{};
  if (gelf_getehdr(elf.get(), &ehdr) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", ElfError("gelf_getehdr")));
  }
  if (ehdr.e_type != ET_CORE) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: an ELF file of type %d, not a core file (ET_CORE, as /proc/kcore)",
                        path, ehdr.e_type));
  }
  size_t phnum = 0;
  if (elf_getphdrnum(elf.get(), &phnum) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", ElfError("elf_getphdrnum")));
  }
  // libelf counts only the program headers that fit in the file.
  if (ehdr.e_phnum != PN_XNUM && phnum < ehdr.e_phnum) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: truncated: its ELF header declares %d program headers at offset %d, and the file "
        "holds %d of them",
        path, ehdr.e_phnum, ehdr.e_phoff, phnum));
  }
  std::vector<KernelMemorySegment> segments;
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph{};
    if (gelf_getphdr(elf.get(), static_cast<int>(i), &ph) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": program header ", i, ": ", ElfError("gelf_getphdr")));
    }
    if (ph.p_type != PT_LOAD || ph.p_filesz == 0) {
      continue;
    }
    constexpr uint64_t kMaxOffset = std::numeric_limits<off_t>::max();
    // A segment may end at the very top of the address space, not beyond.
    if (ph.p_filesz - 1 > std::numeric_limits<uint64_t>::max() - ph.p_vaddr ||
        ph.p_offset > kMaxOffset || ph.p_filesz > kMaxOffset - ph.p_offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: program header %d: PT_LOAD of 0x%x bytes at 0x%x (file offset 0x%x) overflows", path,
          i, ph.p_filesz, ph.p_vaddr, ph.p_offset));
    }
    segments.push_back({ph.p_vaddr, ph.p_offset, ph.p_filesz});
  }
  if (segments.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: no PT_LOAD segment with bytes in the file (%d program header%s)", path,
                        phnum, phnum == 1 ? "" : "s"));
  }
  return std::unique_ptr<KernelMemory>(new KernelMemory(std::move(fd), path, std::move(segments)));
}

const KernelMemorySegment* KernelMemory::SegmentAt(uint64_t addr) const {
  for (const KernelMemorySegment& s : segments_) {
    if (addr >= s.vaddr && addr - s.vaddr < s.filesz) {
      return &s;
    }
  }
  return nullptr;
}

absl::Status KernelMemory::Read(uint64_t addr, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const uint64_t at = addr + done;
    const KernelMemorySegment* s = SegmentAt(at);
    if (s == nullptr) {
      return absl::NotFoundError(
          done == 0 ? absl::StrFormat("%s maps no kernel address 0x%x (in none of its %d PT_LOAD "
                                      "segments)",
                                      path_, at, segments_.size())
                    : absl::StrFormat("%s maps no kernel address 0x%x (reading %d bytes at 0x%x: "
                                      "in none of its %d PT_LOAD segments)",
                                      path_, at, out.size(), addr, segments_.size()));
    }
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(out.size() - done, s->filesz - (at - s->vaddr)));
    const uint64_t offset = s->offset + (at - s->vaddr);
    const ssize_t got = ::pread(fd_.get(), out.data() + done, n, static_cast<off_t>(offset));
    if (got < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return SyscallError(err, absl::StrFormat("pread(%s, %d bytes at offset 0x%x, kernel "
                                               "address 0x%x)",
                                               path_, n, offset, at));
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrFormat(
          "%s ends before offset 0x%x, where its PT_LOAD segment of 0x%x bytes at 0x%x keeps "
          "kernel address 0x%x: the file is truncated",
          path_, offset, s->filesz, s->vaddr, at));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::kernel
