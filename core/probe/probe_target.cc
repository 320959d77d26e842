#include "core/probe/probe_target.h"

#include <Zydis/Zydis.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <gelf.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/status_macros.h"
#include "core/symbols/dwarf_types.h"
#include "core/symbols/elf_index.h"
#include "core/symbols/line_table.h"
#include "core/x86/format.h"

namespace kwatch::core::probe {
namespace {

constexpr uint64_t kMaxDecodeBytes = 1 << 20;
constexpr uint64_t kPageSize = 4096;

std::string Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

// `full` (a DWARF path) names the file the user wrote: equal, or ending in "/" + user.
bool FileMatches(absl::string_view full, absl::string_view user) {
  return full == user || absl::EndsWith(full, absl::StrCat("/", user));
}

// perf's event base: the name up to a '.' or '@' ("f.constprop.0" -> "f").
std::string EventBase(absl::string_view name) {
  const size_t cut = name.find_first_of(".@");
  return std::string(cut == absl::string_view::npos || cut == 0 ? name : name.substr(0, cut));
}

std::string QuoteList(const std::vector<std::string>& names) {
  return absl::StrJoin(names, " or ", [](std::string* out, const std::string& s) {
    absl::StrAppend(out, "'", s, "'");
  });
}

struct Segment {
  uint64_t vaddr = 0;
  uint64_t memsz = 0;
  uint64_t offset = 0;
  uint64_t filesz = 0;
  bool exec = false;
};

struct FunctionInfo {
  std::string name;
  uint64_t start = 0;  // link-time vaddr
  uint64_t size = 0;
  bool has_die = false;
  Dwarf_Die die{};
  std::string decl_file;  // "" without DWARF
  int decl_line = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [lo, hi) link-time vaddrs

  bool Contains(uint64_t vaddr) const {
    if (ranges.empty()) {
      return vaddr >= start && vaddr - start < std::max<uint64_t>(size, 1);
    }
    return std::any_of(ranges.begin(), ranges.end(),
                       [vaddr](const auto& r) { return vaddr >= r.first && vaddr < r.second; });
  }
};

struct LineRow {
  uint64_t vaddr = 0;
  int line = 0;
  uint32_t file = 0;  // index into Impl::files
  bool is_stmt = false;
};

struct Insn {
  std::string text;
  uint8_t length = 0;
};

// Lines of one source file, or nullopt when it cannot be read.
std::optional<std::vector<std::string>> ReadSource(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return std::nullopt;
  }
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
  }
  return lines;
}

// Glob (* and ?) over `text` with blanks ignored on both sides, as perf's lazy lines.
bool LazyMatch(absl::string_view text, absl::string_view pattern) {
  std::string t;
  std::string p;
  for (const char c : text) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) {
      t.push_back(c);
    }
  }
  for (const char c : pattern) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) {
      p.push_back(c);
    }
  }
  size_t ti = 0;
  size_t pi = 0;
  size_t star = std::string::npos;
  size_t mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++ti;
      ++pi;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (star != std::string::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') {
    ++pi;
  }
  return pi == p.size();
}

// A DWARF file name made absolute with the compilation directory of `cu`.
std::string SourcePath(Dwarf_Die* cu, const char* file) {
  if (file == nullptr) {
    return "";
  }
  Dwarf_Attribute attr;
  const char* dir = cu == nullptr || file[0] == '/'
                        ? nullptr
                        : dwarf_formstring(dwarf_attr(cu, DW_AT_comp_dir, &attr));
  return dir == nullptr ? std::string(file) : absl::StrCat(dir, "/", file);
}

int CollectFunc(Dwarf_Die* die, void* arg) {
  static_cast<std::vector<Dwarf_Die>*>(arg)->push_back(*die);
  return DWARF_CB_OK;
}

}  // namespace

struct ProbeTarget::Impl {
  symbols::DwflPtr dwfl;
  Dwfl_Module* mod = nullptr;
  Elf* elf = nullptr;
  uint64_t elf_bias = 0;  // Dwfl address = link-time vaddr + elf_bias
  std::string path;
  dev_t dev = 0;
  ino_t ino = 0;
  std::vector<Segment> segments;
  std::vector<FunctionInfo> functions;
  absl::flat_hash_map<std::string, std::vector<size_t>> by_name;
  absl::flat_hash_set<std::string> inline_only;
  std::unique_ptr<symbols::ElfSymbolIndex> elf_symbols;
  std::vector<std::string> files;
  std::vector<LineRow> rows;  // by vaddr

