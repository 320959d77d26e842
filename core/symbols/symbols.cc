#include "core/symbols/symbols.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/base/target_files.h"
#include "core/symbols/dwarf_types.h"
#include "core/symbols/elf_index.h"
#include "core/symbols/expr_resolver.h"
#include "core/symbols/line_table.h"
#include "core/symbols/process_elf.h"
#include "core/symbols/symbol_match.h"
#include "core/symbols/type_names.h"

namespace kwatch::core::symbols {
namespace {

absl::Status DwflError(absl::string_view call) {
  return absl::InternalError(absl::StrCat(call, ": ", dwfl_errmsg(-1)));
}

std::string Basename(std::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string ModuleName(Dwfl_Module* mod) {
  const char* name =
      dwfl_module_info(mod, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  return name == nullptr ? "?" : name;
}

uint64_t ModuleStart(Dwfl_Module* mod) {
  Dwarf_Addr start = 0;
  dwfl_module_info(mod, nullptr, &start, nullptr, nullptr, nullptr, nullptr, nullptr);
  return start;
}

// An executable (as opposed to a shared library): ET_EXEC, or PIE with an interpreter.
bool LooksLikeExecutable(Dwfl_Module* mod) {
  GElf_Addr bias = 0;
  Elf* elf = dwfl_module_getelf(mod, &bias);
  if (elf == nullptr) {
    return false;
  }
  GElf_Ehdr ehdr;
  if (gelf_getehdr(elf, &ehdr) == nullptr) {
    return false;
  }
  if (ehdr.e_type == ET_EXEC) {
    return true;
  }
  size_t phnum = 0;
  if (ehdr.e_type != ET_DYN || elf_getphdrnum(elf, &phnum) != 0) {
    return false;
  }
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr phdr;
    if (gelf_getphdr(elf, static_cast<int>(i), &phdr) != nullptr && phdr.p_type == PT_INTERP) {
      return true;
    }
  }
  return false;
}

int CollectModule(Dwfl_Module* mod, void** /*userdata*/, const char* /*name*/, Dwarf_Addr /*start*/,
                  void* arg) {
  static_cast<std::vector<Dwfl_Module*>*>(arg)->push_back(mod);
  return DWARF_CB_OK;
}

bool HasFlag(Dwarf_Die die, unsigned int attr_name) {
  Dwarf_Attribute attr;
  bool flag = false;
  return dwarf_attr_integrate(&die, attr_name, &attr) != nullptr &&
         dwarf_formflag(&attr, &flag) == 0 && flag;
}

// Where a point of the resolution stands: an address and (when known) its type.
// Symbols through one Dwfl (a process's modules, or one file). Owns the Dwfl; the name
// index (DWARF variables, ELF data and function symbols of every module) is built on first
// use, or at creation for processes. Not thread-safe (the lazy index and libdw caches).
class DwflSymbols final : public Symbols {
 public:
  DwflSymbols(DwflPtr dwfl, std::string exe_path,
              std::unique_ptr<ProcessElfFinder> finder = nullptr)
      : finder_(std::move(finder)), dwfl_(std::move(dwfl)), exe_path_(std::move(exe_path)) {}

  // Opens every module's ELF and DWARF and builds the name index (idempotent).
  void EnsureIndex() const;

  absl::StatusOr<ResolvedExpr> Resolve(const Expr& expr, const MemoryReader& read) const override;
  std::optional<FunctionSymbol> FunctionAt(RemoteAddr addr) const override;
  std::optional<SourceLine> LineAt(RemoteAddr addr) const override;
  absl::Status ReadCode(RemoteAddr addr, std::span<uint8_t> out) const override;
  std::optional<FunctionSymbol> FindFunction(std::string_view name) const override;
  absl::StatusOr<std::vector<RemoteAddr>> AddressesOfLine(std::string_view file, int line,
                                                          bool statements) const override;

 private:
  // How a data symbol was found; lower ranks win when several modules or CUs define a name.
  enum Rank : uint8_t {
    kDwarfExtern = 0,
    kDwarfStatic = 1,  // file-level static, or "func::var" for a function-static
    kElfGlobal = 2,
    kElfLocal = 3,
    kDwarfFunctionStatic = 4,  // a function-static under its plain name
  };
  struct Candidate {
    Dwfl_Module* mod = nullptr;
    size_t module_index = 0;
    uint64_t addr = 0;  // absolute (bias applied); the TLS offset for TLS symbols
    uint64_t size = 0;  // ELF st_size (0 when unknown or from DWARF)
    bool has_type = false;
    TypeRef type;
    bool tls = false;
    Rank rank = kDwarfExtern;
    absl::string_view file;  // DWARF: the unit's source file, as compiled ("Python/thread.c");
                             // libdw's string, alive as long as dwfl_
    std::string function;    // DWARF: the function of a function-static
  };

  // The ELF symbol index of `mod`, built on first use.
  const ElfSymbolIndex& ElfIndexOf(Dwfl_Module* mod) const;
  bool IsFunctionName(const std::string& name) const;
  void IndexElf(Dwfl_Module* mod, size_t index) const;
  void IndexDwarf(Dwfl_Module* mod, size_t index) const;
  // State of one module's DWARF walk.
  struct DwarfWalk {
    Dwfl_Module* mod = nullptr;
    size_t index = 0;
    Dwarf_Addr bias = 0;
    // Full names of declarations (namespace members, static data members) by DIE offset,
    // for the definitions that point at them with DW_AT_specification.
    absl::flat_hash_map<Dwarf_Off, std::string> qualified;
    std::vector<std::pair<Dwarf_Die, std::string>> pending;  // (definition, function)
  };
  void IndexScope(DwarfWalk* walk, Dwarf_Die scope, const std::string& prefix,
                  const std::string& function) const;
  void IndexTypeScope(DwarfWalk* walk, Dwarf_Die type, const std::string& prefix) const;
  // `name` is the full name (or, inside `function`, the variable's own name).
  void IndexVariable(DwarfWalk* walk, Dwarf_Die var, const std::string& name,
                     const std::string& function) const;
  // The variable called `written` (for the expression resolver), with the errors its contract
  // gives for unknown, ambiguous, function and thread-local names.
  absl::StatusOr<ExprVariable> Variable(const std::string& written) const;
  // The type a cast names (the resolver's TypeLookup): the executable's first, then the
  // libraries'; NotFound with near matches.
  absl::StatusOr<TypeRef> FindType(const ExprType& type) const;
  // The source file of a candidate: its unit's, or for an ELF symbol, the unit of the DWARF
  // variable at its address ("" when none).
  absl::string_view FileOf(const Candidate& c) const;
  std::string ModuleList() const;

  std::unique_ptr<ProcessElfFinder> finder_;  // a process's: outlives dwfl_
  DwflPtr dwfl_;
  std::string exe_path_;  // "" when unknown

  mutable bool indexed_ = false;
  mutable std::vector<Dwfl_Module*> modules_;  // the executable first, then by address
  mutable Dwfl_Module* exe_ = nullptr;
  mutable absl::flat_hash_map<std::string, std::vector<Candidate>> data_;
  mutable absl::flat_hash_map<std::string, Dwarf_Die> declarations_;  // typed, no location
  // Template names as CanonicalTypeName spells them ("Box<long>::value"), for data_'s names
  // as the compiler spelled them ("Box<long int>::value").
  mutable absl::flat_hash_map<std::string, std::string> canonical_;
  // The DWARF variable at an address (by module), for the ELF symbols GCC renames
  // (`calls.0`: a function's static), which the DWARF knows by their own names.
  struct DwarfVariable {
    TypeRef type;
    absl::string_view file;
    std::string function;
  };
  mutable absl::flat_hash_map<std::pair<Dwfl_Module*, uint64_t>, DwarfVariable> dwarf_at_;
  // Local data symbols with a GCC suffix (`calls.0`, `x.lto_priv.0`) by module and address.
  mutable absl::flat_hash_map<std::pair<Dwfl_Module*, uint64_t>, std::string> renamed_at_;
  mutable absl::flat_hash_map<Dwfl_Module*, std::unique_ptr<ElfSymbolIndex>> elf_indexes_;
  mutable absl::flat_hash_set<std::string> dwarf_functions_;
  // Inlined-subroutine ranges per CU (by the CU DIE's offset, per module), built on the first
  // LineAt in that CU: one walk of the CU instead of a dwarf_getscopes walk per address.
  struct InlineRange {
    Dwarf_Addr lo = 0;  // CU-relative (bias removed)
    Dwarf_Addr hi = 0;
    int depth = 0;
    std::string name;
  };
  mutable absl::flat_hash_map<std::pair<Dwfl_Module*, Dwarf_Off>, std::vector<InlineRange>>
      inline_ranges_;
  const std::vector<InlineRange>& InlineRangesOf(Dwfl_Module* mod, Dwarf_Die* cudie) const;
};

void DwflSymbols::EnsureIndex() const {
  if (indexed_) {
    return;
  }
  indexed_ = true;
  dwfl_getmodules(dwfl_.get(), CollectModule, &modules_, 0);
  for (Dwfl_Module* mod : modules_) {
    if (!exe_path_.empty() && ModuleName(mod) == exe_path_) {
      exe_ = mod;
    }
  }
  std::sort(modules_.begin(), modules_.end(),
            [](Dwfl_Module* a, Dwfl_Module* b) { return ModuleStart(a) < ModuleStart(b); });
  if (exe_ == nullptr) {
    for (Dwfl_Module* mod : modules_) {
      if (LooksLikeExecutable(mod)) {
        exe_ = mod;
        break;
      }
    }
  }
  if (exe_ != nullptr) {
    std::stable_partition(modules_.begin(), modules_.end(),
                          [this](Dwfl_Module* m) { return m == exe_; });
  }
  for (size_t i = 0; i < modules_.size(); ++i) {
    IndexElf(modules_[i], i);
    IndexDwarf(modules_[i], i);
  }
}

const ElfSymbolIndex& DwflSymbols::ElfIndexOf(Dwfl_Module* mod) const {
  std::unique_ptr<ElfSymbolIndex>& index = elf_indexes_[mod];
  if (index == nullptr) {
    index = std::make_unique<ElfSymbolIndex>(ElfSymbolIndex::FromModule(mod));
  }
  return *index;
}

bool DwflSymbols::IsFunctionName(const std::string& name) const {
  if (dwarf_functions_.contains(name)) {
    return true;
  }
  return std::any_of(modules_.begin(), modules_.end(), [&](Dwfl_Module* mod) {
    return ElfIndexOf(mod).Find(name, kFunctionSymbols) != nullptr;
  });
}

void DwflSymbols::IndexElf(Dwfl_Module* mod, size_t index) const {
  const ElfSymbolIndex& elf = ElfIndexOf(mod);
  for (const ElfSymbol& sym : elf.symbols()) {
    if ((sym.kind() & kDataSymbols) == 0) {
      continue;
    }
    Candidate c;
    c.mod = mod;
    c.module_index = index;
    c.addr = sym.addr + elf.bias();
    c.size = sym.size;
    c.tls = sym.type == STT_TLS;
    c.rank = sym.is_global() ? kElfGlobal : kElfLocal;
    std::string name(sym.bare_name());  // "stdout@GLIBC_2.2.5": copy relocations
    if (!sym.is_global() && absl::StrContains(name, ".")) {
      renamed_at_.try_emplace(std::make_pair(mod, c.addr), name);  // `calls.0`
    }
    data_[std::move(name)].push_back(c);
  }
}

void DwflSymbols::IndexDwarf(Dwfl_Module* mod, size_t index) const {
  DwarfWalk walk;
  walk.mod = mod;
  walk.index = index;
  Dwarf_Die* cu = nullptr;
  while ((cu = dwfl_module_nextcu(mod, cu, &walk.bias)) != nullptr) {
    IndexScope(&walk, *cu, "", "");
  }
  // Definitions outside their namespace or class (C++) take the declaration's full name.
  for (auto& [die, function] : walk.pending) {
    std::string name;
    Dwarf_Attribute attr;
    Dwarf_Die decl;
    if (dwarf_attr(&die, DW_AT_specification, &attr) != nullptr &&
        dwarf_formref_die(&attr, &decl) != nullptr) {
      if (const auto it = walk.qualified.find(dwarf_dieoffset(&decl));
          it != walk.qualified.end() && function.empty()) {
        name = it->second;
      }
    }
    if (name.empty()) {
      name = DieName(die);
    }
    if (!name.empty()) {
      IndexVariable(&walk, die, name, function);
    }
  }
}

void DwflSymbols::IndexScope(DwarfWalk* walk, Dwarf_Die scope, const std::string& prefix,
                             const std::string& function) const {
  Dwarf_Die child;
  if (dwarf_child(&scope, &child) != 0) {
    return;
  }
  do {
    switch (dwarf_tag(&child)) {
      case DW_TAG_variable: {
        if (dwarf_hasattr(&child, DW_AT_specification) != 0) {
          walk->pending.emplace_back(child, function);
          break;
        }
        const std::string name = DieName(child);
        if (name.empty()) {
          break;
        }
        if (HasFlag(child, DW_AT_declaration)) {
          if (function.empty()) {
            walk->qualified.try_emplace(dwarf_dieoffset(&child), prefix + name);
            if (const std::optional<Dwarf_Die> type = TypeOf(child); type.has_value()) {
              declarations_.try_emplace(prefix + name, *type);  // `extern`: a type source
            }
          }
          break;
        }
        IndexVariable(walk, child, function.empty() ? prefix + name : name, function);
        break;
      }
      case DW_TAG_namespace: {
        const std::string name = DieName(child);
        IndexScope(walk, child, name.empty() ? prefix : prefix + name + "::", function);
        break;
      }
      case DW_TAG_structure_type:
      case DW_TAG_class_type:
      case DW_TAG_union_type: {
        const std::string name = DieName(child);
        if (!name.empty() && function.empty()) {
          IndexTypeScope(walk, child, prefix + name + "::");
        }
        break;
      }
      case DW_TAG_subprogram: {
        const std::string name = DieName(child);
        if (!name.empty() && function.empty()) {
          dwarf_functions_.insert(prefix + name);
        }
        if (dwarf_haschildren(&child) != 0 && !name.empty()) {
          IndexScope(walk, child, prefix, function.empty() ? prefix + name : function);
        }
        break;
      }
      case DW_TAG_lexical_block:
        if (!function.empty()) {
          IndexScope(walk, child, prefix, function);
        }
        break;
      default:
        break;
    }
  } while (dwarf_siblingof(&child, &child) == 0);
}

void DwflSymbols::IndexTypeScope(DwarfWalk* walk, Dwarf_Die type, const std::string& prefix) const {
  Dwarf_Die child;
  if (dwarf_child(&type, &child) != 0) {
    return;
  }
  do {
    const int tag = dwarf_tag(&child);
    const std::string name = DieName(child);
    if (name.empty()) {
      continue;
    }
    if ((tag == DW_TAG_variable || tag == DW_TAG_member) &&
        (HasFlag(child, DW_AT_declaration) || HasFlag(child, DW_AT_external))) {
      walk->qualified.try_emplace(dwarf_dieoffset(&child), prefix + name);  // static member
    } else if (tag == DW_TAG_structure_type || tag == DW_TAG_class_type ||
               tag == DW_TAG_union_type) {
      IndexTypeScope(walk, child, prefix + name + "::");
    }
  } while (dwarf_siblingof(&child, &child) == 0);
}

void DwflSymbols::IndexVariable(DwarfWalk* walk, Dwarf_Die var, const std::string& name,
                                const std::string& function) const {
  Dwarf_Attribute loc;
  if (dwarf_attr(&var, DW_AT_location, &loc) == nullptr) {
    return;  // optimized out, or a local variable without a location
  }
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  if (dwarf_getlocation(&loc, &ops, &nops) != 0 || nops == 0) {
    return;  // a location list: not a static-storage variable
  }
  Candidate c;
  c.mod = walk->mod;
  c.module_index = walk->index;
  const bool tls_op = nops >= 2 && (ops[nops - 1].atom == DW_OP_form_tls_address ||
                                    ops[nops - 1].atom == DW_OP_GNU_push_tls_address);
  if (ops[0].atom == DW_OP_addr && nops == 1) {
    c.addr = ops[0].number + walk->bias;
  } else if ((ops[0].atom == DW_OP_addrx || ops[0].atom == DW_OP_GNU_addr_index) && nops == 1) {
    Dwarf_Attribute addr_attr;
    Dwarf_Addr value = 0;
    if (dwarf_getlocation_attr(&loc, &ops[0], &addr_attr) != 0 ||
        dwarf_formaddr(&addr_attr, &value) != 0) {
      return;
    }
    c.addr = value + walk->bias;
  } else if (tls_op && nops == 2) {
    c.tls = true;
    c.addr = ops[0].number;
  } else {
    return;  // a register, frame or computed location: not a static variable
  }
  if (const std::optional<Dwarf_Die> type = TypeOf(var); type.has_value()) {
    c.has_type = true;
    c.type = TypeRef{*type, 0};
  }
  Dwarf_Die cu;
  if (dwarf_diecu(&var, &cu, nullptr, nullptr) != nullptr) {
    if (const char* file = dwarf_diename(&cu); file != nullptr) {
      c.file = file;  // in the Dwarf's string section
    }
  }
  c.function = function;
  if (c.has_type && !c.tls) {
    dwarf_at_.try_emplace(std::make_pair(c.mod, c.addr), DwarfVariable{c.type, c.file, function});
  }
  if (absl::StrContains(name, "<")) {
    const std::string canonical = CanonicalTypeName(name);
    if (canonical != name) {
      canonical_.try_emplace(canonical, name);
    }
  }
  if (!function.empty()) {
    c.rank = kDwarfStatic;
    data_[function + "::" + name].push_back(c);
    c.rank = kDwarfFunctionStatic;
    data_[name].push_back(c);
    return;
  }
  c.rank = HasFlag(var, DW_AT_external) ? kDwarfExtern : kDwarfStatic;
  data_[name].push_back(c);
}

std::string DwflSymbols::ModuleList() const {
  std::vector<std::string> names;
  for (Dwfl_Module* mod : modules_) {
    if (names.size() == 4) {
      names.push_back(absl::StrCat("and ", modules_.size() - 4, " more"));
      break;
    }
    std::string problem = finder_ == nullptr ? "" : finder_->Problem(mod);
    names.push_back(problem.empty()
                        ? Basename(ModuleName(mod))
                        : absl::StrCat(Basename(ModuleName(mod)), " (no file: ", problem, ")"));
  }
  return names.empty() ? "no modules" : absl::StrJoin(names, ", ");
}

namespace {

// "a, b, c": `names` sorted, at most `shown` of them, then ", ..." for the rest.
std::string SortedList(std::vector<std::string> names, size_t shown) {
  std::sort(names.begin(), names.end());
  if (names.size() > shown) {
    names.resize(shown);
    names.emplace_back("...");
  }
  return absl::StrJoin(names, ", ");
}

// 'thread.c' names Python/thread.c: the unit's file, or a tail of it at a '/'.
bool FileMatches(absl::string_view unit_file, absl::string_view written) {
  return unit_file == written || (absl::EndsWith(unit_file, written) &&
                                  unit_file[unit_file.size() - written.size() - 1] == '/');
}

}  // namespace

absl::string_view DwflSymbols::FileOf(const Candidate& c) const {
  if (!c.file.empty()) {
    return c.file;
  }
  const auto it = dwarf_at_.find(std::make_pair(c.mod, c.addr));
  return it == dwarf_at_.end() ? absl::string_view() : it->second.file;
}

absl::StatusOr<ExprVariable> DwflSymbols::Variable(const std::string& written) const {
  // 'FILE'::NAME (the parser checked the quotes and the '::').
  std::string file;
  std::string name = written;
  if (absl::StartsWith(written, "'")) {
    const size_t close = written.find('\'', 1);
    file = written.substr(1, close - 1);
    name = written.substr(close + 3);
  }
  const bool templated = absl::StrContains(name, "<");
  auto it = data_.find(name);
  if (it == data_.end() && templated) {
    // Box<long>::value for the compiler's Box<long int>::value (the parser made `name`
    // canonical).
    if (const auto c = canonical_.find(name); c != canonical_.end()) {
      it = data_.find(c->second);
    }
  }
  if (it == data_.end() && file.empty()) {
    // C++: `g_counter` for `net::stats::g_counter` when only one name ends that way.
    const std::string tail = absl::StrCat("::", name);
    std::vector<std::string> qualified;
    for (const auto& [n, cands] : data_) {
      if (absl::EndsWith(n, tail)) {
        qualified.push_back(n);
      }
    }
    if (templated) {
      for (const auto& [canonical, n] : canonical_) {
        if (absl::EndsWith(canonical, tail) &&
            std::find(qualified.begin(), qualified.end(), n) == qualified.end()) {
          qualified.push_back(n);
        }
      }
    }
    if (qualified.size() == 1) {
      it = data_.find(qualified[0]);
    } else if (qualified.size() > 1) {
      for (std::string& q : qualified) {
        q = CanonicalTypeName(q);
      }
      return absl::NotFoundError(absl::StrCat("'", name, "' is ambiguous: it could be ",
                                              SortedList(std::move(qualified), 5),
                                              "; give the full name"));
    }
  }
  if (it == data_.end() || it->second.empty()) {
    if (IsFunctionName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", name,
                       "' is a function, not data: use `kwatch probe` for code, or watch a "
                       "variable"));
    }
    std::vector<std::string> names;
    names.reserve(data_.size());
    for (const auto& [n, cands] : data_) {
      names.push_back(absl::StrContains(n, "<") ? CanonicalTypeName(n) : n);
      if (const size_t colons = names.back().rfind("::"); colons != std::string::npos) {
        names.push_back(
            names.back().substr(colons + 2));  // resolves through the unique-suffix rule
      }
    }
    const std::vector<std::string> near = NearMatches(name, names, 3);
    std::string msg = absl::StrCat("no variable '", name, "' in ", ModuleList());
    if (!near.empty()) {
      absl::StrAppend(&msg, "; did you mean ",
                      absl::StrJoin(near, " or ",
                                    [](std::string* out, const std::string& s) {
                                      absl::StrAppend(out, "'", s, "'");
                                    }),
                      "?");
    }
    return absl::NotFoundError(msg);
  }
  std::vector<Candidate> in_file;  // the candidates of 'FILE'::NAME
  if (!file.empty()) {
    std::vector<std::string> files;
    for (const Candidate& c : it->second) {
      const absl::string_view c_file = FileOf(c);
      if (FileMatches(c_file, file)) {
        in_file.push_back(c);
      } else if (!c_file.empty() && std::find(files.begin(), files.end(), c_file) == files.end()) {
        files.emplace_back(c_file);
      }
    }
    if (in_file.empty()) {
      std::string msg = absl::StrCat("no variable '", name, "' in source file '", file, "'");
      if (!files.empty()) {
        absl::StrAppend(&msg, "; '", name, "' is defined in ", SortedList(std::move(files), 8));
      }
      return absl::NotFoundError(msg);
    }
  }
  const std::vector<Candidate>& cands = file.empty() ? it->second : in_file;
  const Candidate* chosen = nullptr;
  // The executable's global definition wins (copy relocations, interposition), as for
  // the dynamic linker.
  for (const Candidate& c : cands) {
    if (c.mod == exe_ && c.rank == kElfGlobal && !c.tls) {
      chosen = &c;
      break;
    }
  }
  if (chosen == nullptr) {
    for (const Candidate& c : cands) {
      if (chosen == nullptr || std::tie(c.tls, c.rank, c.module_index) <
                                   std::tie(chosen->tls, chosen->rank, chosen->module_index)) {
        chosen = &c;
      }
    }
  }
  // Statics of one name in several files (or functions) of a module are different objects:
  // never pick one silently. So are local symbols of one name (GCC numbers the statics of
  // functions per unit: two units may both have a `calls.0`).
  if (chosen->rank == kDwarfStatic || chosen->rank == kDwarfFunctionStatic ||
      chosen->rank == kElfLocal) {
    std::vector<const Candidate*> rivals;
    for (const Candidate& c : cands) {
      if (c.rank == chosen->rank && c.mod == chosen->mod &&
          std::none_of(rivals.begin(), rivals.end(),
                       [&](const Candidate* r) { return r->addr == c.addr; })) {
        rivals.push_back(&c);
      }
    }
    if (rivals.size() > 1) {
      std::vector<std::string> names;
      for (const Candidate* r : rivals) {
        const std::string scoped =
            chosen->rank == kDwarfFunctionStatic ? absl::StrCat(r->function, "::", name) : name;
        const absl::string_view r_file = FileOf(*r);
        std::string spelled = r_file.empty() ? scoped : absl::StrCat("'", r_file, "'::", scoped);
        // The symbol table's own name (`calls.1`), where it names this one alone.
        if (const auto renamed = renamed_at_.find(std::make_pair(r->mod, r->addr));
            renamed != renamed_at_.end() && renamed->second != name) {
          const auto named = data_.find(renamed->second);
          if (named != data_.end() &&
              std::all_of(named->second.begin(), named->second.end(), [&](const Candidate& c) {
                return c.mod != r->mod || c.addr == r->addr;
              })) {
            absl::StrAppend(&spelled, " (symbol ", renamed->second, ")");
          }
        }
        names.push_back(std::move(spelled));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("'", written, "' is ambiguous: ", rivals.size(), " statics of that name in ",
                       Basename(ModuleName(chosen->mod)), ": ", SortedList(std::move(names), 8),
                       "; write one of them"));
    }
  }
  if (chosen->tls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", name,
        "' is thread-local (each thread has its own copy): kwatch cannot watch thread-local "
        "variables by name yet; watch one thread's copy as 0xADDR:LEN"));
  }
  ExprVariable var;
  var.name = written;
  var.addr = chosen->addr;
  if (chosen->has_type) {
    var.type = chosen->type;
  }
  if (!var.type.has_value()) {
    for (const Candidate& c : cands) {
      if (c.has_type && c.mod == chosen->mod && c.addr == chosen->addr) {
        var.type = c.type;
        break;
      }
    }
  }
  if (!var.type.has_value()) {
    if (const auto d = declarations_.find(it->first); d != declarations_.end()) {
      var.type = TypeRef{d->second, 0};
    }
  }
  if (!var.type.has_value()) {
    // A symbol GCC renamed (`calls.0`): the DWARF variable at its address.
    if (const auto at = dwarf_at_.find(std::make_pair(chosen->mod, chosen->addr));
        at != dwarf_at_.end()) {
      var.type = at->second.type;
    }
  }
  if (!var.type.has_value() && chosen->rank == kElfGlobal) {
    for (const Candidate& c : cands) {
      if (c.has_type && c.rank == kDwarfExtern) {
        var.type = c.type;
        break;
      }
    }
  }
  var.elf_size = chosen->size;
  var.module = ModuleName(chosen->mod);
  return var;
}

