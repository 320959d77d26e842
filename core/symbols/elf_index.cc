#include "core/symbols/elf_index.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/syscall_status.h"
#include "core/symbols/symbol_match.h"

namespace kwatch::core::symbols {

struct ElfSymbolIndex::OwnedElf {
  UniqueFd fd;
  Elf* elf = nullptr;

  OwnedElf() = default;
  OwnedElf(const OwnedElf&) = delete;
  OwnedElf& operator=(const OwnedElf&) = delete;
  OwnedElf(OwnedElf&&) = delete;
  OwnedElf& operator=(OwnedElf&&) = delete;
  ~OwnedElf() {
    if (elf != nullptr) {
      elf_end(elf);
    }
  }
};

namespace {

// libdwfl's preference between bindings (dwfl_module_addrsym.c): higher wins.
int BindingRank(uint8_t bind) {
  switch (bind) {
    case STB_GLOBAL:
      return 3;
    case STB_WEAK:
      return 2;
    case STB_LOCAL:
      return 1;
    default:
      return 0;
  }
}

bool Kept(const char* name, uint32_t shndx, int type) {
  return name != nullptr && *name != '\0' && shndx != SHN_UNDEF && type != STT_SECTION &&
         type != STT_FILE;
}

}  // namespace

SymbolKinds ElfSymbol::kind() const {
  switch (type) {
    case STT_FUNC:
    case STT_GNU_IFUNC:
      return kFunctionSymbols;
    case STT_OBJECT:
    case STT_COMMON:
      return kObjectSymbols;
    case STT_TLS:
      return kTlsSymbols;
    default:
      return kOtherSymbols;
  }
}

ElfSymbolIndex::ElfSymbolIndex() = default;
ElfSymbolIndex::ElfSymbolIndex(ElfSymbolIndex&&) noexcept = default;
ElfSymbolIndex& ElfSymbolIndex::operator=(ElfSymbolIndex&&) noexcept = default;
ElfSymbolIndex::~ElfSymbolIndex() = default;

ElfSymbolIndex ElfSymbolIndex::FromModule(Dwfl_Module* mod) {
  ElfSymbolIndex index;
  GElf_Addr bias = 0;
  index.elf_ = dwfl_module_getelf(mod, &bias);
  index.bias_ = bias;
  index.ReadSections();
  const int count = dwfl_module_getsymtab(mod);
  index.symbols_.reserve(count > 0 ? static_cast<size_t>(count) : 0);
  for (int i = 1; i < count; ++i) {
    GElf_Sym sym;
    GElf_Addr addr = 0;
    GElf_Word shndx = 0;
    const char* name = dwfl_module_getsym_info(mod, i, &sym, &addr, &shndx, nullptr, nullptr);
    const int type = GELF_ST_TYPE(sym.st_info);
    if (!Kept(name, shndx, type)) {
      continue;
    }
    index.symbols_.push_back(ElfSymbol{name, addr - bias, sym.st_size, static_cast<uint8_t>(type),
                                       static_cast<uint8_t>(GELF_ST_BIND(sym.st_info)), shndx});
  }
  index.BuildLookups();
  return index;
}

absl::StatusOr<ElfSymbolIndex> ElfSymbolIndex::FromFile(const std::string& path) {
  ElfSymbolIndex index;
  index.owned_ = std::make_unique<OwnedElf>();
  OwnedElf& owned = *index.owned_;
  owned.fd.Reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!owned.fd) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("open(", path, ")"));
  }
  elf_version(EV_CURRENT);
  owned.elf = elf_begin(owned.fd.get(), ELF_C_READ_MMAP, nullptr);
  if (owned.elf == nullptr || elf_kind(owned.elf) != ELF_K_ELF) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an ELF file"));
  }
  index.elf_ = owned.elf;
  index.ReadSections();
  const ElfSection* table = nullptr;
  for (const uint32_t wanted : {SHT_SYMTAB, SHT_DYNSYM}) {
    for (const ElfSection& s : index.sections_) {
      if (table == nullptr && s.type == wanted) {
        table = &s;
      }
    }
  }
  if (table == nullptr) {
    index.BuildLookups();
    return index;
  }
  Elf_Scn* scn = elf_getscn(owned.elf, table->index);
  GElf_Shdr shdr{};
  Elf_Data* data = scn != nullptr ? elf_getdata(scn, nullptr) : nullptr;
  if (data == nullptr || gelf_getshdr(scn, &shdr) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": elf_getdata: ", elf_errmsg(-1)));
  }
  // Section indexes beyond SHN_LORESERVE live in the table's SHT_SYMTAB_SHNDX companion.
  Elf_Data* xndx_data = nullptr;
  for (const ElfSection& s : index.sections_) {
    Elf_Scn* x = s.type == SHT_SYMTAB_SHNDX ? elf_getscn(owned.elf, s.index) : nullptr;
    GElf_Shdr xhdr{};
    if (x != nullptr && gelf_getshdr(x, &xhdr) != nullptr && xhdr.sh_link == table->index) {
      xndx_data = elf_getdata(x, nullptr);
    }
  }
  const size_t n = shdr.sh_entsize == 0 ? 0 : shdr.sh_size / shdr.sh_entsize;
  index.symbols_.reserve(n);
  for (size_t i = 1; i < n; ++i) {
    GElf_Sym sym{};
    Elf32_Word xndx = 0;
    if (gelf_getsymshndx(data, xndx_data, static_cast<int>(i), &sym, &xndx) == nullptr) {
      continue;
    }
    const uint32_t shndx = sym.st_shndx == SHN_XINDEX ? xndx : sym.st_shndx;
    const int type = GELF_ST_TYPE(sym.st_info);
    const char* name =
        sym.st_name == 0 ? nullptr : elf_strptr(owned.elf, shdr.sh_link, sym.st_name);
    if (!Kept(name, shndx, type)) {
      continue;
    }
    index.symbols_.push_back(ElfSymbol{name, sym.st_value, sym.st_size, static_cast<uint8_t>(type),
                                       static_cast<uint8_t>(GELF_ST_BIND(sym.st_info)), shndx});
  }
  index.BuildLookups();
  return index;
}