  void IndexElf();
  void IndexDwarf();
  void IndexLines();

  const FunctionInfo* FunctionContaining(uint64_t vaddr) const;
  absl::StatusOr<std::vector<const FunctionInfo*>> FindFunctions(const ProbePoint& p) const;
  // Bytes of the file image at [vaddr, vaddr + out.size()).
  absl::Status ReadImage(uint64_t vaddr, std::span<uint8_t> out) const;
  // The instruction at vaddr, checking that decoding from the function's start lands there.
  absl::StatusOr<Insn> DecodeAt(const FunctionInfo* f, uint64_t vaddr) const;
  absl::StatusOr<ResolvedPoint> MakePoint(const FunctionInfo* f, uint64_t vaddr,
                                          bool is_return) const;
  // Line rows of `f` in its declaration file: line -> lowest address (is_stmt rows first).
  std::map<int, uint64_t> FunctionLines(const FunctionInfo& f) const;
  absl::StatusOr<std::vector<ResolvedPoint>> ResolveFunction(const ProbePoint& p) const;
  absl::StatusOr<std::vector<ResolvedPoint>> ResolveSource(const ProbePoint& p) const;
  absl::StatusOr<std::vector<ResolvedPoint>> ResolveAddress(const ProbePoint& p) const;
  // The probe's own function names (ELF and DWARF), and those only ever inlined.
  std::vector<std::string> AllFunctionNames() const;
};

void ProbeTarget::Impl::IndexElf() {
  elf_symbols = std::make_unique<symbols::ElfSymbolIndex>(symbols::ElfSymbolIndex::FromModule(mod));
  for (const symbols::ElfSymbol& sym : elf_symbols->symbols()) {
    if (!sym.is_function()) {
      continue;
    }
    std::string name(sym.name);
    bool seen = false;
    for (const size_t idx : by_name[name]) {
      seen = seen || functions[idx].start == sym.addr;
    }
    if (seen) {
      continue;
    }
    FunctionInfo f;
    f.name = name;
    f.start = sym.addr;
    f.size = sym.size;
    by_name[name].push_back(functions.size());
    functions.push_back(std::move(f));
  }
}

void ProbeTarget::Impl::IndexDwarf() {
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = nullptr;
  while ((cu = dwfl_module_nextcu(mod, cu, &bias)) != nullptr) {
    std::vector<Dwarf_Die> dies;
    dwarf_getfuncs(cu, CollectFunc, &dies, 0);
    for (Dwarf_Die& die : dies) {
      const std::string name = symbols::DieName(die);
      if (name.empty()) {
        continue;
      }
      Dwarf_Addr entry = 0;
      if (dwarf_entrypc(&die, &entry) != 0) {
        if (dwarf_hasattr_integrate(&die, DW_AT_inline) != 0) {
          inline_only.insert(name);
        }
        continue;
      }
      const uint64_t start = entry + bias - elf_bias;
      FunctionInfo* f = nullptr;
      for (const size_t idx : by_name[name]) {
        if (functions[idx].start == start) {
          f = &functions[idx];
        }
      }
      if (f == nullptr) {
        by_name[name].push_back(functions.size());
        functions.emplace_back();
        f = &functions.back();
        f->name = name;
        f->start = start;
      }
      f->has_die = true;
      f->die = die;
      f->decl_file = SourcePath(cu, dwarf_decl_file(&die));
      dwarf_decl_line(&die, &f->decl_line);
      Dwarf_Addr base = 0;
      Dwarf_Addr lo = 0;
      Dwarf_Addr hi = 0;
      ptrdiff_t off = 0;
      while ((off = dwarf_ranges(&die, off, &base, &lo, &hi)) > 0) {
        f->ranges.emplace_back(lo + bias - elf_bias, hi + bias - elf_bias);
        if (f->size == 0 && lo + bias - elf_bias == start) {
          f->size = hi - lo;
        }
      }
    }
  }
}

