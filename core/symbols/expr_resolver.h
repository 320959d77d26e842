#pragma once

// Resolution of watch expressions (`g_stats.hits`, `cache->lines[3]`, `*g_ptr`, `0xADDR:LEN`)
// against DWARF types: the steps of an Expr applied to the variable it starts from, giving
// the watched object's address, length, type and layout. The variable comes from a symbol
// table (core/symbols/symbols.cc looks it up); pointers are followed through the target's
// memory. Stateless: the DWARF behind the types must outlive the calls (the owning Dwfl).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/symbols/dwarf_types.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbols.h"

namespace kwatch::core::symbols {

// A variable an expression starts from, as a symbol table found it.
struct ExprVariable {
  std::string name;             // as shown in results and messages
  uint64_t addr = 0;            // absolute run-time address
  std::optional<TypeRef> type;  // its DWARF type; nullopt without debug info
  uint64_t elf_size = 0;        // its ELF symbol's size (0: unknown, or no ELF symbol)
  std::string module;           // the file it came from
};

// Finds a variable by name; the error is the resolver's (NotFound with near matches...).
using VariableLookup = std::function<absl::StatusOr<ExprVariable>(const std::string& name)>;

// Finds the type a cast names (without its '*'s): NotFound with near matches when no type of
// the debug info has that name, InvalidArgument when it names no usable type ("void").
using TypeLookup = std::function<absl::StatusOr<TypeRef>(const ExprType& type)>;

// Resolves `expr` (the contract of Symbols::Resolve): an absolute address as given (8 bytes
// unless a length is); a cast, (TYPE *)0xADDR, as the pointer to the TYPE at 0xADDR, whose
// type `types` finds; otherwise the variable `lookup` finds for expr.base. Then each step:
//  '.' and '->' (a member, with the member list and a near match when unknown), '[i]' (an
//   array element, bounds-checked, or the i-th object behind a pointer), '*' (the object
//   behind a pointer, or an array's first element); pointers are read through `read`.
// The result's length is the type's size (a bitfield's storage unit), else the ELF
// symbol's size; a cast's address left as it is at the end means the object there
// (`(int *)0x10` is the int at 0x10, shown as *(int *)0x10); `pointers` lists every pointer
// read through `read`, in order (what `--follow` watches). Errors: InvalidArgument for
// misuse (naming the expression so far and its type), FailedPrecondition when a type, a size
// or the memory reader is missing, a NULL pointer, or the reader's error with the pointer's
// name and address; the errors of a cast (an unknown type, a non-pointer type) show the
// expression with a caret, as ParseExpr's do.
absl::StatusOr<ResolvedExpr> ResolveExpr(const Expr& expr, const VariableLookup& lookup,
                                         const MemoryReader& read,
                                         const TypeLookup& types = nullptr);

}  // namespace kwatch::core::symbols
