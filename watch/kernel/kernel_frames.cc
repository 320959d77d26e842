#include "watch/kernel/kernel_frames.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace kwatch::watch::kernel {

std::vector<KernelFrame> KernelFrames(core::kernel::KernelSymbolResolver& symbols,
                                      const core::symbols::Symbols* user_syms,
                                      const PerfCallchain& chain) {
  std::vector<KernelFrame> out;
  for (const uint64_t ip : chain.kernel) {
    out.push_back({ip, false, symbols.Describe(ip)});
  }
  for (const uint64_t ip : chain.user) {
    std::string site = absl::StrFormat("0x%x", ip);
    if (user_syms != nullptr) {
      if (auto f = user_syms->FunctionAt(core::RemoteAddr{ip}); f.has_value()) {
        site = absl::StrFormat("%s+0x%x", f->name, ip - f->start.value);
        if (auto l = user_syms->LineAt(core::RemoteAddr{ip}); l.has_value()) {
          const size_t slash = l->file.rfind('/');
          absl::StrAppendFormat(&site, " (%s:%d)",
                                slash == std::string::npos ? l->file : l->file.substr(slash + 1),
                                l->line);
        }
      }
    }
    out.push_back({ip, true, std::move(site)});
  }
  return out;
}

}  // namespace kwatch::watch::kernel