absl::StatusOr<TypeRef> DwflSymbols::FindType(const ExprType& type) const {
  if (type.tag == ExprType::Tag::kNone && type.name == "void") {
    return absl::InvalidArgumentError(
        "void has no size or members: cast the address to a pointer to the object's type");
  }
  std::vector<int> tags;
  switch (type.tag) {
    case ExprType::Tag::kNone:
      // A typedef or a base type; a struct, union or enum named without its keyword (C++
      // spells classes so; in C, gdb would refuse it, but nothing else can be meant).
      tags = {DW_TAG_typedef, DW_TAG_base_type, DW_TAG_structure_type, DW_TAG_union_type,
              DW_TAG_enumeration_type};
      break;
    case ExprType::Tag::kStruct:
    case ExprType::Tag::kClass:
      tags = {DW_TAG_structure_type};
      break;
    case ExprType::Tag::kUnion:
      tags = {DW_TAG_union_type};
      break;
    case ExprType::Tag::kEnum:
      tags = {DW_TAG_enumeration_type};
      break;
  }
  std::vector<Dwarf*> dwarfs;
  for (Dwfl_Module* mod : modules_) {  // the executable first
    Dwarf_Addr bias = 0;
    if (Dwarf* dwarf = dwfl_module_getdwarf(mod, &bias); dwarf != nullptr) {
      dwarfs.push_back(dwarf);
    }
  }
  // A definition anywhere before a declaration (an opaque handle's) anywhere.
  for (const bool declarations : {false, true}) {
    for (Dwarf* dwarf : dwarfs) {
      for (const int tag : tags) {
        if (const std::optional<Dwarf_Die> die = FindNamedType(dwarf, tag, type.name, declarations);
            die.has_value()) {
          return TypeRef{*die, 0};
        }
      }
    }
  }
  const auto keyword = [](int tag) -> absl::string_view {
    switch (tag) {
      case DW_TAG_structure_type:
        return "struct ";
      case DW_TAG_union_type:
        return "union ";
      case DW_TAG_enumeration_type:
        return "enum ";
      default:
        return "";
    }
  };
  ExprType plain = type;
  plain.pointers = 0;
  const std::string wanted = plain.Spelling();
  std::vector<std::string> names;
  std::vector<std::string> other_tag;  // the same name with another keyword
  for (Dwarf* dwarf : dwarfs) {
    for (const int tag : {DW_TAG_typedef, DW_TAG_base_type, DW_TAG_structure_type,
                          DW_TAG_union_type, DW_TAG_enumeration_type}) {
      for (const std::string& n : NamedTypeNames(dwarf, tag)) {
        // Spelled as this lookup would take it: without a keyword, any type by its name.
        std::string spelled = type.tag == ExprType::Tag::kNone ? n : absl::StrCat(keyword(tag), n);
        if (n == type.name) {
          other_tag.push_back(spelled);
        }
        names.push_back(std::move(spelled));
      }
    }
  }
  std::vector<std::string> near = NearMatches(wanted, names, 3);
  near.insert(near.begin(), other_tag.begin(), other_tag.end());
  std::string msg = absl::StrCat("no type '", wanted, "' in the debug info of ", ModuleList());
  if (!near.empty()) {
    near.erase(std::unique(near.begin(), near.end()), near.end());
    if (near.size() > 3) {
      near.resize(3);
    }
    absl::StrAppend(&msg, " (did you mean ",
                    absl::StrJoin(near, " or ",
                                  [](std::string* out, const std::string& s) {
                                    absl::StrAppend(out, "'", s, "'");
                                  }),
                    "?)");
  }
  return absl::NotFoundError(msg);
}