void ProbeTarget::Impl::IndexLines() {
  absl::flat_hash_map<std::string, uint32_t> file_ids;
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = nullptr;
  while ((cu = dwfl_module_nextcu(mod, cu, &bias)) != nullptr) {
    Dwarf_Lines* lines = nullptr;
    size_t n = 0;
    if (dwarf_getsrclines(cu, &lines, &n) != 0) {
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      Dwarf_Line* line = dwarf_onesrcline(lines, i);
      Dwarf_Addr addr = 0;
      int lineno = 0;
      bool end = false;
      bool stmt = false;
      if (line == nullptr || dwarf_lineaddr(line, &addr) != 0 || dwarf_lineno(line, &lineno) != 0 ||
          dwarf_lineendsequence(line, &end) != 0 || end || lineno <= 0) {
        continue;
      }
      dwarf_linebeginstatement(line, &stmt);
      const char* src = dwarf_linesrc(line, nullptr, nullptr);
      if (src == nullptr) {
        continue;
      }
      std::string path = SourcePath(cu, src);
      const auto [it, added] = file_ids.try_emplace(path, static_cast<uint32_t>(files.size()));
      if (added) {
        files.push_back(std::move(path));
      }
      rows.push_back(LineRow{addr + bias - elf_bias, lineno, it->second, stmt});
    }
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const LineRow& a, const LineRow& b) { return a.vaddr < b.vaddr; });
}

const FunctionInfo* ProbeTarget::Impl::FunctionContaining(uint64_t vaddr) const {
  const FunctionInfo* best = nullptr;
  for (const FunctionInfo& f : functions) {
    if (f.Contains(vaddr) && (best == nullptr || (f.has_die && !best->has_die))) {
      best = &f;
    }
  }
  return best;
}

std::vector<std::string> ProbeTarget::Impl::AllFunctionNames() const {
  std::vector<std::string> names;
  names.reserve(by_name.size() + inline_only.size());
  for (const auto& [name, unused] : by_name) {
    names.push_back(name);
  }
  for (const std::string& name : inline_only) {
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::vector<const FunctionInfo*>> ProbeTarget::Impl::FindFunctions(
    const ProbePoint& p) const {
  std::vector<const FunctionInfo*> out;
  std::vector<std::string> elsewhere;
  if (const auto it = by_name.find(p.function); it != by_name.end()) {
    for (const size_t idx : it->second) {
      const FunctionInfo& f = functions[idx];
      if (p.file.empty() || FileMatches(f.decl_file, p.file)) {
        out.push_back(&f);
      } else {
        elsewhere.push_back(f.decl_file.empty() ? "a file without debug info" : f.decl_file);
      }
    }
  }
  if (!out.empty()) {
    return out;
  }
  if (!elsewhere.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no function '", p.function, "' in a source file matching '", p.file, "' of ",
                     Basename(path), " (it is in ", absl::StrJoin(elsewhere, ", "), ")"));
  }
  if (inline_only.contains(p.function)) {
    return absl::NotFoundError(
        absl::StrCat("'", p.function, "' is always inlined in ", Basename(path),
                     " (no code of its own): probe one of its lines instead (SRC:LINE)"));
  }
  std::string msg = absl::StrCat("unknown function '", p.function, "' in ", Basename(path));
  const std::vector<std::string> near =
      elf_symbols->NearNames(p.function, 3, symbols::kFunctionSymbols, AllFunctionNames());
  if (!near.empty()) {
    absl::StrAppend(&msg, "; did you mean ", QuoteList(near), "?");
  }
  return absl::NotFoundError(msg);
}

absl::Status ProbeTarget::Impl::ReadImage(uint64_t vaddr, std::span<uint8_t> out) const {
  size_t raw_size = 0;
  const char* raw = elf_rawfile(elf, &raw_size);
  for (const Segment& s : segments) {
    if (vaddr < s.vaddr || vaddr - s.vaddr >= s.filesz) {
      continue;
    }
    const uint64_t off = s.offset + (vaddr - s.vaddr);
    if (raw == nullptr || vaddr - s.vaddr + out.size() > s.filesz || off + out.size() > raw_size) {
      break;
    }
    std::memcpy(out.data(), raw + off, out.size());
    return absl::OkStatus();
  }
  return absl::OutOfRangeError(
      absl::StrFormat("0x%x is not in a loaded part of %s", vaddr, Basename(path)));
}

