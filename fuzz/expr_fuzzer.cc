// Watch expressions (core/expr.h): ParseExpr on any text, then, when it parses, Resolve
// against a fixed ELF with DWARF (tests/targets/probe_args.c), following pointers through a
// reader that serves bytes derived from the input. Any result is fine; a crash, a sanitizer
// report or a broken invariant is a bug.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "core/base/remote_addr.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbols.h"
#include "fuzz/fuzz_util.h"

namespace {

const kwatch::core::symbols::Symbols* FixtureSymbols() {
  static const kwatch::core::symbols::Symbols* symbols = [] {
    kwatch::fuzz::QuietLibdw();
    auto s = kwatch::core::symbols::Symbols::ForFile(KWATCH_FUZZ_FIXTURE);
    if (!s.ok()) {
      std::abort();  // the harness is broken: the fixture must load
    }
    return s->release();
  }();
  return symbols;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto expr = kwatch::core::symbols::ParseExpr(text);
  if (!expr.ok()) {
    return 0;
  }
  for (const kwatch::core::symbols::ExprStep& step : expr->steps) {
    if (step.column > size) {
      std::abort();  // a column outside the text would put the caret anywhere
    }
  }
  // Memory of the "target": each byte is a function of its address and the input, so that
  // pointers read through '->' and '*' go somewhere different for different inputs.
  const uint8_t seed = size > 0 ? data[0] : 0;
  const kwatch::core::symbols::MemoryReader read = [seed](kwatch::core::RemoteAddr addr,
                                                          std::span<uint8_t> out) -> absl::Status {
    if (addr.value % 7 == 3) {
      return absl::NotFoundError("unmapped");
    }
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<uint8_t>((addr.value + i) * 131 + seed);
    }
    return absl::OkStatus();
  };
  (void)FixtureSymbols()->Resolve(*expr, read);
  return 0;
}
