#pragma once

// A place in a process's code written as `kwatch probe` and gdb's `break` write it, for execute
// watches (`kwatch --exec FUNC`): a function's entry (`tick`), an offset into it
// (`tick+0x10`), or a source line's first instruction (`loop.c:17`).

#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/symbols/symbols.h"

namespace kwatch::core::symbols {

// The instruction `text` names in the process `syms` describes, as a one-byte ResolvedExpr
// (display "tick+0x10", the function's module; no type). Nullopt when `text` is not a code
// place of that process (no function of that name, not FILE:LINE), so that the caller may read
// it as data. InvalidArgument for an offset past the function's end; NotFound for a line with
// no code.
absl::StatusOr<std::optional<ResolvedExpr>> ResolveCodePoint(const Symbols& syms,
                                                             std::string_view text);

}  // namespace kwatch::core::symbols
