#include "watch/kernel/kernel_expr.h"

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/kernel/accessors.h"
#include "core/kernel/bpf_kernel_reader.h"
#include "core/symbols/expr.h"

namespace kwatch::watch::kernel {

namespace {

// The lowest address of the kernel's half of the address space (x86-64, 4- and 5-level).
constexpr uint64_t kKernelSpaceStart = 0xffff800000000000ULL;

bool IsWritableData(char type) {
  return type == 'D' || type == 'd' || type == 'B' || type == 'b';
}

bool IsText(char type) {
  return type == 'T' || type == 't' || type == 'W' || type == 'w';
}

// The address of `name` read from the code of its accessor (opts.via, else the table's):
// core/kernel/accessors.h. The type's name, when the table knows it, in `type_name`.
absl::StatusOr<core::kernel::KernelSymbolAddress> ThroughAccessor(
    const std::string& name, const KernelExprOptions& opts,
    const core::kernel::KernelSymbolResolver& symbols, std::string* type_name) {
  const core::kernel::KnownAccessor* known = core::kernel::FindKnownAccessor(name);
  core::kernel::ViaSpec via;
  if (!opts.via.empty()) {
    KW_ASSIGN_OR_RETURN(via, core::kernel::ParseVia(opts.via));
    if (known != nullptr && via.function != known->function) {
      known = nullptr;  // the user's accessor: no pattern of ours applies
    }
  } else {
    via.function = std::string{known->function};
  }
  const core::kernel::KernelSymbol* fn = symbols.kallsyms().Find(via.function);
  if (fn == nullptr || !fn->IsText()) {
    return absl::NotFoundError(absl::StrFormat("no kernel function '%s' in %s", via.function,
                                               symbols.kallsyms().origin()));
  }
  std::function<absl::Status(uint64_t, std::span<uint8_t>)> read = opts.read_kernel;
  std::unique_ptr<core::kernel::BpfKernelReader> bpf;
  if (!read) {
    auto opened = core::kernel::BpfKernelReader::Open();
    if (!opened.ok()) {
      return absl::Status(opened.status().code(), absl::StrCat("reading the code of ", via.function,
                                                               " needs BPF (no /proc/kcore here): ",
                                                               opened.status().message()));
    }
    bpf = *std::move(opened);
    read = [&bpf](uint64_t addr, std::span<uint8_t> out) { return bpf->Read(addr, out); };
  }
  std::vector<uint8_t> code(core::kernel::BpfKernelReader::kChunk);
  if (absl::Status s = read(fn->addr, code); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("reading the code of ", via.function, ": ", s.message()));
  }
  KW_ASSIGN_OR_RETURN(const std::vector<core::kernel::RipOperand> operands,
                      core::kernel::RipOperands(fn->addr, code));
  KW_ASSIGN_OR_RETURN(const core::kernel::RipOperand op,
                      core::kernel::PickOperand(name, via.function, operands, via.offset, known));
  core::kernel::KernelSymbolAddress out;
  out.name = name;
  out.addr = op.target;
  out.link_addr = op.target;
  out.type = 'D';
  out.source = absl::StrFormat("the code of %s (+0x%x: %s), read through BPF", via.function,
                               op.offset, op.text);
  out.room = op.size;
  if (known != nullptr) {
    *type_name = std::string{known->type_name};
  }
  return out;
}

}  // namespace

uint32_t LengthWithin(uint64_t addr, std::optional<uint64_t> room) {
  uint32_t len = 8;
  while (len > 1 && ((room.has_value() && *room < len) || addr % len != 0)) {
    len /= 2;
  }
  return len;
}

