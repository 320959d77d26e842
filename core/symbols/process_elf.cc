#include "core/symbols/process_elf.h"

#include <elf.h>
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <libelf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/syscall_status.h"
#include "core/base/target_files.h"

namespace kwatch::core::symbols {
namespace {

constexpr uint64_t kPage = 4096;
constexpr absl::string_view kDeleted = " (deleted)";

std::string Hex(const void* bytes, size_t n) {
  return absl::BytesToHexString(absl::string_view(static_cast<const char*>(bytes), n));
}

// "1a2b3c4d…": enough of a build-id to tell two apart in a message.
std::string Short(const std::string& id) {
  return id.size() > 12 ? absl::StrCat(id.substr(0, 12), "…") : id;
}

bool ReadAt(int fd, uint64_t addr, void* out, size_t n) {
  return ::pread(fd, out, n, static_cast<off_t>(addr)) == static_cast<ssize_t>(n);
}

// The GNU build-id in `notes` (a PT_NOTE segment's bytes), "" if none.
std::string BuildIdNote(const std::vector<uint8_t>& notes) {
  size_t at = 0;
  while (at + sizeof(Elf64_Nhdr) <= notes.size()) {
    Elf64_Nhdr nh{};
    std::memcpy(&nh, notes.data() + at, sizeof(nh));
    const size_t name_at = at + sizeof(nh);
    const size_t desc_at = name_at + ((nh.n_namesz + 3) & ~size_t{3});
    const size_t next = desc_at + ((nh.n_descsz + 3) & ~size_t{3});
    if (next > notes.size() || next <= at) {
      break;
    }
    if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
        std::memcmp(notes.data() + name_at, "GNU", 4) == 0) {
      return Hex(notes.data() + desc_at, nh.n_descsz);
    }
    at = next;
  }
  return "";
}

}  // namespace

ProcessElfFinder::ProcessElfFinder(pid_t pid)
    : pid_(pid),
      shared_(SharesFilesystem(pid)),
      mem_(::open(absl::StrCat("/proc/", pid, "/mem").c_str(), O_RDONLY | O_CLOEXEC)) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  while (std::getline(maps, line)) {
    const std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (f.size() < 6 || f[5].empty() || f[5][0] != '/') {
      continue;
    }
    const std::vector<absl::string_view> range = absl::StrSplit(f[0], '-');
    uint64_t start = 0;
    uint64_t end = 0;
    if (range.size() == 2 && absl::SimpleHexAtoi(range[0], &start) &&
        absl::SimpleHexAtoi(range[1], &end)) {
      mapping_end_.emplace(start, end);
    }
  }
  callbacks_.find_elf = &ProcessElfFinder::FindElf;
  callbacks_.find_debuginfo = dwfl_standard_find_debuginfo;
  callbacks_.section_address = nullptr;
  callbacks_.debuginfo_path = nullptr;  // libdwfl's default: ":.debug:/usr/lib/debug"
  if (!shared_) {
    debuginfo_path_ = absl::StrCat(":.debug:/proc/", pid, "/root/usr/lib/debug:/usr/lib/debug");
    debuginfo_path_c_ = debuginfo_path_.data();
    callbacks_.debuginfo_path = &debuginfo_path_c_;
  }
}

void ProcessElfFinder::Adopt(Dwfl* dwfl) {
  dwfl_getmodules(
      dwfl,
      [](Dwfl_Module* /*mod*/, void** userdata, const char* /*name*/, Dwarf_Addr /*start*/,
         void* arg) -> int {
        *userdata = arg;
        return DWARF_CB_OK;
      },
      this, 0);
}

std::string ProcessElfFinder::Problem(Dwfl_Module* mod) const {
  auto it = problems_.find(mod);
  return it == problems_.end() ? "" : it->second;
}

int ProcessElfFinder::FindElf(Dwfl_Module* mod, void** userdata, const char* name, Dwarf_Addr base,
                              char** file_name, Elf** elfp) {
  if (userdata == nullptr || *userdata == nullptr) {
    return dwfl_linux_proc_find_elf(mod, userdata, name, base, file_name, elfp);
  }
  return static_cast<ProcessElfFinder*>(*userdata)->Find(mod, userdata, name, base, file_name,
                                                         elfp);
}