absl::StatusOr<Insn> ProbeTarget::Impl::DecodeAt(const FunctionInfo* f, uint64_t vaddr) const {
  ZydisDecoder decoder;
  if (!ZYAN_SUCCESS(ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64))) {
    return absl::InternalError("ZydisDecoderInit failed");
  }
  // Decode from the function's start (or the address itself) to just past vaddr.
  const uint64_t from =
      f != nullptr && vaddr >= f->start && vaddr - f->start < kMaxDecodeBytes ? f->start : vaddr;
  std::vector<uint8_t> code(vaddr - from + ZYDIS_MAX_INSTRUCTION_LENGTH);
  // Near the end of a segment fewer bytes exist: shrink until the read succeeds.
  absl::Status read = ReadImage(from, std::span<uint8_t>(code));
  while (!read.ok() && code.size() > vaddr - from + 1) {
    code.pop_back();
    read = ReadImage(from, std::span<uint8_t>(code));
  }
  KW_RETURN_IF_ERROR(read);
  ZydisDecodedInstruction insn;
  std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> ops{};
  uint64_t at = 0;
  for (;;) {
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code.data() + at, code.size() - at, &insn,
                                             ops.data()))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot decode an instruction at %s+0x%x (data in the code?)",
                          f != nullptr ? f->name : "", from + at - (f != nullptr ? f->start : 0)));
    }
    if (from + at == vaddr) {
      return Insn{x86::FormatAtt(insn, ops.data(), vaddr), insn.length};
    }
    if (from + at + insn.length > vaddr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s+0x%x is inside '%s' at %s+0x%x: probe an instruction boundary",
                          f->name, vaddr - f->start, x86::FormatAtt(insn, ops.data(), from + at),
                          f->name, from + at - f->start));
    }
    at += insn.length;
  }
}

absl::StatusOr<ResolvedPoint> ProbeTarget::Impl::MakePoint(const FunctionInfo* f, uint64_t vaddr,
                                                           bool is_return) const {
  ResolvedPoint p;
  p.vaddr = RemoteAddr{vaddr};
  p.is_return = is_return;
  if (f != nullptr) {
    p.function = f->name;
    p.function_start = RemoteAddr{f->start};
    p.offset = vaddr - f->start;
  }
  bool exec = false;
  for (const Segment& s : segments) {
    if (vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz) {
      p.file_offset = s.offset + (vaddr - s.vaddr);
      exec = s.exec;
    }
  }
  if (!exec) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "0x%x is not in an executable segment of %s: give a code address", vaddr, Basename(path)));
  }
  if (Dwfl_Line* line = symbols::StatementLineAt(mod, vaddr + elf_bias); line != nullptr) {
    int lineno = 0;
    const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
    if (file != nullptr) {
      p.file = SourcePath(dwfl_linecu(line), file);
      p.line = lineno;
    }
  }
  KW_ASSIGN_OR_RETURN(const Insn insn, DecodeAt(f, vaddr));
  p.insn_text = insn.text;
  p.insn_len = insn.length;
  return p;
}

std::map<int, uint64_t> ProbeTarget::Impl::FunctionLines(const FunctionInfo& f) const {
  std::map<int, uint64_t> stmt;
  std::map<int, uint64_t> any;
  for (const LineRow& r : rows) {
    if (!f.Contains(r.vaddr) || files[r.file] != f.decl_file) {
      continue;
    }
    any.try_emplace(r.line, r.vaddr);
    if (r.is_stmt) {
      stmt.try_emplace(r.line, r.vaddr);  // rows are by address: the first is the lowest
    }
  }
  for (const auto& [line, addr] : any) {
    stmt.try_emplace(line, addr);
  }
  return stmt;
}

// "nearest lines with code: 11, 14" around `line` among `lines`, shifted by `base`.
std::string NearestLines(const std::set<int>& lines, int line, int base) {
  std::vector<std::string> near;
  const auto above = lines.lower_bound(line);
  if (above != lines.begin()) {
    near.push_back(absl::StrCat(*std::prev(above) - base));
  }
  if (above != lines.end()) {
    near.push_back(absl::StrCat(*above - base));
  }
  if (near.empty()) {
    return "no line has code";
  }
  return absl::StrCat(near.size() == 1 ? "nearest line with code: " : "nearest lines with code: ",
                      absl::StrJoin(near, ", "));
}