absl::StatusOr<ResolvedKernelExpr> ResolveKernelExpr(const std::string& text,
                                                     const KernelExprOptions& opts,
                                                     core::kernel::KernelSymbolResolver& symbols,
                                                     const core::kernel::KernelBtf* btf) {
  KW_ASSIGN_OR_RETURN(const core::symbols::Expr expr, core::symbols::ParseExpr(text));
  ResolvedKernelExpr out;
  KernelWatch& w = out.watch;
  w.expr = text;
  if (expr.cast.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a cast names the type of a process's object (its DWARF): watch a kernel address as "
        "0x%x:LEN",
        *expr.address));
  }
  if (expr.address.has_value()) {
    if (!expr.steps.empty()) {
      return absl::InvalidArgumentError("a raw kernel address takes no member path");
    }
    w.addr = *expr.address;
    w.display = absl::StrFormat("0x%x", w.addr);
    w.len = static_cast<uint32_t>(opts.len.value_or(expr.length.value_or(8)));
    w.source = "raw address";
    return out;
  }
  // The symbol listings, else (or with --via) the code of a function that reads it.
  std::string accessor_type;
  absl::StatusOr<core::kernel::KernelSymbolAddress> found =
      opts.via.empty() ? symbols.Resolve(expr.base)
                       : ThroughAccessor(expr.base, opts, symbols, &accessor_type);
  if (!found.ok() && opts.via.empty() && found.status().code() == absl::StatusCode::kNotFound &&
      core::kernel::FindKnownAccessor(expr.base) != nullptr) {
    auto through = ThroughAccessor(expr.base, opts, symbols, &accessor_type);
    if (!through.ok()) {
      return absl::Status(
          through.status().code(),
          absl::StrCat(found.status().message(), "\nIts accessor: ", through.status().message()));
    }
    found = std::move(through);
  }
  KW_RETURN_IF_ERROR(found.status());
  const core::kernel::KernelSymbolAddress& sym = *found;
  if (sym.addr < kKernelSpaceStart) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kernel symbol '%s' is at 0x%x in %s, outside the kernel's address space: it is a "
        "per-CPU variable (an offset into each CPU's area), which kwatch cannot watch yet",
        expr.base, sym.addr, sym.source));
  }
  out.symbol = expr.base;
  out.symbol_type = sym.type;
  w.addr = sym.addr;
  w.source = sym.source;
  w.slide = sym.slide;
  w.display = expr.base;
  w.type_name = accessor_type;
  // The symbol's type: --type, else BTF (per-CPU variables only on most kernels).
  std::optional<core::kernel::BtfTypeRef> type;
  if (!opts.type.empty()) {
    if (btf == nullptr) {
      return absl::FailedPreconditionError(
          "--type needs the kernel's BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)");
    }
    KW_ASSIGN_OR_RETURN(type, btf->FindType(opts.type));
  } else if (btf != nullptr) {
    type = btf->VarType(expr.base);
  }
  std::optional<uint64_t> type_size;
  if (!accessor_type.empty()) {
    type_size = sym.room;  // the accessor's load: the table's size, checked
  }
  if (type.has_value()) {
    KW_ASSIGN_OR_RETURN(const core::kernel::BtfMemberRef m, btf->Walk(*type, expr.steps));
    w.addr += m.offset;
    w.display += m.path;
    w.type_name = m.type_name;
    type_size = m.size;
    if (m.bit_size != 0) {
      w.type_name += absl::StrFormat(" (bitfield :%d)", m.bit_size);
    }
  } else if (sym.from_vmlinux) {
    // The vmlinux's DWARF (libdw) knows every variable's type: resolve the whole expression at
    // link-time addresses, then move it by the slide.
    KW_ASSIGN_OR_RETURN(auto dwarf, core::symbols::Symbols::ForFile(sym.file));
    const auto no_memory = [](core::RemoteAddr, std::span<uint8_t>) {
      return absl::InvalidArgumentError(
          "kwatch does not read kernel memory ('->' on a kernel pointer)");
    };
    auto r = dwarf->Resolve(expr, no_memory);
    if (r.ok()) {
      w.addr = r->addr.value + static_cast<uint64_t>(sym.slide);
      w.display = r->display;
      w.type_name = r->type_name;
      type_size = r->length;
    } else if (!expr.steps.empty()) {
      return r.status();
    }
  }
  if (!type_size.has_value() && !expr.steps.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no type for kernel symbol '%s': the kernel's BTF describes only per-CPU variables, "
        "and System.map and kallsyms carry no types; name its type with --type, e.g. "
        "`kwatch --rw '%s' --type 'struct task_struct'`",
        expr.base, text));
  }
  if (opts.exec) {
    w.len = 1;  // one instruction start (perf wants sizeof(long) on x86: PerfBreakpoint says so)
  } else if (opts.len.has_value()) {
    w.len = static_cast<uint32_t>(*opts.len);
  } else if (type_size.has_value()) {
    if (*type_size != 1 && *type_size != 2 && *type_size != 4 && *type_size != 8) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is a %s of %d bytes: one debug register watches 1, 2, 4 or 8 aligned bytes; "
          "watch a member, or give --len",
          w.display, w.type_name, *type_size));
    }
    w.len = static_cast<uint32_t>(*type_size);
  } else {
    // Code: the first bytes of the function; data: what fits, said to the user.
    w.len = LengthWithin(w.addr, sym.room);
    out.length_guessed = !IsText(sym.type);
  }
  out.read_only_section = !IsWritableData(sym.type);
  return out;
}

absl::StatusOr<KernelWatch> ResolveProcessExpr(const std::string& text, std::optional<uint64_t> len,
                                               const core::symbols::Symbols& syms,
                                               const core::symbols::MemoryReader& read) {
  KW_ASSIGN_OR_RETURN(const core::symbols::Expr expr, core::symbols::ParseExpr(text));
  KernelWatch w;
  w.expr = text;
  if (expr.address.has_value() && !expr.cast.has_value()) {
    w.addr = *expr.address;
    w.display = absl::StrFormat("0x%x", w.addr);
    w.len = static_cast<uint32_t>(len.value_or(expr.length.value_or(8)));
  } else {
    KW_ASSIGN_OR_RETURN(const core::symbols::ResolvedExpr r, syms.Resolve(expr, read));
    w.addr = r.addr.value;
    w.display = r.display;
    w.type_name = r.type_name;
    w.len = static_cast<uint32_t>(len.value_or(r.length));
  }
  w.source = "the target's symbols";
  return w;
}

}  // namespace kwatch::watch::kernel
