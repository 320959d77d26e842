#include "core/symbols/symbolizer.h"

#include <Zydis/Zydis.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/x86/format.h"

namespace kwatch::core::symbols {
namespace {

// Bytes of a function decoded at most before the trap (keeps pathological symbols cheap).
constexpr uint64_t kMaxDecodeBytes = 1 << 20;

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Finds the instruction ending exactly at `trap_ip` by decoding linearly from `start`.
AccessSite Decode(const Symbols& symbols, RemoteAddr start, RemoteAddr trap_ip) {
  AccessSite site;
  site.ip = trap_ip;
  if (trap_ip <= start || trap_ip - start > kMaxDecodeBytes) {
    return site;
  }
  const uint64_t span = trap_ip - start;
  std::vector<uint8_t> code(span);
  if (!symbols.ReadCode(start, std::span<uint8_t>(code)).ok()) {
    return site;
  }
  ZydisDecoder decoder;
  if (!ZYAN_SUCCESS(ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64))) {
    return site;
  }
  ZydisDecodedInstruction insn;
  std::array<ZydisDecodedOperand, ZYDIS_MAX_OPERAND_COUNT> operands{};
  uint64_t offset = 0;
  while (offset < span) {
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code.data() + offset, span - offset, &insn,
                                             operands.data()))) {
      return site;  // undecodable bytes, or an instruction running past trap_ip
    }
    if (offset + insn.length < span) {
      offset += insn.length;
      continue;
    }
    if (offset + insn.length != span) {
      return site;
    }
    // This instruction ends at trap_ip: the one that accessed the data.
    site.ip = start + offset;
    site.exact = true;
    std::copy_n(code.begin() + static_cast<ptrdiff_t>(offset),
                std::min<size_t>(insn.length, site.code.size()), site.code.begin());
    for (uint8_t i = 0; i < insn.operand_count; ++i) {
      const ZydisDecodedOperand& op = operands[i];
      if (op.type != ZYDIS_OPERAND_TYPE_MEMORY ||
          (op.mem.type != ZYDIS_MEMOP_TYPE_MEM && op.mem.type != ZYDIS_MEMOP_TYPE_VSIB)) {
        continue;  // registers, immediates, `lea` address computations
      }
      site.reads = site.reads || (op.actions & ZYDIS_OPERAND_ACTION_MASK_READ) != 0;
      site.writes = site.writes || (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) != 0;
    }
    site.disassembly = x86::FormatAtt(insn, operands.data(), site.ip.value);
    return site;
  }
  return site;
}

}  // namespace

const CodeLocation& Symbolizer::Locate(RemoteAddr ip) {
  const auto it = locations_.find(ip);
  if (it != locations_.end()) {
    return it->second;
  }
  CodeLocation loc;
  loc.ip = ip;
  if (const std::optional<FunctionSymbol> f = symbols_.FunctionAt(ip); f.has_value()) {
    loc.function = f->name;
    loc.offset = ip - f->start;
    loc.module = f->module;
  }
  if (const std::optional<SourceLine> line = symbols_.LineAt(ip); line.has_value()) {
    loc.file = line->file;
    loc.line = line->line;
    loc.inlined_function = line->inlined_function;
  }
  return locations_.emplace(ip, std::move(loc)).first->second;
}

const AccessSite& Symbolizer::SiteForTrap(RemoteAddr trap_ip) {
  const auto it = sites_.find(trap_ip);
  if (it != sites_.end()) {
    return it->second;
  }
  AccessSite site;
  site.ip = trap_ip;
  // The accessing instruction holds the byte before trap_ip (trap_ip itself may be the
  // first byte after the function).
  if (trap_ip.value != 0) {
    if (const std::optional<FunctionSymbol> f = symbols_.FunctionAt(trap_ip - 1); f.has_value()) {
      site = Decode(symbols_, f->start, trap_ip);
    }
  }
  return sites_.emplace(trap_ip, std::move(site)).first->second;
}

std::string Symbolizer::Format(const CodeLocation& loc) {
  std::string out;
  if (!loc.inlined_function.empty() && loc.inlined_function != loc.function) {
    absl::StrAppend(&out, loc.inlined_function, " inlined in ");
  }
  if (loc.function.empty()) {
    absl::StrAppend(&out, absl::StrFormat("0x%x", loc.ip.value));
  } else if (loc.offset == 0) {
    absl::StrAppend(&out, loc.function);
  } else {
    absl::StrAppend(&out, loc.function, absl::StrFormat("+0x%x", loc.offset));
  }
  if (!loc.file.empty()) {
    absl::StrAppend(&out, " (", Basename(loc.file), ":", loc.line, ")");
  }
  return out;
}

}  // namespace kwatch::core::symbols