absl::StatusOr<ResolvedExpr> DwflSymbols::Resolve(const Expr& expr,
                                                  const MemoryReader& read) const {
  return ResolveExpr(
      expr,
      [this](const std::string& name) {
        EnsureIndex();
        return Variable(name);
      },
      read,
      [this](const ExprType& type) {
        EnsureIndex();
        return FindType(type);
      });
}

std::optional<FunctionSymbol> DwflSymbols::FunctionAt(RemoteAddr addr) const {
  Dwfl_Module* mod = dwfl_addrmodule(dwfl_.get(), addr.value);
  if (mod == nullptr) {
    return std::nullopt;
  }
  const ElfSymbolIndex& elf = ElfIndexOf(mod);
  const ElfSymbol* sym = elf.FunctionAt(addr.value - elf.bias());
  if (sym == nullptr) {
    return std::nullopt;
  }
  FunctionSymbol f;
  f.name = std::string(sym->name);
  f.start = RemoteAddr{sym->addr + elf.bias()};
  f.size = sym->size;
  f.module = ModuleName(mod);
  return f;
}

std::optional<SourceLine> DwflSymbols::LineAt(RemoteAddr addr) const {
  Dwfl_Module* mod = dwfl_addrmodule(dwfl_.get(), addr.value);
  if (mod == nullptr) {
    return std::nullopt;
  }
  Dwfl_Line* line = StatementLineAt(mod, addr.value);
  if (line == nullptr) {
    return std::nullopt;
  }
  int lineno = 0;
  const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
  if (file == nullptr) {
    return std::nullopt;
  }
  SourceLine out;
  out.file = file;
  out.line = lineno;
  Dwarf_Addr bias = 0;
  Dwarf_Die* cudie = dwfl_module_addrdie(mod, addr.value, &bias);
  if (cudie != nullptr) {
    // The innermost inlined subroutine containing the address.
    const Dwarf_Addr rel = addr.value - bias;
    int best = -1;
    for (const InlineRange& r : InlineRangesOf(mod, cudie)) {
      if (rel >= r.lo && rel < r.hi && r.depth > best) {
        best = r.depth;
        out.inlined_function = r.name;
      }
    }
  }
  return out;
}