std::string ProcessElfFinder::MappedBuildId(uint64_t base) const {
  if (!mem_.valid()) {
    return "";
  }
  Elf64_Ehdr eh{};
  if (!ReadAt(mem_.get(), base, &eh, sizeof(eh)) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr) ||
      eh.e_phnum > 256) {
    return "";
  }
  std::vector<Elf64_Phdr> phdrs(eh.e_phnum);
  if (!ReadAt(mem_.get(), base + eh.e_phoff, phdrs.data(), phdrs.size() * sizeof(Elf64_Phdr))) {
    return "";
  }
  std::optional<uint64_t> bias;
  for (const Elf64_Phdr& ph : phdrs) {
    if (ph.p_type == PT_LOAD) {
      // The mapping at `base` is the page holding file offset 0: the first PT_LOAD's.
      bias = base - ((ph.p_vaddr - ph.p_offset) & ~(kPage - 1));
      break;
    }
  }
  if (!bias.has_value()) {
    return "";
  }
  for (const Elf64_Phdr& ph : phdrs) {
    if (ph.p_type != PT_NOTE || ph.p_memsz == 0 || ph.p_memsz > 65536) {
      continue;
    }
    std::vector<uint8_t> notes(ph.p_memsz);
    if (ReadAt(mem_.get(), ph.p_vaddr + *bias, notes.data(), notes.size())) {
      if (std::string id = BuildIdNote(notes); !id.empty()) {
        return id;
      }
    }
  }
  return "";
}

int ProcessElfFinder::Find(Dwfl_Module* mod, void** userdata, const char* name, Dwarf_Addr base,
                           char** file_name, Elf** elfp) {
  const std::string path(name);
  if (path.empty() || path[0] != '/') {
    return dwfl_linux_proc_find_elf(mod, userdata, name, base, file_name, elfp);
  }
  const bool deleted = absl::EndsWith(path, kDeleted);
  const std::string mapped_id = MappedBuildId(base);
  const auto end = mapping_end_.find(base);
  // A chroot's files (the path's tails) only with a build-id to check them by.
  const std::vector<MappedFileCandidate> candidates =
      MappedFileCandidates(pid_, shared_, path, /*tails=*/!mapped_id.empty(), base,
                           end == mapping_end_.end() ? 0 : end->second);
  std::vector<std::string> refused;
  bool telling = false;  // a refusal worth a word: another file, a permission
  for (const MappedFileCandidate& c : candidates) {
    const std::string& candidate = c.path;
    const bool exact = c.kind == MappedFileCandidate::Kind::kMapping;  // the mapping itself
    const int fd = ::open(candidate.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT && c.kind == MappedFileCandidate::Kind::kTail) {
        continue;  // a missing tail is not worth a word
      }
      if (exact && (err == EPERM || err == EACCES)) {
        telling = true;
        refused.push_back(absl::StrCat(candidate, ": ", ErrnoText(err),
                                       " (reading a mapping needs CAP_SYS_ADMIN or "
                                       "CAP_CHECKPOINT_RESTORE)"));
      } else if (err != ENOENT || exact) {
        telling = true;
        refused.push_back(absl::StrCat(candidate, ": ", ErrnoText(err)));
      } else {
        refused.push_back(absl::StrCat(candidate, ": no such file"));
      }
      continue;
    }
    Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
    if (elf == nullptr || elf_kind(elf) != ELF_K_ELF) {
      refused.push_back(absl::StrCat(candidate, ": not an ELF file"));
      elf_end(elf);
      ::close(fd);
      continue;
    }
    if (!exact && !mapped_id.empty()) {
      const void* id = nullptr;
      const ssize_t n = dwelf_elf_gnu_build_id(elf, &id);
      const std::string file_id = n > 0 ? Hex(id, static_cast<size_t>(n)) : "";
      if (file_id != mapped_id) {
        telling = true;
        refused.push_back(absl::StrCat(candidate, ": not the file the process maps (build-id ",
                                       file_id.empty() ? "none" : Short(file_id),
                                       ", the mapping's ", Short(mapped_id), ")"));
        elf_end(elf);
        ::close(fd);
        continue;
      }
    }
    *file_name = strdup(candidate.c_str());  // NOLINT(cppcoreguidelines-no-malloc): libdwfl frees
    *elfp = elf;
    return fd;
  }
  if (deleted) {
    return dwfl_linux_proc_find_elf(mod, userdata, name, base, file_name, elfp);
  }
  if (telling) {  // not for a mapped data file (not ELF), as libdwfl's own finder
    problems_[mod] = absl::StrJoin(refused, "; ");
  }
  return -1;
}

}  // namespace kwatch::core::symbols
