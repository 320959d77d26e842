#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kwatch::core::kernel {

// One line of /proc/kallsyms or of a System.map: "ffffffff81000000 T _text [module]".
struct KernelSymbol {
  std::string name;
  uint64_t addr = 0;   // absolute: run-time for kallsyms, link-time for a System.map
  char type = '?';     // nm's letter: T/t text, D/d data, B/b bss, R/r read-only, W/w weak...
  std::string module;  // "" for the kernel image itself

  bool IsText() const { return type == 'T' || type == 't' || type == 'W' || type == 'w'; }
  bool IsData() const {
    return type == 'D' || type == 'd' || type == 'B' || type == 'b' || type == 'R' || type == 'r' ||
           type == 'V' || type == 'v';
  }
};

// A function symbol containing a kernel text address: `name`+`offset`.
struct KernelTextLocation {
  std::string name;
  uint64_t offset = 0;
  std::string module;  // "" for the kernel image

  // "schedule+0x1a", or "xfs_iget+0x10 [xfs]".
  std::string ToString() const;
};

// The symbols of one kernel symbol listing (kallsyms or System.map format), in file order,
// with a sorted index of text symbols for address lookups. Immutable once parsed; safe to
// share between threads.
class KernelSymbolTable {
 public:
  // Parses `text` ("ADDR TYPE NAME[\t[MODULE]]" per line). `origin` names the file in
  // errors. InvalidArgument (with the line number) on a malformed line; an empty listing is
  // an error too.
  static absl::StatusOr<KernelSymbolTable> Parse(absl::string_view text, absl::string_view origin);

  // A listing made of `symbols` (e.g. a vmlinux's symbol table).
  static KernelSymbolTable FromSymbols(std::vector<KernelSymbol> symbols, std::string origin);

  // Reads and parses `path`. NotFound / PermissionDenied carry the errno text.
  static absl::StatusOr<KernelSymbolTable> Load(const std::string& path);

  const std::string& origin() const { return origin_; }
  const std::vector<KernelSymbol>& symbols() const { return symbols_; }

  // True when every address is zero: /proc/kallsyms shown to a reader without
  // CAP_SYSLOG under kernel.kptr_restrict (1: non-root readers; 2: everyone).
  bool addresses_hidden() const { return addresses_hidden_; }

  // The first symbol of the kernel image (not a module) called `name`; nullptr if none.
  const KernelSymbol* Find(absl::string_view name) const;

  // How many kernel-image symbols are called `name`.
  size_t CountNamed(absl::string_view name) const;

  // Counts of kernel-image text and data symbols.
  size_t text_count() const { return text_count_; }
  size_t data_count() const { return data_count_; }

  // Whether the listing has the data symbols of CONFIG_KALLSYMS_ALL: data symbols other than
  // the linker's section boundaries (__start_*, __stop_*, ...), e.g. init_task or jiffies_64.
  bool HasDataSymbols() const;

  // The text symbol at or before `addr` (the kernel's own rule for function+offset), when
  // `addr` lies before the next text symbol and within the image or a module's text.
  std::optional<KernelTextLocation> TextAt(uint64_t addr) const;

 private:
  std::string origin_;
  std::vector<KernelSymbol> symbols_;
  std::vector<uint32_t> text_by_addr_;  // indexes of text symbols, sorted by address
  size_t text_count_ = 0;
  size_t data_count_ = 0;
  bool addresses_hidden_ = false;
  uint64_t etext_ = 0;  // end of the image's text (0: unknown)
  uint64_t sinittext_ = 0;
  uint64_t einittext_ = 0;
};

// The whole contents of a file (kallsyms, System.map, /proc/version). Errors name the call
// and the path with the errno text.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// The explanation for a kallsyms whose addresses are all zero: kernel.kptr_restrict (with
// its current value) hides them from readers without CAP_SYSLOG; run as root.
std::string HiddenAddressesAdvice();

}  // namespace kwatch::core::kernel