const std::vector<DwflSymbols::InlineRange>& DwflSymbols::InlineRangesOf(Dwfl_Module* mod,
                                                                         Dwarf_Die* cudie) const {
  const auto key = std::make_pair(mod, dwarf_dieoffset(cudie));
  auto it = inline_ranges_.find(key);
  if (it != inline_ranges_.end()) {
    return it->second;
  }
  std::vector<InlineRange>& out = inline_ranges_[key];
  // Depth-first over the CU's DIEs, keeping the nesting depth of inlined subroutines.
  std::function<void(Dwarf_Die*, int)> walk = [&](Dwarf_Die* parent, int depth) {
    Dwarf_Die child;
    if (dwarf_child(parent, &child) != 0) {
      return;
    }
    do {
      const int tag = dwarf_tag(&child);
      int next_depth = depth;
      if (tag == DW_TAG_inlined_subroutine) {
        const std::string name = DieName(child);
        Dwarf_Addr base = 0;
        Dwarf_Addr lo = 0;
        Dwarf_Addr hi = 0;
        ptrdiff_t off = 0;
        while ((off = dwarf_ranges(&child, off, &base, &lo, &hi)) > 0) {
          out.push_back(InlineRange{lo, hi, depth + 1, name});
        }
        next_depth = depth + 1;
      }
      if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine ||
          tag == DW_TAG_lexical_block || tag == DW_TAG_namespace || tag == DW_TAG_class_type ||
          tag == DW_TAG_structure_type) {
        walk(&child, next_depth);
      }
    } while (dwarf_siblingof(&child, &child) == 0);
  };
  walk(cudie, 0);
  return out;
}

