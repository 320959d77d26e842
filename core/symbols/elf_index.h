#pragma once

// One index of an ELF file's symbol table, shared by everything in kwatch that reads ELF
// symbols: a process's modules (core/symbols/symbols.cc), a probe target
// (core/probe/probe_target.cc) and a vmlinux (core/kernel/kernel_symbols.cc).
//
// The table is read once: .symtab, else .dynsym (through libdwfl for a reported module,
// which also merges the MiniDebugInfo table of .gnu_debugdata; through libelf for a file).
// Kept are the defined, named symbols other than section and file symbols, in table order,
// with their link-time addresses (as nm prints them), sizes, types, bindings and sections.
// On top: lookups by name (bare or versioned spelling) and by address, the file's section
// headers and contents, and near-match suggestions for unknown names (symbol_match.h).
//
// Lifetime: names point into the ELF file's string table. An index from FromModule borrows
// the module's Elf, so the Dwfl must outlive it; one from FromFile owns its file. Immutable
// after creation: const calls are safe from several threads.

#include <elfutils/libdwfl.h>
#include <gelf.h>
#include <libelf.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"

namespace kwatch::core::symbols {

// Kinds of symbols, as a mask for lookups (from the symbol's STT_ type).
using SymbolKinds = uint8_t;
inline constexpr SymbolKinds kFunctionSymbols = 1;  // STT_FUNC, STT_GNU_IFUNC
inline constexpr SymbolKinds kObjectSymbols = 2;    // STT_OBJECT, STT_COMMON
inline constexpr SymbolKinds kTlsSymbols = 4;       // STT_TLS
inline constexpr SymbolKinds kOtherSymbols = 8;     // STT_NOTYPE and the rest
inline constexpr SymbolKinds kDataSymbols = kObjectSymbols | kTlsSymbols;
inline constexpr SymbolKinds kAllSymbols = 15;

struct ElfSymbol {
  std::string_view name;       // as in the table: "stdout@GLIBC_2.2.5" for a versioned name
  uint64_t addr = 0;           // link-time address (nm's value); the TLS block offset for STT_TLS
  uint64_t size = 0;           // st_size; 0 when the table gives none
  uint8_t type = STT_NOTYPE;   // STT_*
  uint8_t bind = STB_LOCAL;    // STB_*
  uint32_t shndx = SHN_UNDEF;  // section header index (extended indexes resolved), or SHN_ABS...

  // The name without its version: "stdout" for "stdout@GLIBC_2.2.5" or "f@@V1".
  std::string_view bare_name() const { return name.substr(0, name.find('@')); }
  SymbolKinds kind() const;
  bool is_function() const { return kind() == kFunctionSymbols; }
  bool is_global() const { return bind != STB_LOCAL; }  // STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE
};

struct ElfSection {
  std::string name;
  uint32_t index = 0;  // section header index (ElfSymbol::shndx)
  uint32_t type = SHT_NULL;
  uint64_t flags = 0;   // SHF_*
  uint64_t addr = 0;    // link-time address; 0 for sections not loaded
  uint64_t size = 0;    // bytes
  uint64_t offset = 0;  // in the file (meaningless for SHT_NOBITS)

  bool Contains(uint64_t a) const { return a >= addr && a - addr < size; }
};

class ElfSymbolIndex {
 public:
  // The symbols libdwfl reads for `mod` (its own choice of table and file, separate debug
  // info included) and the sections of its main ELF file. `bias()` is the module's load
  // bias: run-time address = link-time address + bias. A module without symbols gives an
  // empty index.
  static ElfSymbolIndex FromModule(Dwfl_Module* mod);

  // The .symtab (else .dynsym) of the ELF file at `path`, with libelf (sections() tells which
  // tables the file has). Errors: the errno of open ("open(PATH): ..."), InvalidArgument
  // "PATH: not an ELF file", or "PATH: CALL: <libelf's message>". A file without either
  // table gives an empty index.
  static absl::StatusOr<ElfSymbolIndex> FromFile(const std::string& path);