absl::StatusOr<std::vector<ResolvedPoint>> ProbeTarget::Impl::ResolveFunction(
    const ProbePoint& p) const {
  KW_ASSIGN_OR_RETURN(const std::vector<const FunctionInfo*> found, FindFunctions(p));
  std::vector<ResolvedPoint> out;
  for (const FunctionInfo* f : found) {
    const std::string base = EventBase(f->name);
    if (p.line.has_value() || !p.pattern.empty()) {
      if (!f->has_die || f->decl_file.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("'", f->name, "' has no line information (was ", Basename(path),
                         " built with -g?): probe FUNC or FUNC+OFF instead"));
      }
      const std::map<int, uint64_t> lines = FunctionLines(*f);
      std::set<int> with_code;
      for (const auto& [line, addr] : lines) {
        with_code.insert(line);
      }
      if (!p.pattern.empty()) {
        const std::optional<std::vector<std::string>> src = ReadSource(f->decl_file);
        if (!src.has_value()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "cannot read ", f->decl_file, " to match the pattern '", p.pattern, "'"));
        }
        for (const auto& [line, addr] : lines) {
          if (static_cast<size_t>(line) <= src->size() && LazyMatch((*src)[line - 1], p.pattern)) {
            KW_ASSIGN_OR_RETURN(ResolvedPoint rp, MakePoint(f, addr, false));
            rp.event = absl::StrCat(base, "_L", line - f->decl_line);
            out.push_back(std::move(rp));
          }
        }
        continue;
      }
      const int line = f->decl_line + *p.line;
      const auto it = lines.find(line);
      if (it == lines.end()) {
        const std::string at =
            absl::StrCat(f->name, ":", *p.line, " (", Basename(f->decl_file), ":", line, ")");
        if (with_code.empty() || line > *with_code.rbegin()) {
          return absl::NotFoundError(
              absl::StrCat(at, " is past the end of ", f->name, " (its last line is ", f->name, ":",
                           with_code.empty() ? 0 : *with_code.rbegin() - f->decl_line, ")"));
        }
        return absl::NotFoundError(
            absl::StrCat("no code at ", at, "; ", NearestLines(with_code, line, f->decl_line)));
      }
      KW_ASSIGN_OR_RETURN(ResolvedPoint rp, MakePoint(f, it->second, false));
      rp.event = absl::StrCat(base, "_L", *p.line);
      out.push_back(std::move(rp));
      continue;
    }
    if (f->size != 0 && p.offset >= f->size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s+0x%x is past the end of %s (its size is 0x%x bytes)", f->name,
                          p.offset, f->name, f->size));
    }
    if (f->size == 0 && p.offset != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s has no known size: only %s itself (offset 0) can be probed", f->name, f->name));
    }
    KW_ASSIGN_OR_RETURN(ResolvedPoint rp, MakePoint(f, f->start + p.offset, p.is_return));
    rp.event = p.is_return ? absl::StrCat(base, "__return") : base;
    out.push_back(std::move(rp));
  }
  if (out.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no line of ", p.function, " matches the pattern '", p.pattern, "'"));
  }
  return out;
}

absl::StatusOr<std::vector<ResolvedPoint>> ProbeTarget::Impl::ResolveSource(
    const ProbePoint& p) const {
  std::vector<bool> file_ok(files.size());
  bool any_file = false;
  for (size_t i = 0; i < files.size(); ++i) {
    file_ok[i] = FileMatches(files[i], p.file);
    any_file = any_file || file_ok[i];
  }
  if (!any_file) {
    std::set<std::string> names;
    for (const std::string& f : files) {
      names.insert(Basename(f));
    }
    return absl::NotFoundError(
        absl::StrCat("no source file matching '", p.file, "' in the line table of ", Basename(path),
                     names.empty() ? " (it has none: built without -g?)"
                                   : absl::StrCat(" (files: ", absl::StrJoin(names, ", "), ")")));
  }
  // Per function: line -> lowest address, is_stmt rows first.
  std::map<std::pair<const FunctionInfo*, int>, std::pair<bool, uint64_t>> found;
  std::set<int> with_code;
  std::map<uint32_t, std::optional<std::vector<std::string>>> sources;
  for (const LineRow& r : rows) {
    if (!file_ok[r.file]) {
      continue;
    }
    with_code.insert(r.line);
    bool wanted = p.line.has_value() && r.line == *p.line;
    if (!p.pattern.empty()) {
      auto [src, added] = sources.try_emplace(r.file);
      if (added) {
        src->second = ReadSource(files[r.file]);
      }
      wanted = src->second.has_value() && static_cast<size_t>(r.line) <= src->second->size() &&
               LazyMatch((*src->second)[r.line - 1], p.pattern);
    }
    const FunctionInfo* f = wanted ? FunctionContaining(r.vaddr) : nullptr;
    if (f == nullptr) {
      continue;
    }
    auto [it, added] = found.try_emplace({f, r.line}, r.is_stmt, r.vaddr);
    if (!added && r.is_stmt && !it->second.first) {
      it->second = {true, r.vaddr};
    }
  }
  if (found.empty()) {
    if (!p.pattern.empty()) {
      for (const auto& [id, src] : sources) {
        if (!src.has_value()) {
          return absl::FailedPreconditionError(
              absl::StrCat("cannot read ", files[id], " to match the pattern '", p.pattern, "'"));
        }
      }
      return absl::NotFoundError(
          absl::StrCat("no line with code in ", p.file, " matches the pattern '", p.pattern, "'"));
    }
    return absl::NotFoundError(absl::StrCat("no code at ", p.file, ":", *p.line, "; ",
                                            NearestLines(with_code, *p.line, 0)));
  }
  std::vector<ResolvedPoint> out;
  for (const auto& [key, value] : found) {
    KW_ASSIGN_OR_RETURN(ResolvedPoint rp, MakePoint(key.first, value.second, false));
    rp.event = absl::StrCat(EventBase(key.first->name), "_L", key.second);
    out.push_back(std::move(rp));
  }
  std::sort(out.begin(), out.end(),
            [](const ResolvedPoint& a, const ResolvedPoint& b) { return a.vaddr < b.vaddr; });
  return out;
}

