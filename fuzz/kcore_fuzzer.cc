// Kernel core files (core/kernel/kernel_memory.h): the input is an ELF core file in a memfd,
// opened as kernel watches open /proc/kcore (or --kcore FILE), then read the way they read a
// watch's value: 1, 2, 4 and 8 bytes at the edges of every segment, and at addresses taken
// from the input. Errors are fine; crashes, sanitizer reports and a read that succeeds
// outside every segment are bugs.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "core/kernel/kernel_memory.h"
#include "fuzz/fuzz_util.h"

namespace {

using kwatch::core::kernel::KernelMemory;
using kwatch::core::kernel::KernelMemorySegment;

// Whether [addr, addr + len) lies in the segments, byte by byte (the reader's contract).
bool Mapped(const KernelMemory& mem, uint64_t addr, size_t len) {
  for (size_t i = 0; i < len; ++i) {
    bool in = false;
    for (const KernelMemorySegment& s : mem.segments()) {
      in = in || (addr + i >= s.vaddr && addr + i - s.vaddr < s.filesz);
    }
    if (!in) {
      return false;
    }
  }
  return true;
}

void ReadAt(const KernelMemory& mem, uint64_t addr) {
  std::array<uint8_t, 8> buf{};
  for (const size_t len : {1, 2, 4, 8}) {
    const absl::Status st = mem.Read(addr, std::span<uint8_t>(buf).first(len));
    if (st.ok() && !Mapped(mem, addr, len)) {
      std::abort();  // a value from no segment
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kwatch::fuzz::MemFile file(data, size);
  auto mem = KernelMemory::Open(file.path());
  if (!mem.ok()) {
    return 0;
  }
  size_t n = 0;
  for (const KernelMemorySegment& s : (*mem)->segments()) {
    if (++n > 64) {
      break;
    }
    for (const uint64_t addr : {s.vaddr, s.vaddr - 1, s.vaddr + s.filesz - 1, s.vaddr + s.filesz,
                                s.vaddr + s.filesz - 4}) {
      ReadAt(**mem, addr);
    }
  }
  for (size_t at = 0; at + 8 <= size && at < 256; at += 8) {
    uint64_t addr = 0;
    std::memcpy(&addr, data + at, sizeof(addr));
    ReadAt(**mem, addr);
  }
  return 0;
}