absl::Status DwflSymbols::ReadCode(RemoteAddr addr, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const uint64_t at = addr.value + done;
    Dwfl_Module* mod = dwfl_addrmodule(dwfl_.get(), at);
    if (mod == nullptr) {
      return absl::NotFoundError(absl::StrFormat("no module of the target maps 0x%x", at));
    }
    const ElfSymbolIndex& elf = ElfIndexOf(mod);
    if (elf.elf() == nullptr) {
      GElf_Addr bias = 0;
      (void)dwfl_module_getelf(mod, &bias);  // again, for its error
      return DwflError(absl::StrCat("dwfl_module_getelf(", ModuleName(mod), ")"));
    }
    const uint64_t file_addr = at - elf.bias();
    const ElfSection* scn = elf.SectionWithBytesAt(file_addr);
    if (scn == nullptr) {
      return absl::NotFoundError(absl::StrFormat("0x%x is not in a section with contents of %s", at,
                                                 Basename(ModuleName(mod))));
    }
    const absl::StatusOr<std::span<const uint8_t>> bytes = elf.SectionBytes(*scn);
    const uint64_t in_scn = file_addr - scn->addr;
    if (!bytes.ok() || in_scn >= bytes->size()) {
      return absl::InternalError(
          absl::StrFormat("elf_getdata(%s, 0x%x): %s", ModuleName(mod), scn->addr,
                          bytes.ok() ? elf_errmsg(-1) : bytes.status().message()));
    }
    const size_t n = std::min<uint64_t>(out.size() - done, bytes->size() - in_scn);
    std::memcpy(out.data() + done, bytes->data() + in_scn, n);
    done += n;
  }
  return absl::OkStatus();
}