absl::StatusOr<std::vector<ResolvedPoint>> ProbeTarget::Impl::ResolveAddress(
    const ProbePoint& p) const {
  const FunctionInfo* f = FunctionContaining(p.address);
  KW_ASSIGN_OR_RETURN(ResolvedPoint rp, MakePoint(f, p.address, false));
  rp.event = absl::StrFormat("abs_%x", p.address);
  return std::vector<ResolvedPoint>{std::move(rp)};
}

std::string ResolvedPoint::Where() const {
  if (function.empty()) {
    return absl::StrFormat("0x%x", vaddr.value);
  }
  return offset == 0 ? function : absl::StrFormat("%s+0x%x", function, offset);
}

ProbeTarget::ProbeTarget(std::unique_ptr<Impl> impl) : path_(impl->path), impl_(std::move(impl)) {}

ProbeTarget::~ProbeTarget() = default;

namespace {

char* g_debuginfo_path = nullptr;

constexpr Dwfl_Callbacks kOfflineCallbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &g_debuginfo_path,
};

}  // namespace

absl::StatusOr<std::unique_ptr<ProbeTarget>> ProbeTarget::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("stat(", path, ")"));
  }
  impl->dev = st.st_dev;
  impl->ino = st.st_ino;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("open(", path, ")"));
  }
  impl->dwfl.reset(dwfl_begin(&kOfflineCallbacks));
  if (impl->dwfl == nullptr) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("dwfl_begin: ", dwfl_errmsg(-1)));
  }
  dwfl_report_begin(impl->dwfl.get());
  // On success the fd belongs to libdwfl.
  impl->mod = dwfl_report_offline(impl->dwfl.get(), path.c_str(), path.c_str(), fd);
  if (impl->mod == nullptr) {
    const std::string why = dwfl_errmsg(-1);
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not an ELF file kwatch can probe: ", why));
  }
  if (dwfl_report_end(impl->dwfl.get(), nullptr, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("dwfl_report_end: ", dwfl_errmsg(-1)));
  }
  GElf_Addr bias = 0;
  impl->elf = dwfl_module_getelf(impl->mod, &bias);
  if (impl->elf == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("dwfl_module_getelf(", path, "): ", dwfl_errmsg(-1)));
  }
  impl->elf_bias = bias;
  size_t phnum = 0;
  if (elf_getphdrnum(impl->elf, &phnum) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has no program headers: ", elf_errmsg(-1)));
  }
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(impl->elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD) {
      impl->segments.push_back(
          Segment{ph.p_vaddr, ph.p_memsz, ph.p_offset, ph.p_filesz, (ph.p_flags & PF_X) != 0});
    }
  }
  impl->IndexElf();
  impl->IndexDwarf();
  impl->IndexLines();
  return std::unique_ptr<ProbeTarget>(new ProbeTarget(std::move(impl)));
}

absl::StatusOr<std::vector<ResolvedPoint>> ProbeTarget::Resolve(const ProbePoint& point) const {
  absl::StatusOr<std::vector<ResolvedPoint>> out;
  switch (point.kind) {
    case ProbePoint::Kind::kFunction:
      out = impl_->ResolveFunction(point);
      break;
    case ProbePoint::Kind::kSourceLine:
      out = impl_->ResolveSource(point);
      break;
    case ProbePoint::Kind::kAddress:
      out = impl_->ResolveAddress(point);
      break;
  }
  if (!out.ok()) {
    return out.status();
  }
  // Names as perf: EVENT (or the default), then EVENT_1, EVENT_2...
  for (size_t i = 0; i < out->size(); ++i) {
    ResolvedPoint& p = (*out)[i];
    if (!point.event.empty()) {
      p.event = point.event;
    }
    if (i > 0) {
      absl::StrAppend(&p.event, "_", i);
    }
    p.group = point.group;
  }
  return out;
}