  ElfSymbolIndex(ElfSymbolIndex&& other) noexcept;
  ElfSymbolIndex& operator=(ElfSymbolIndex&& other) noexcept;
  ElfSymbolIndex(const ElfSymbolIndex&) = delete;
  ElfSymbolIndex& operator=(const ElfSymbolIndex&) = delete;
  ~ElfSymbolIndex();

  uint64_t bias() const { return bias_; }
  // The ELF the sections belong to (borrowed from libdwfl, or owned); nullptr without one.
  Elf* elf() const { return elf_; }
  const std::vector<ElfSymbol>& symbols() const { return symbols_; }
  const std::vector<ElfSection>& sections() const { return sections_; }

  // The symbol of one of `kinds` called `name`: the first in table order spelled exactly so,
  // else the first whose bare name it is ("stdout" finds "stdout@GLIBC_2.2.5"). nullptr if
  // none.
  const ElfSymbol* Find(std::string_view name, SymbolKinds kinds = kAllSymbols) const;
  // Every symbol of `kinds` spelled `name`, or (for a name without '@') whose bare name it
  // is, in table order.
  std::vector<const ElfSymbol*> FindAll(std::string_view name,
                                        SymbolKinds kinds = kAllSymbols) const;

  // The symbol `addr` (link-time) falls in, by libdwfl's rule (dwfl_module_addrinfo), TLS
  // symbols aside: a global (or weak) sized symbol containing it; else a global sizeless one
  // exactly at it; else a local sized one containing it; else the sizeless symbol at the
  // nearest start below it, in its section, when no symbol ends above that start (local
  // before global). Among sized ones: the nearest start, the stronger binding, the smaller
  // size, table order. nullptr if none.
  const ElfSymbol* SymbolAt(uint64_t addr) const;
  // SymbolAt, when that symbol is a function (a sizeless one contains every address from
  // its start on). nullptr otherwise.
  const ElfSymbol* FunctionAt(uint64_t addr) const;

  // The section of `sym` (nullptr for SHN_ABS, SHN_COMMON... or a bad index).
  const ElfSection* SectionOf(const ElfSymbol& sym) const;
  // The first allocated section with contents in the file (not SHT_NOBITS) holding `addr`.
  const ElfSection* SectionWithBytesAt(uint64_t addr) const;
  // The bytes of `section` as the file holds them. Internal error with libelf's message.
  absl::StatusOr<std::span<const uint8_t>> SectionBytes(const ElfSection& section) const;

  // Up to `max` bare names of the symbols of `kinds`, and of `extra`, near `word` (by
  // NearMatches: nearest first, then alphabetical; `word` itself never).
  std::vector<std::string> NearNames(std::string_view word, size_t max, SymbolKinds kinds,
                                     const std::vector<std::string>& extra = {}) const;

 private:
  struct OwnedElf;
  ElfSymbolIndex();
  void ReadSections();
  void BuildLookups();
  // The allocated section holding `addr` (SHN_UNDEF when none), for sizeless symbols.
  uint32_t SectionIndexAt(uint64_t addr) const;

  uint64_t bias_ = 0;
  Elf* elf_ = nullptr;
  std::unique_ptr<OwnedElf> owned_;  // FromFile: the descriptor and the Elf
  std::vector<ElfSymbol> symbols_;
  std::vector<ElfSection> sections_;
  std::vector<uint32_t> by_name_;         // indexes into symbols_, by bare name then table order
  std::vector<uint32_t> by_addr_;         // symbols SymbolAt considers, by address then table order
  std::vector<uint64_t> max_end_;         // the highest end of by_addr_[0..i]
  std::vector<uint64_t> max_global_end_;  // the same over the global symbols alone
  std::vector<int64_t> last_global_;      // the last global of by_addr_[0..i], or -1
};

}  // namespace kwatch::core::symbols
