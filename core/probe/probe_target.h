#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/remote_addr.h"
#include "core/probe/dwarf_location.h"
#include "core/probe/probe_spec.h"
#include "core/ptrace/maps.h"

namespace kwatch::core::probe {

// A probe point resolved against one ELF file. Addresses are link-time virtual addresses
// of the file (as nm prints them): the engine adds the load bias.
struct ResolvedPoint {
  std::string event;         // EVENT=, else FUNC, FUNC__return, FUNC_L<line>, abs_<hex>; a
                             // spec giving several points names them EVENT, EVENT_1, ...
  std::string group;         // GROUP: of the spec, "" when not given
  RemoteAddr vaddr;          // where the breakpoint goes (the entry for return probes)
  uint64_t file_offset = 0;  // of vaddr in the file (for the uprobe PMU)
  std::string function;      // "" when no function contains vaddr (raw addresses)
  RemoteAddr function_start;
  uint64_t offset = 0;  // vaddr - function_start
  std::string file;     // source file of vaddr ("" without line info)
  int line = 0;
  bool is_return = false;
  std::string insn_text;  // AT&T text of the instruction at vaddr, as the symbolizer prints it
  uint8_t insn_len = 0;

  // "func+0x8" (or "0x1149" without a function).
  std::string Where() const;
};

// One line of a `perf probe -L` listing.
struct ListedLine {
  int line = 0;      // absolute
  int relative = 0;  // from the function's declaration line (what FUNC:RELLINE takes)
  bool has_code = false;
  std::string text;  // "" when the source file could not be read
};

struct LineListing {
  std::string function;
  std::string file;  // as the DWARF names it
  bool have_source = false;
  std::vector<ListedLine> lines;  // the declaration line to the function's last line
};

// perf's layout: "<func@file:0>", then "%7d  text" for lines with code and 9 blanks +
// text for the others.
std::string FormatLineListing(const LineListing& listing);

// A variable of a `perf probe -V` listing.
struct VarInfo {
  std::string name;
  std::string type_name;  // C spelling ("int", "struct item *")
  bool is_param = false;
  bool available = false;  // has a location kwatch evaluates at the point
  std::string reason;      // why not, when !available
};

struct VarListing {
  ResolvedPoint point;
  std::vector<VarInfo> vars;  // innermost scope first, parameters in declaration order
};

// perf's layout: "Available variables at SPEC", then per point "\t@<func+off>" and
// "\t\tTYPE\tNAME" for each available variable.
std::string FormatVarListing(absl::string_view spec, const std::vector<VarListing>& listings);

// One ELF file with its symbols, DWARF and line table, through a Dwfl of its own
// (dwfl_report_offline). Owns the Dwfl; indexes are built at Open. Not thread-safe.
class ProbeTarget {
 public:
  // NotFound / PermissionDenied naming the file; InvalidArgument when it is not ELF.
  static absl::StatusOr<std::unique_ptr<ProbeTarget>> Open(const std::string& path);
  ~ProbeTarget();
  ProbeTarget(const ProbeTarget&) = delete;
  ProbeTarget& operator=(const ProbeTarget&) = delete;

  const std::string& path() const { return path_; }

  // Every address `point` names (one per function instance, per matching line...). Errors
  // say what to do: NotFound for an unknown function (with near matches) or a line without
  // code (with the nearest lines that have some), InvalidArgument for an offset past the
  // function's end or inside an instruction ("f+0x13 is inside 'movq 0x8(%rdi), %rax' at
  // f+0x11"), FailedPrecondition for lines without DWARF line information.
  absl::StatusOr<std::vector<ResolvedPoint>> Resolve(const ProbePoint& point) const;

  // The source lines of FUNC[@SRC] (point.kind must be kFunction; other fields ignored),
  // one listing per function of that name.
  absl::StatusOr<std::vector<LineListing>> ListLines(const ProbePoint& point) const;

  // The variables visible at each address of `point`. FailedPrecondition for a return
  // probe (only $retval exists there).
  absl::StatusOr<std::vector<VarListing>> ListVars(const ProbePoint& point) const;

  // File offset of a virtual address inside a PT_LOAD segment, nullopt elsewhere.
  std::optional<uint64_t> FileOffset(RemoteAddr vaddr) const;

  // The functions defined in this file that a probe can name, sorted and unique, as
  // `perf probe --funcs` lists them: those whose name matches `glob` (fnmatch(3); a leading
  // '!' keeps those that do not match). PLT stubs and versioned aliases are left out.
  std::vector<std::string> FunctionNames(absl::string_view glob) const;

  // Link-time address of an ELF symbol (functions and data), nullopt when absent.
  std::optional<RemoteAddr> SymbolAddress(absl::string_view name) const;

  // The load bias of this file in a process, from its maps (matched by device and inode).
  // NotFound when the file is not mapped there.
  absl::StatusOr<uint64_t> LoadBias(const std::vector<ptrace::MapEntry>& maps) const;

  // The DWARF view of `vaddr` (for core/probe/fetch.cc). NotFound without DWARF there.
  absl::StatusOr<PcScope> ScopeAt(const ResolvedPoint& point) const;

 private:
  struct Impl;
  explicit ProbeTarget(std::unique_ptr<Impl> impl);

  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kwatch::core::probe
