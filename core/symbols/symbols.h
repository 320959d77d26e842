#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/symbols/expr.h"
#include "core/symbols/type_layout.h"

namespace kwatch::core::symbols {

// Reads `out.size()` bytes of the target at `addr` (used to follow pointers for `->`).
using MemoryReader = std::function<absl::Status(RemoteAddr addr, std::span<uint8_t> out)>;

// A pointer that resolving an expression read from the target (to follow '->', '*' or an
// index on a pointer), in the order they were read.
struct PointerLoad {
  std::string display;  // the pointer's own expression: "g_p", "g_list->next"
  RemoteAddr addr;      // where the pointer is stored (absolute)
  uint32_t size = 8;    // bytes read
  uint64_t value = 0;   // what it held then
};

// A watch expression resolved against a target's symbols.
struct ResolvedExpr {
  std::string display;               // normalised name, e.g. "g_stats.hits", "cache->lines[3]"
  RemoteAddr addr;                   // absolute run-time address in the target
  uint64_t length = 0;               // bytes
  std::string type_name;             // C spelling of the type ("" for raw addresses)
  std::optional<TypeLayout> layout;  // fields of the object (for scalars: one field, path "")
  std::string module;                // file the symbol came from ("" for raw addresses)
  // The pointers followed to get there, in order (none: a fixed location).
  std::vector<PointerLoad> pointers;
};

// A function symbol containing an address.
struct FunctionSymbol {
  std::string name;
  RemoteAddr start;
  uint64_t size = 0;
  std::string module;
};

// Source position of an address (from the DWARF line table).
struct SourceLine {
  std::string file;  // as recorded by the compiler (absolute when the CU dir is known)
  int line = 0;
  std::string inlined_function;  // innermost inlined function containing the address, if any
};

// Symbols and types of one target process (ELF symtabs + DWARF of the executable and its
// loaded shared libraries), through libdw's dwfl. Owns the Dwfl; stays valid after the
// process exits (the files stay open). Not thread-safe.
class Symbols {
 public:
  // Reports the modules mapped in `pid` now (dwfl_linux_proc_report). Call again after
  // the loader has mapped libraries to see them.
  static absl::StatusOr<std::unique_ptr<Symbols>> ForProcess(pid_t pid);
  // An ELF file, not running, loaded at its link-time addresses (for tests and offline use).
  static absl::StatusOr<std::unique_ptr<Symbols>> ForFile(const std::string& path);

  virtual ~Symbols() = default;

  // Resolves a parsed expression (ResolveExpr's contract; a cast's type is looked up by name
  // in the executable's debug info, then the libraries'). Errors (each with advice):
  //  NotFound: unknown symbol, with up to 3 near matches ("did you mean 'g_stats'?"), or
  //   unknown type in a cast (likewise, with a caret under it);
  //  InvalidArgument: a function given where data is expected, unknown member (listing the
  //   members), index out of bounds, '->' on a non-pointer, '.' on a pointer;
  //  FailedPrecondition: no DWARF type for the symbol (length from the ELF symbol is used
  //   when it has one; this error only when it has none and the expression needs a type).
  virtual absl::StatusOr<ResolvedExpr> Resolve(const Expr& expr,
                                               const MemoryReader& read) const = 0;

  // The function symbol containing `addr`, if any.
  virtual std::optional<FunctionSymbol> FunctionAt(RemoteAddr addr) const = 0;

  // The source line of `addr`, if the module has a line table.
  virtual std::optional<SourceLine> LineAt(RemoteAddr addr) const = 0;

  // Bytes of the loaded image at [addr, addr+out.size()) read from the module's ELF file
  // (not from the process), so code can be decoded after the process has gone.
  virtual absl::Status ReadCode(RemoteAddr addr, std::span<uint8_t> out) const = 0;

  // The function symbol called `name` (ELF symbol tables; the executable first), if any.
  virtual std::optional<FunctionSymbol> FindFunction(std::string_view name) const {
    (void)name;
    return std::nullopt;
  }

  // Absolute addresses of the line-table rows for `file`:`line` (`file` may be a basename
  // or a path suffix such as "src/server.c"), sorted. `statements`: only the rows that begin a
  // statement (is_stmt: where gdb's `break FILE:LINE` stops), unless the line has none.
  // NotFound when no module has such a line.
  virtual absl::StatusOr<std::vector<RemoteAddr>> AddressesOfLine(std::string_view file, int line,
                                                                  bool statements = false) const {
    (void)file;
    (void)line;
    (void)statements;
    return absl::UnimplementedError("line lookup is not available for this target");
  }

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  Symbols() = default;
  Symbols(const Symbols&) = default;
  Symbols& operator=(const Symbols&) = default;
  Symbols(Symbols&&) = default;
  Symbols& operator=(Symbols&&) = default;
};

}  // namespace kwatch::core::symbols
