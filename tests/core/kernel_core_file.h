// Fixture kernel core files (the format of /proc/kcore) for the KernelMemory tests and the
// kernel-watch CLI tests. Written byte by byte from <elf.h>'s structures, independently of the
// libelf reading them.
#pragma once

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kwatch::testing {

// One PT_LOAD segment: `bytes` at kernel virtual address `vaddr`.
struct CoreSegment {
  uint64_t vaddr = 0;
  std::vector<uint8_t> bytes;
};

// An ELF64 little-endian x86-64 core file (ET_CORE) laid out as /proc/kcore is: the ELF
// header, a PT_NOTE (empty here) and one PT_LOAD per segment, then each segment's bytes at a
// page-aligned offset, in order.
inline std::string KernelCoreImage(const std::vector<CoreSegment>& segments) {
  constexpr uint64_t kPage = 4096;
  const size_t phnum = segments.size() + 1;
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_ident[EI_OSABI] = ELFOSABI_NONE;
  eh.e_type = ET_CORE;
  eh.e_machine = EM_X86_64;
  eh.e_version = EV_CURRENT;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = static_cast<Elf64_Half>(phnum);
  std::vector<Elf64_Phdr> ph(phnum);
  ph[0].p_type = PT_NOTE;
  ph[0].p_offset = sizeof(Elf64_Ehdr) + phnum * sizeof(Elf64_Phdr);
  uint64_t offset = kPage;
  for (size_t i = 0; i < segments.size(); ++i) {
    Elf64_Phdr& p = ph[i + 1];
    p.p_type = PT_LOAD;
    p.p_flags = PF_R | PF_W | PF_X;
    p.p_offset = offset;
    p.p_vaddr = segments[i].vaddr;
    p.p_paddr = UINT64_MAX;  // as /proc/kcore: no physical address for vmalloc'd memory
    p.p_filesz = segments[i].bytes.size();
    p.p_memsz = segments[i].bytes.size();
    p.p_align = kPage;
    offset += (segments[i].bytes.size() + kPage - 1) / kPage * kPage;
  }
  std::string out(offset, '\0');
  std::memcpy(out.data(), &eh, sizeof(eh));
  std::memcpy(out.data() + sizeof(eh), ph.data(), ph.size() * sizeof(Elf64_Phdr));
  for (size_t i = 0; i < segments.size(); ++i) {
    std::memcpy(out.data() + ph[i + 1].p_offset, segments[i].bytes.data(),
                segments[i].bytes.size());
  }
  return out;
}

// `n` bytes whose byte i is (seed + i * 7) mod 256: every byte of a segment tells where it is.
inline std::vector<uint8_t> PatternBytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<uint8_t>(seed + i * 7);
  }
  return out;
}

}  // namespace kwatch::testing
