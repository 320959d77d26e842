#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "core/kernel/btf_types.h"
#include "core/kernel/kernel_symbols.h"
#include "core/symbols/symbols.h"
#include "watch/kernel/kernel_event.h"

namespace kwatch::watch::kernel {

// The largest watch length (1, 2, 4, 8) that fits `room` bytes (no bound when nullopt) and the
// alignment of `addr`.
uint32_t LengthWithin(uint64_t addr, std::optional<uint64_t> room);

// How a kernel watch's expression becomes an address and a length (the command's options).
struct KernelExprOptions {
  std::optional<uint64_t> len;  // --len: the watched bytes, whatever the type says
  std::string type;             // --type: the symbol's C type ("": BTF's, when it has one)
  bool exec = false;            // an execute breakpoint: one instruction start (length 1)
  // --via FUNC[+OFF]: the symbol's address is the RIP-relative operand of FUNC's code that
  // reads it (core/kernel/accessors.h), whatever the symbol listings say.
  std::string via;
  // Reads kernel memory (the accessor's code); empty: core::kernel::BpfKernelReader.
  std::function<absl::Status(uint64_t addr, std::span<uint8_t> out)> read_kernel;
};

// A resolved kernel expression: the watch (address, length, display, type, source, slide),
// and what the user should hear about it.
struct ResolvedKernelExpr {
  KernelWatch watch;
  std::string symbol;    // the expression's symbol ("" for a raw address)
  char symbol_type = 0;  // its nm letter ('D', 'b', 'T'...; 0 for a raw address)
  // No source gave a type and nothing gave a length: `watch.len` is what fits the symbol's
  // alignment and the room to the next symbol (code is watched at its first bytes silently).
  bool length_guessed = false;
  // The symbol is outside the kernel's writable data ('D', 'd', 'B', 'b'): a write watch
  // there sees no event.
  bool read_only_section = false;
};

// Resolves one expression against the kernel: a raw address ("0xADDR", "0xADDR:LEN"), or a
// symbol's address through `symbols` (kallsyms, System.map, vmlinux) with its member path and
// type through `btf` (when not null: the symbol's type, or opts.type) or a vmlinux's DWARF,
// and its length (opts.exec: 1; opts.len; the type's size, which must be 1, 2, 4 or 8; else
// LengthWithin). Errors: the expression's syntax; InvalidArgument for a raw address with a
// member path, a per-CPU symbol (an offset, not an address), a type of another size;
// FailedPrecondition for --type without BTF and for a member path with no type; the
// resolver's and BTF's errors as they are.
absl::StatusOr<ResolvedKernelExpr> ResolveKernelExpr(const std::string& text,
                                                     const KernelExprOptions& opts,
                                                     core::kernel::KernelSymbolResolver& symbols,
                                                     const core::kernel::KernelBtf* btf);

// Resolves one expression of --kernel-accesses against a process: a raw address (opts.len,
// else the expression's, else 8 bytes) or a symbol expression through `syms`, reading the
// process's memory with `read` ("p->x"); its length is `len` when given, else the type's.
// The watch's source is "the target's symbols". Errors: the expression's and the resolver's.
absl::StatusOr<KernelWatch> ResolveProcessExpr(const std::string& text, std::optional<uint64_t> len,
                                               const core::symbols::Symbols& syms,
                                               const core::symbols::MemoryReader& read);

}  // namespace kwatch::watch::kernel