void ElfSymbolIndex::ReadSections() {
  size_t shstrndx = 0;
  if (elf_ == nullptr || elf_getshdrstrndx(elf_, &shstrndx) != 0) {
    return;
  }
  for (Elf_Scn* scn = elf_nextscn(elf_, nullptr); scn != nullptr; scn = elf_nextscn(elf_, scn)) {
    GElf_Shdr shdr{};
    if (gelf_getshdr(scn, &shdr) == nullptr) {
      continue;
    }
    const char* name = elf_strptr(elf_, shstrndx, shdr.sh_name);
    ElfSection s;
    s.name = name == nullptr ? "" : name;
    s.index = static_cast<uint32_t>(elf_ndxscn(scn));
    s.type = shdr.sh_type;
    s.flags = shdr.sh_flags;
    s.addr = shdr.sh_addr;
    s.size = shdr.sh_size;
    s.offset = shdr.sh_offset;
    sections_.push_back(std::move(s));
  }
}

void ElfSymbolIndex::BuildLookups() {
  by_name_.resize(symbols_.size());
  for (uint32_t i = 0; i < by_name_.size(); ++i) {
    by_name_[i] = i;
  }
  std::stable_sort(by_name_.begin(), by_name_.end(), [this](uint32_t a, uint32_t b) {
    return symbols_[a].bare_name() < symbols_[b].bare_name();
  });
  by_addr_.clear();
  for (uint32_t i = 0; i < symbols_.size(); ++i) {
    if (symbols_[i].type != STT_TLS) {
      by_addr_.push_back(i);
    }
  }
  std::stable_sort(by_addr_.begin(), by_addr_.end(),
                   [this](uint32_t a, uint32_t b) { return symbols_[a].addr < symbols_[b].addr; });
  max_end_.resize(by_addr_.size());
  max_global_end_.resize(by_addr_.size());
  last_global_.resize(by_addr_.size());
  uint64_t end = 0;
  uint64_t global_end = 0;
  int64_t last_global = -1;
  for (size_t i = 0; i < by_addr_.size(); ++i) {
    const ElfSymbol& s = symbols_[by_addr_[i]];
    end = std::max(end, s.addr + s.size);
    if (s.is_global()) {
      global_end = std::max(global_end, s.addr + s.size);
      last_global = static_cast<int64_t>(i);
    }
    max_end_[i] = end;
    max_global_end_[i] = global_end;
    last_global_[i] = last_global;
  }
}