std::optional<FunctionSymbol> DwflSymbols::FindFunction(std::string_view name) const {
  EnsureIndex();
  for (Dwfl_Module* mod : modules_) {  // the executable first
    const ElfSymbolIndex& elf = ElfIndexOf(mod);
    if (const ElfSymbol* sym = elf.Find(name, kFunctionSymbols); sym != nullptr) {
      FunctionSymbol f;
      f.name = std::string(sym->bare_name());
      f.start = RemoteAddr{sym->addr + elf.bias()};
      f.size = sym->size;
      f.module = ModuleName(mod);
      return f;
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<RemoteAddr>> DwflSymbols::AddressesOfLine(std::string_view file,
                                                                     int line,
                                                                     bool statements) const {
  EnsureIndex();
  const std::string fname(file);
  std::vector<RemoteAddr> out;
  std::vector<RemoteAddr> stmts;
  for (Dwfl_Module* mod : modules_) {
    Dwfl_Line** lines = nullptr;
    size_t n = 0;
    if (dwfl_module_getsrc_file(mod, fname.c_str(), line, 0, &lines, &n) != 0) {
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      Dwarf_Addr a = 0;
      int found_line = 0;
      if (dwfl_lineinfo(lines[i], &a, &found_line, nullptr, nullptr, nullptr) != nullptr &&
          found_line == line) {
        out.push_back(RemoteAddr{a});
        Dwarf_Addr bias = 0;
        bool stmt = false;
        Dwarf_Line* dl = dwfl_dwarf_line(lines[i], &bias);
        if (dl != nullptr && dwarf_linebeginstatement(dl, &stmt) == 0 && stmt) {
          stmts.push_back(RemoteAddr{a});
        }
      }
    }
    free(lines);  // NOLINT(cppcoreguidelines-no-malloc): allocated by libdwfl
  }
  if (out.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no code for ", fname, ":", line, " in ", ModuleList()));
  }
  if (statements && !stmts.empty()) {
    out = std::move(stmts);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Callbacks must outlive every Dwfl that uses them.
char* g_debuginfo_path = nullptr;

const Dwfl_Callbacks kFileCallbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &g_debuginfo_path,
};

}  // namespace

absl::StatusOr<std::unique_ptr<Symbols>> Symbols::ForProcess(pid_t pid) {
  // The files as the process maps them, in its filesystem (a container's): process_elf.h.
  auto finder = std::make_unique<ProcessElfFinder>(pid);
  DwflPtr dwfl(dwfl_begin(finder->callbacks()));
  if (dwfl == nullptr) {
    return DwflError("dwfl_begin");
  }
  dwfl_report_begin(dwfl.get());
  const int r = dwfl_linux_proc_report(dwfl.get(), pid);
  if (r > 0) {
    return absl::ErrnoToStatus(
        r, absl::StrCat("dwfl_linux_proc_report(", pid, "): reading /proc/", pid, "/maps"));
  }
  if (r < 0) {
    return DwflError(absl::StrCat("dwfl_linux_proc_report(", pid, ")"));
  }
  if (dwfl_report_end(dwfl.get(), nullptr, nullptr) != 0) {
    return DwflError("dwfl_report_end");
  }
  finder->Adopt(dwfl.get());
  std::string exe = core::ExecutableLink(pid).value_or("");
  auto symbols = std::make_unique<DwflSymbols>(std::move(dwfl), std::move(exe), std::move(finder));
  // Open every file and index now, while /proc/PID still exists (the vdso is read from the
  // process), so that the symbols stay usable after the process exits.
  symbols->EnsureIndex();
  return std::unique_ptr<Symbols>(std::move(symbols));
}

absl::StatusOr<std::unique_ptr<Symbols>> Symbols::ForFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("open(", path, ")"));
  }
  DwflPtr dwfl(dwfl_begin(&kFileCallbacks));
  if (dwfl == nullptr) {
    close(fd);
    return DwflError("dwfl_begin");
  }
  dwfl_report_begin(dwfl.get());
  // Base 0 without p_vaddr: a PIE keeps its link-time addresses (bias 0). On success the
  // fd belongs to libdwfl.
  if (dwfl_report_elf(dwfl.get(), path.c_str(), path.c_str(), fd, 0, false) == nullptr) {
    absl::Status s = DwflError(absl::StrCat("dwfl_report_elf(", path, ")"));
    close(fd);
    return s;
  }
  if (dwfl_report_end(dwfl.get(), nullptr, nullptr) != 0) {
    return DwflError("dwfl_report_end");
  }
  return std::unique_ptr<Symbols>(std::make_unique<DwflSymbols>(std::move(dwfl), path));
}

}  // namespace kwatch::core::symbols
