// DWARF and ELF from hostile files through libdw (core/symbols.h, core/probe/probe_target.h):
// the input is an ELF image in a memfd, opened the two ways kwatch opens a file (Symbols for
// watches, ProbeTarget for probes) and queried the way the CLI queries them. libdw's errors
// must come back as Status values: a crash or a sanitizer report is a bug.

#include <sys/user.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/probe/fetch.h"
#include "core/probe/probe_spec.h"
#include "core/probe/probe_target.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbols.h"
#include "fuzz/fuzz_util.h"

namespace {

using kwatch::core::RemoteAddr;

// Names of the seed (tests/targets/probe_args.c) so that mutated seeds reach deep code.
constexpr const char* kExprs[] = {"g_items[1].next->values[2]", "g_total", "*g_items[0].label",
                                  "0x4010:8", "add_ints"};
constexpr const char* kSpecs[] = {"sum_item p->len:u32 p->next->id p->label:string",
                                  "add_ints%return $retval a b",
                                  "fact+4 n",
                                  "probe_args.c:42 $vars",
                                  "loop_lines:3 $params",
                                  "0x1149 %di +8(%sp):u32 @g_total",
                                  "main",
                                  "scale x factor",
                                  "many_args g h",
                                  "local_item $vars"};

uint64_t Word(const uint8_t* data, size_t size, size_t at) {
  uint64_t v = 0;
  if (size >= 8) {
    std::memcpy(&v, data + (at % (size - 7)), 8);
  }
  return v;
}

void QuerySymbols(const std::string& path, const uint8_t* data, size_t size) {
  auto symbols = kwatch::core::symbols::Symbols::ForFile(path);
  if (!symbols.ok()) {
    return;
  }
  const kwatch::core::symbols::MemoryReader read = [](RemoteAddr addr,
                                                      std::span<uint8_t> out) -> absl::Status {
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<uint8_t>(addr.value + i);
    }
    return absl::OkStatus();
  };
  for (const char* text : kExprs) {
    auto expr = kwatch::core::symbols::ParseExpr(text);
    if (expr.ok()) {
      (void)(*symbols)->Resolve(*expr, read);
    }
  }
  (void)(*symbols)->FindFunction("sum_item");
  (void)(*symbols)->AddressesOfLine("probe_args.c", 42);
  for (size_t i = 0; i < 4; ++i) {
    const RemoteAddr addr{i == 0 ? 0x1149 : Word(data, size, i * 4099)};
    if (auto fn = (*symbols)->FunctionAt(addr); fn.has_value()) {
      (void)(*symbols)->LineAt(fn->start);
      std::vector<uint8_t> code(16);
      (void)(*symbols)->ReadCode(fn->start, code);
    }
    (void)(*symbols)->LineAt(addr);
    std::vector<uint8_t> code(16);
    (void)(*symbols)->ReadCode(addr, code);
  }
}

void QueryProbeTarget(const std::string& path) {
  auto target = kwatch::core::probe::ProbeTarget::Open(path);
  if (!target.ok()) {
    return;
  }
  (void)(*target)->SymbolAddress("g_total");
  (void)(*target)->FileOffset(RemoteAddr{0x1149});
  for (const char* text : kSpecs) {
    auto spec = kwatch::core::probe::ParseProbeSpec(text);
    if (!spec.ok()) {
      continue;
    }
    auto points = (*target)->Resolve(spec->point);
    if (!points.ok()) {
      continue;
    }
    (void)(*target)->ListVars(spec->point);
    if (spec->point.kind == kwatch::core::probe::ProbePoint::Kind::kFunction &&
        !spec->point.is_return && spec->point.offset == 0) {
      (void)(*target)->ListLines(spec->point);
    }
    for (const kwatch::core::probe::ResolvedPoint& point : *points) {
      auto args = kwatch::core::probe::CompileArgs(**target, point, spec->args);
      if (!args.ok()) {
        continue;
      }
      // The file's DWARF location expressions, evaluated: a hostile file chooses the ops.
      user_regs_struct regs{};
      regs.rsp = 0x7ffc0000;
      regs.rdi = 0x4010;
      user_fpregs_struct fpregs{};
      kwatch::core::probe::FetchContext ctx;
      ctx.regs = &regs;
      ctx.fpregs = &fpregs;
      ctx.read = [](RemoteAddr addr, std::span<uint8_t> out) -> absl::Status {
        for (size_t i = 0; i < out.size(); ++i) {
          out[i] = static_cast<uint8_t>((addr.value + i) * 7);
        }
        return absl::OkStatus();
      };
      ctx.at_return = point.is_return;
      (void)kwatch::core::probe::EvaluateAll(*args, ctx);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  kwatch::fuzz::QuietLibdw();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kwatch::fuzz::MemFile file(data, size);
  QuerySymbols(file.path(), data, size);
  QueryProbeTarget(file.path());
  return 0;
}