const ElfSymbol* ElfSymbolIndex::Find(std::string_view name, SymbolKinds kinds) const {
  const std::vector<const ElfSymbol*> all = FindAll(name, kinds);
  for (const ElfSymbol* s : all) {
    if (s->name == name) {
      return s;  // the exact spelling first
    }
  }
  return all.empty() ? nullptr : all.front();
}

std::vector<const ElfSymbol*> ElfSymbolIndex::FindAll(std::string_view name,
                                                      SymbolKinds kinds) const {
  const std::string_view bare = name.substr(0, name.find('@'));
  const bool versioned = bare.size() != name.size();
  const auto [lo, hi] = std::equal_range(
      by_name_.begin(), by_name_.end(), bare, [this](const auto& a, const auto& b) {
        if constexpr (std::is_same_v<std::decay_t<decltype(a)>, uint32_t>) {
          return symbols_[a].bare_name() < b;
        } else {
          return a < symbols_[b].bare_name();
        }
      });
  std::vector<const ElfSymbol*> out;
  for (auto it = lo; it != hi; ++it) {
    const ElfSymbol& s = symbols_[*it];
    if ((s.kind() & kinds) != 0 && (!versioned || s.name == name)) {
      out.push_back(&s);
    }
  }
  return out;
}

uint32_t ElfSymbolIndex::SectionIndexAt(uint64_t addr) const {
  for (const ElfSection& s : sections_) {
    const bool tls_bss = s.type == SHT_NOBITS && (s.flags & SHF_TLS) != 0;
    if ((s.flags & SHF_ALLOC) != 0 && !tls_bss && s.Contains(addr)) {
      return s.index;
    }
  }
  return SHN_UNDEF;
}