absl::StatusOr<std::vector<LineListing>> ProbeTarget::ListLines(const ProbePoint& point) const {
  if (point.kind != ProbePoint::Kind::kFunction) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", point.text, "' is not a function: list lines of FUNC or FUNC@SRC"));
  }
  KW_ASSIGN_OR_RETURN(const std::vector<const FunctionInfo*> found, impl_->FindFunctions(point));
  std::vector<LineListing> out;
  for (const FunctionInfo* f : found) {
    if (!f->has_die || f->decl_file.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", f->name, "' has no line information (was ", Basename(path_), " built with -g?)"));
    }
    const std::map<int, uint64_t> lines = impl_->FunctionLines(*f);
    LineListing listing;
    listing.function = f->name;
    listing.file = f->decl_file;
    const std::optional<std::vector<std::string>> src = ReadSource(f->decl_file);
    listing.have_source = src.has_value();
    const int last = lines.empty() ? f->decl_line : std::max(f->decl_line, lines.rbegin()->first);
    // A line table may name any line ('#line 1600000000', a damaged file): listing every line
    // up to it took minutes and gigabytes. At most 100000 lines; the loop counts in int64_t.
    constexpr int64_t kMaxListedLines = 100000;
    if (int64_t{last} - f->decl_line >= kMaxListedLines) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", f->name, "' spans lines ", f->decl_line, " to ", last, " of ", f->decl_file,
          " in the line table: more than ", kMaxListedLines, " lines to list"));
    }
    for (int64_t line = f->decl_line; line <= last; ++line) {
      ListedLine l;
      l.line = static_cast<int>(line);
      l.relative = static_cast<int>(line - f->decl_line);
      l.has_code = lines.contains(l.line);
      if (src.has_value() && line >= 1 && static_cast<size_t>(line) <= src->size()) {
        l.text = (*src)[line - 1];
      }
      listing.lines.push_back(std::move(l));
    }
    out.push_back(std::move(listing));
  }
  return out;
}

absl::StatusOr<std::vector<VarListing>> ProbeTarget::ListVars(const ProbePoint& point) const {
  if (point.kind == ProbePoint::Kind::kFunction && point.is_return) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", point.text, "' is a return probe: only $retval is available there"));
  }
  KW_ASSIGN_OR_RETURN(const std::vector<ResolvedPoint> points, Resolve(point));
  std::vector<VarListing> out;
  for (const ResolvedPoint& p : points) {
    VarListing listing;
    listing.point = p;
    KW_ASSIGN_OR_RETURN(const PcScope scope, ScopeAt(p));
    for (const ScopeVar& v : VisibleVariables(scope)) {
      VarInfo info;
      info.name = v.name;
      info.is_param = v.is_param;
      const std::optional<Dwarf_Die> type = symbols::TypeOf(v.die);
      info.type_name = type.has_value() ? symbols::TypeName(symbols::TypeRef{*type, 0}) : "void";
      const absl::StatusOr<std::vector<DwarfOp>> loc = CompileLocation(scope, v);
      info.available = loc.ok();
      if (!loc.ok()) {
        info.reason = std::string(loc.status().message().data(), loc.status().message().size());
      }
      listing.vars.push_back(std::move(info));
    }
    out.push_back(std::move(listing));
  }
  return out;
}

std::optional<uint64_t> ProbeTarget::FileOffset(RemoteAddr vaddr) const {
  for (const Segment& s : impl_->segments) {
    if (vaddr.value >= s.vaddr && vaddr.value - s.vaddr < s.filesz) {
      return s.offset + (vaddr.value - s.vaddr);
    }
  }
  return std::nullopt;
}

