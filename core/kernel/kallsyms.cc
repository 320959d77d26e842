#include "core/kernel/kallsyms.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"

namespace kwatch::core::kernel {

namespace {

// Data symbols that every x86-64 kernel has and that only CONFIG_KALLSYMS_ALL lists.
constexpr std::array<const char*, 4> kAllSymbolsWitnesses = {"init_task", "jiffies_64",
                                                             "linux_banner", "loops_per_jiffy"};

bool IsSectionBoundary(absl::string_view name) {
  return absl::StartsWith(name, "__start") || absl::StartsWith(name, "__stop") ||
         absl::StartsWith(name, "__init_") || absl::StartsWith(name, "__end") ||
         absl::StartsWith(name, "_s") || absl::StartsWith(name, "_e");
}

}  // namespace

std::string KernelTextLocation::ToString() const {
  std::string out = offset == 0 ? name : absl::StrFormat("%s+0x%x", name, offset);
  if (!module.empty()) {
    absl::StrAppend(&out, " [", module, "]");
  }
  return out;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("open(", path, ")"));
  }
  std::string out;
  std::array<char, 1 << 16> buf{};
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return SyscallError(err, absl::StrCat("read(", path, ")"));
    }
    if (n == 0) {
      break;
    }
    out.append(buf.data(), static_cast<size_t>(n));
  }
  return out;
}

absl::StatusOr<KernelSymbolTable> KernelSymbolTable::Parse(absl::string_view text,
                                                           absl::string_view origin) {
  std::vector<KernelSymbol> symbols;
  size_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty()) {
      continue;
    }
    // "ADDR TYPE NAME" then, in kallsyms, "\t[MODULE]".
    const std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (parts.size() < 3 || parts[1].size() != 1 || parts.size() > 4) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: not a symbol listing line (expected 'ADDRESS TYPE NAME'): '%s'",
                          origin, line_no, line));
    }
    KernelSymbol sym;
    const absl::string_view hex = parts[0];
    const auto res = std::from_chars(hex.data(), hex.data() + hex.size(), sym.addr, 16);
    if (res.ec != std::errc() || res.ptr != hex.data() + hex.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: '%s' is not a hexadecimal address: '%s'", origin, line_no, hex, line));
    }
    sym.type = parts[1][0];
    sym.name.assign(parts[2].data(), parts[2].size());
    if (parts.size() == 4) {
      absl::string_view mod = parts[3];
      if (mod.size() < 2 || mod.front() != '[' || mod.back() != ']') {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s:%d: expected '[module]' after the name: '%s'", origin, line_no, line));
      }
      const absl::string_view inner = mod.substr(1, mod.size() - 2);
      sym.module.assign(inner.data(), inner.size());
    }
    symbols.push_back(std::move(sym));
  }
  if (symbols.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": no symbols in it"));
  }
  std::string origin_name(origin);
  return FromSymbols(std::move(symbols), std::move(origin_name));
}

KernelSymbolTable KernelSymbolTable::FromSymbols(std::vector<KernelSymbol> symbols,
                                                 std::string origin) {
  KernelSymbolTable t;
  t.origin_ = std::move(origin);
  t.symbols_ = std::move(symbols);
  bool all_zero = true;
  for (const KernelSymbol& sym : t.symbols_) {
    all_zero = all_zero && sym.addr == 0;
    if (sym.module.empty()) {
      if (sym.IsText()) {
        ++t.text_count_;
      } else if (sym.IsData()) {
        ++t.data_count_;
      }
    }
  }
  t.addresses_hidden_ = all_zero && !t.symbols_.empty();
  for (uint32_t i = 0; i < t.symbols_.size(); ++i) {
    if (t.symbols_[i].IsText()) {
      t.text_by_addr_.push_back(i);
    }
  }
  const auto addr_of = [&](const char* name) -> uint64_t {
    const KernelSymbol* s = t.Find(name);
    return s != nullptr ? s->addr : 0;
  };
  t.etext_ = addr_of("_etext");
  t.sinittext_ = addr_of("_sinittext");
  t.einittext_ = addr_of("_einittext");
  std::stable_sort(t.text_by_addr_.begin(), t.text_by_addr_.end(),
                   [&](uint32_t a, uint32_t b) { return t.symbols_[a].addr < t.symbols_[b].addr; });
  return t;
}

absl::StatusOr<KernelSymbolTable> KernelSymbolTable::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) {
    return text.status();
  }
  return Parse(*text, path);
}

const KernelSymbol* KernelSymbolTable::Find(absl::string_view name) const {
  for (const KernelSymbol& s : symbols_) {
    if (s.module.empty() && s.name == name) {
      return &s;
    }
  }
  return nullptr;
}

size_t KernelSymbolTable::CountNamed(absl::string_view name) const {
  return static_cast<size_t>(std::count_if(symbols_.begin(), symbols_.end(), [&](const auto& s) {
    return s.module.empty() && s.name == name;
  }));
}

bool KernelSymbolTable::HasDataSymbols() const {
  for (const char* name : kAllSymbolsWitnesses) {
    const KernelSymbol* s = Find(name);
    if (s != nullptr && s->IsData()) {
      return true;
    }
  }
  // Any data symbol that is not a linker boundary is enough too.
  return std::any_of(symbols_.begin(), symbols_.end(), [](const KernelSymbol& s) {
    return s.module.empty() && s.IsData() && !IsSectionBoundary(s.name);
  });
}

std::optional<KernelTextLocation> KernelSymbolTable::TextAt(uint64_t addr) const {
  if (addresses_hidden_ || text_by_addr_.empty()) {
    return std::nullopt;
  }
  // The last text symbol whose address is <= addr.
  auto it = std::upper_bound(text_by_addr_.begin(), text_by_addr_.end(), addr,
                             [&](uint64_t a, uint32_t i) { return a < symbols_[i].addr; });
  if (it == text_by_addr_.begin()) {
    return std::nullopt;
  }
  --it;
  // Among aliases at the same address, prefer a global (T) name over a local one.
  const uint64_t at = symbols_[*it].addr;
  auto best = it;
  for (auto j = it;; --j) {
    if (symbols_[*j].addr != at) {
      break;
    }
    if (symbols_[*j].type == 'T' && symbols_[*best].type != 'T') {
      best = j;
    }
    if (j == text_by_addr_.begin()) {
      break;
    }
  }
  const KernelSymbol& s = symbols_[*best];
  // Past the kernel image's text end, or into another module's text, nothing contains it.
  if (s.module.empty()) {
    const bool in_init =
        sinittext_ != 0 && einittext_ != 0 && addr >= sinittext_ && addr < einittext_;
    if (etext_ != 0 && addr >= etext_ && !in_init) {
      return std::nullopt;
    }
  }
  return KernelTextLocation{s.name, addr - s.addr, s.module};
}

std::string HiddenAddressesAdvice() {
  absl::StatusOr<std::string> level = ReadWholeFile("/proc/sys/kernel/kptr_restrict");
  const std::string now =
      level.ok() ? std::string(absl::StripAsciiWhitespace(*level)) : std::string("unknown");
  return absl::StrCat(
      "/proc/kallsyms shows every address as 0: kernel.kptr_restrict (now ", now,
      ") hides kernel addresses from readers without CAP_SYSLOG (1: everyone but root, 2: "
      "everyone); run kwatch as root (with kptr_restrict <= 1)");
}

}  // namespace kwatch::core::kernel