const ElfSymbol* ElfSymbolIndex::SymbolAt(uint64_t addr) const {
  // by_addr_[0, upper) start at or below addr.
  const auto upper_it =
      std::upper_bound(by_addr_.begin(), by_addr_.end(), addr,
                       [this](uint64_t a, uint32_t i) { return a < symbols_[i].addr; });
  const auto upper = static_cast<size_t>(upper_it - by_addr_.begin());
  if (upper == 0) {
    return nullptr;
  }
  // Sized symbols containing addr (none below a position whose highest end is at addr).
  const auto better = [](const ElfSymbol& a, const ElfSymbol& b) {
    if (a.addr != b.addr) {
      return a.addr > b.addr;
    }
    if (BindingRank(a.bind) != BindingRank(b.bind)) {
      return BindingRank(a.bind) > BindingRank(b.bind);
    }
    if (a.size != b.size) {
      return a.size < b.size;
    }
    return &a < &b;  // table order
  };
  const ElfSymbol* sized_global = nullptr;
  const ElfSymbol* sized_local = nullptr;
  for (size_t i = upper; i-- > 0 && max_end_[i] > addr;) {
    const ElfSymbol& s = symbols_[by_addr_[i]];
    const ElfSymbol*& best = s.is_global() ? sized_global : sized_local;
    if (s.size != 0 && addr - s.addr < s.size && (best == nullptr || better(s, *best))) {
      best = &s;
    }
  }
  if (sized_global != nullptr) {
    return sized_global;
  }
  // Sizeless symbols (assembly labels): the last in table order at `start`, in addr's section.
  const uint32_t addr_section = SectionIndexAt(addr);
  const auto sizeless_at = [&](uint64_t start, bool global) -> const ElfSymbol* {
    const ElfSymbol* found = nullptr;
    for (size_t i = upper; i-- > 0 && symbols_[by_addr_[i]].addr >= start;) {
      const ElfSymbol& s = symbols_[by_addr_[i]];
      const bool same_section =
          s.shndx >= SHN_LORESERVE ? s.addr == addr : SectionIndexAt(s.addr) == addr_section;
      if (s.addr == start && s.size == 0 && s.is_global() == global && same_section &&
          (found == nullptr || &s > found)) {
        found = &s;
      }
    }
    return found;
  };
  // libdwfl searches the globals first: their nearest sizeless symbol counts when nothing
  // global ends above it, and one exactly at addr ends the search before the locals.
  const ElfSymbol* sizeless = nullptr;
  if (const int64_t g = last_global_[upper - 1]; g >= 0) {
    const uint64_t start = symbols_[by_addr_[g]].addr;
    if (max_global_end_[upper - 1] <= start) {
      sizeless = sizeless_at(start, /*global=*/true);
    }
  }
  if (sizeless != nullptr && sizeless->addr == addr) {
    return sizeless;
  }
  if (sized_local != nullptr) {
    return sized_local;
  }
  // Then a sizeless symbol at the nearest start, when no symbol at all ends above it (a
  // local one found later wins over the global one).
  const uint64_t nearest = symbols_[by_addr_[upper - 1]].addr;
  if (max_end_[upper - 1] > nearest) {
    return nullptr;
  }
  if (const ElfSymbol* local = sizeless_at(nearest, /*global=*/false); local != nullptr) {
    return local;
  }
  return sizeless != nullptr && sizeless->addr == nearest ? sizeless : nullptr;
}

const ElfSymbol* ElfSymbolIndex::FunctionAt(uint64_t addr) const {
  const ElfSymbol* s = SymbolAt(addr);
  return s != nullptr && s->is_function() ? s : nullptr;
}

const ElfSection* ElfSymbolIndex::SectionOf(const ElfSymbol& sym) const {
  if (sym.shndx == SHN_UNDEF || sym.shndx >= SHN_LORESERVE) {
    return nullptr;
  }
  if (sym.shndx <= sections_.size() && sections_[sym.shndx - 1].index == sym.shndx) {
    return &sections_[sym.shndx - 1];  // elf_nextscn lists sections from index 1, in order
  }
  for (const ElfSection& s : sections_) {
    if (s.index == sym.shndx) {
      return &s;
    }
  }
  return nullptr;
}

const ElfSection* ElfSymbolIndex::SectionWithBytesAt(uint64_t addr) const {
  for (const ElfSection& s : sections_) {
    if ((s.flags & SHF_ALLOC) != 0 && s.type != SHT_NOBITS && s.Contains(addr)) {
      return &s;
    }
  }
  return nullptr;
}

absl::StatusOr<std::span<const uint8_t>> ElfSymbolIndex::SectionBytes(
    const ElfSection& section) const {
  Elf_Scn* scn = elf_ == nullptr ? nullptr : elf_getscn(elf_, section.index);
  Elf_Data* data = scn == nullptr ? nullptr : elf_getdata(scn, nullptr);
  if (data == nullptr || data->d_buf == nullptr) {
    return absl::InternalError(elf_errmsg(-1));
  }
  return std::span<const uint8_t>(static_cast<const uint8_t*>(data->d_buf), data->d_size);
}

std::vector<std::string> ElfSymbolIndex::NearNames(std::string_view word, size_t max,
                                                   SymbolKinds kinds,
                                                   const std::vector<std::string>& extra) const {
  std::vector<std::string> names = extra;
  std::string_view last;
  for (const uint32_t i : by_name_) {
    const ElfSymbol& s = symbols_[i];
    if ((s.kind() & kinds) != 0 && s.bare_name() != last) {
      last = s.bare_name();
      names.emplace_back(last);
    }
  }
  return NearMatches(word, names, max);
}

}  // namespace kwatch::core::symbols