std::vector<std::string> ProbeTarget::FunctionNames(absl::string_view glob) const {
  const bool negate = absl::StartsWith(glob, "!");
  const std::string pattern(negate ? glob.substr(1) : glob);
  std::vector<std::string> out;
  for (const FunctionInfo& f : impl_->functions) {
    if (f.size == 0 || f.name.empty() || absl::StrContains(f.name, '@')) {
      continue;  // undefined here (an import), or a PLT stub or versioned alias
    }
    const bool matches = ::fnmatch(pattern.c_str(), f.name.c_str(), 0) == 0;
    if (matches != negate) {
      out.push_back(f.name);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<RemoteAddr> ProbeTarget::SymbolAddress(absl::string_view name) const {
  const symbols::ElfSymbol* sym =
      impl_->elf_symbols->Find(std::string_view(name.data(), name.size()),
                               symbols::kFunctionSymbols | symbols::kDataSymbols);
  if (sym == nullptr) {
    return std::nullopt;
  }
  return RemoteAddr{sym->addr};
}

absl::StatusOr<uint64_t> ProbeTarget::LoadBias(const std::vector<ptrace::MapEntry>& maps) const {
  for (const ptrace::MapEntry& m : maps) {
    if (m.inode != impl_->ino || m.path.empty() || m.path[0] != '/') {
      continue;
    }
    // The device: as maps gives it ("MAJ:MIN", hex), or the path's when kwatch sees it (a
    // file of a process in another mount namespace has a path kwatch may not have).
    unsigned major = 0;
    unsigned minor = 0;
    const bool dev_given = std::sscanf(m.dev.c_str(), "%x:%x", &major, &minor) == 2;
    struct stat st {};
    if (!(dev_given && makedev(major, minor) == impl_->dev) &&
        (::stat(m.path.c_str(), &st) != 0 || st.st_dev != impl_->dev)) {
      continue;
    }
    for (const Segment& s : impl_->segments) {
      if ((s.offset & ~(kPageSize - 1)) == m.offset) {
        return m.start.value - (s.vaddr & ~(kPageSize - 1));
      }
    }
  }
  return absl::NotFoundError(absl::StrCat(Basename(path_), " is not mapped in the process"));
}

absl::StatusOr<PcScope> ProbeTarget::ScopeAt(const ResolvedPoint& point) const {
  const uint64_t addr = point.vaddr.value + impl_->elf_bias;
  PcScope scope;
  scope.module = impl_->mod;
  scope.where = point.Where();
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = dwfl_module_addrdie(impl_->mod, addr, &bias);
  if (cu == nullptr) {
    return absl::NotFoundError(absl::StrCat("no DWARF debug info covers ", scope.where, " in ",
                                            Basename(path_), " (was it built with -g?)"));
  }
  scope.cu = *cu;
  scope.pc = addr - bias;
  scope.addr_adjust = static_cast<int64_t>(bias) - static_cast<int64_t>(impl_->elf_bias);
  Dwarf_Die* scopes = nullptr;
  const int n = dwarf_getscopes(cu, scope.pc, &scopes);
  bool function_seen = false;
  for (int i = 0; i < n; ++i) {
    const int tag = dwarf_tag(&scopes[i]);
    if (!function_seen) {
      scope.scopes.push_back(scopes[i]);
    }
    function_seen = function_seen || tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine;
    if (tag == DW_TAG_subprogram && !scope.subprogram.has_value()) {
      scope.subprogram = scopes[i];
    }
  }
  free(scopes);  // NOLINT(cppcoreguidelines-no-malloc): allocated by libdw
  if (scope.subprogram.has_value()) {
    Dwarf_Addr entry = 0;
    scope.at_entry = dwarf_entrypc(&*scope.subprogram, &entry) == 0 && entry == scope.pc;
  }
  Dwarf_Addr cfi_bias = 0;
  scope.cfi = dwfl_module_eh_cfi(impl_->mod, &cfi_bias);
  if (scope.cfi == nullptr) {
    scope.cfi = dwfl_module_dwarf_cfi(impl_->mod, &cfi_bias);
  }
  scope.cfi_pc = addr - cfi_bias;
  return scope;
}

std::string FormatLineListing(const LineListing& listing) {
  std::string out = absl::StrCat("<", listing.function, "@", listing.file, ":0>\n");
  for (const ListedLine& l : listing.lines) {
    if (l.has_code) {
      absl::StrAppend(&out, absl::StrFormat("%7d  %s\n", l.relative, l.text));
    } else {
      absl::StrAppend(&out, "         ", l.text, "\n");
    }
  }
  return out;
}

std::string FormatVarListing(absl::string_view spec, const std::vector<VarListing>& listings) {
  std::string out = absl::StrCat("Available variables at ", spec, "\n");
  for (const VarListing& l : listings) {
    absl::StrAppend(&out, "\t@<", l.point.function.empty() ? l.point.Where() : l.point.function,
                    "+", l.point.offset, ">\n");
    for (const VarInfo& v : l.vars) {
      if (v.available) {
        absl::StrAppend(&out, "\t\t", v.type_name, "\t", v.name, "\n");
      }
    }
  }
  return out;
}

}  // namespace kwatch::core::probe
