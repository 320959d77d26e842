// Kernel symbol listings (core/kernel/kallsyms.h, kernel_symbols.h): /proc/kallsyms and
// System.map lines, "ADDR TYPE NAME[\t[MODULE]]". The input is parsed as the running
// kernel's listing; the part after a line "----" (when there is one) as a System.map whose
// KASLR slide is checked against it. Lookups by name and by address follow. Errors are
// fine; crashes and sanitizer reports are bugs.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "core/kernel/kallsyms.h"
#include "core/kernel/kernel_symbols.h"

namespace {

using kwatch::core::kernel::KernelSymbolTable;

void Query(const KernelSymbolTable& table) {
  (void)table.addresses_hidden();
  (void)table.HasDataSymbols();
  (void)table.text_count();
  (void)table.data_count();
  (void)table.Find("_text");
  (void)table.Find("jiffies");
  const auto& symbols = table.symbols();
  for (size_t i = 0; i < symbols.size() && i < 64; ++i) {
    const auto& s = symbols[i];
    if (table.Find(s.name) == nullptr && s.module.empty()) {
      std::abort();  // every kernel-image symbol of the listing is found by name
    }
    (void)table.CountNamed(s.name);
    for (const uint64_t addr : {s.addr, s.addr - 1, s.addr + 1, s.addr + 0x1000}) {
      if (auto at = table.TextAt(addr); at.has_value()) {
        (void)at->ToString();
      }
    }
  }
  (void)table.TextAt(0);
  (void)table.TextAt(UINT64_MAX);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::string_view running = text;
  absl::string_view link;
  if (const size_t sep = text.find("\n----\n"); sep != absl::string_view::npos) {
    running = text.substr(0, sep + 1);
    link = text.substr(sep + 6);
  }
  auto run_table = KernelSymbolTable::Parse(running, "kallsyms");
  if (!run_table.ok()) {
    return 0;
  }
  Query(*run_table);
  if (link.empty()) {
    return 0;
  }
  auto link_table = KernelSymbolTable::Parse(link, "System.map");
  if (!link_table.ok()) {
    return 0;
  }
  Query(*link_table);
  (void)kwatch::core::kernel::ComputeSlide(*run_table, *link_table);
  return 0;
}
