#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/kernel/kallsyms.h"
#include "core/symbols/symbols.h"

namespace kwatch::core::kernel {

// A text symbol whose link-time address (System.map, vmlinux) does not move by the slide.
struct SlideDisagreement {
  std::string name;
  uint64_t link_addr = 0;
  uint64_t run_addr = 0;
};

// The KASLR slide of a symbol listing against the running kernel's /proc/kallsyms.
struct SlideCheck {
  int64_t slide = 0;    // run-time minus link-time address, bytes
  std::string anchor;   // the symbol it was computed from: "_text" (or "_stext")
  size_t compared = 0;  // text symbols with one address in each listing, checked
  size_t disagreeing = 0;
  std::vector<SlideDisagreement> evidence;  // the first few disagreements
};

// Computes the slide of `link` (a System.map or vmlinux symbol table) from `running` (the
// kallsyms of the running kernel) at _text (else _stext), then checks it on every text
// symbol that appears exactly once in both. FailedPrecondition when the running addresses
// are hidden, when neither listing has the anchor, when fewer than 16 symbols can be
// compared, or when any compared symbol disagrees: the message gives the counts and the
// first disagreements (name, both addresses, the slide each implies).
absl::StatusOr<SlideCheck> ComputeSlide(const KernelSymbolTable& running,
                                        const KernelSymbolTable& link);

// Where kwatch looks for kernel symbols, in order.
struct KernelSymbolSources {
  std::string kallsyms = "/proc/kallsyms";
  std::string system_map;  // --system-map: tried first among System.maps ("" for none)
  std::string vmlinux;     // --vmlinux: tried first among vmlinux files ("" for none)
  std::string release;     // the running release (uname -r); "" to ask uname(2)
  std::string proc_version = "/proc/version";  // compared with a vmlinux's linux_banner
  // The usual places, after the explicit file; nullopt for the defaults below.
  std::optional<std::vector<std::string>> system_map_places;
  std::optional<std::vector<std::string>> vmlinux_places;
};

// /boot/System.map-RELEASE, /lib/modules/RELEASE/build/System.map.
std::vector<std::string> DefaultSystemMapPlaces(const std::string& release);
// Where perf looks for a vmlinux with debug info (tools/perf/util/symbol.c, vmlinux_path).
std::vector<std::string> DefaultVmlinuxPlaces(const std::string& release);

// A kernel symbol's run-time address and where it came from.
struct KernelSymbolAddress {
  std::string name;
  uint64_t addr = 0;       // run-time (absolute) address
  uint64_t link_addr = 0;  // address in the file it came from (== addr for kallsyms)
  int64_t slide = 0;       // addr - link_addr
  char type = '?';         // nm letter
  std::string source;      // "/proc/kallsyms", "System.map FILE", "vmlinux FILE"
  std::string file;        // the file itself
  bool from_vmlinux = false;
  std::optional<uint64_t> room;  // bytes to the next symbol of the listing (a size bound)
};

// Resolves kernel symbol names through the chain kallsyms -> System.map -> vmlinux (libelf
// for the symbols; the linux_banner string checked against /proc/version), and kernel
// text addresses to function+offset through kallsyms. Owns the listings it loaded; not
// thread-safe.
class KernelSymbolResolver {
 public:
  // Loads `sources.kallsyms`. FailedPrecondition when its addresses are hidden
  // (kptr_restrict: HiddenAddressesAdvice), or the errno of opening it.
  static absl::StatusOr<std::unique_ptr<KernelSymbolResolver>> Create(KernelSymbolSources sources);

  // The run-time address of `name`. Errors:
  //  FailedPrecondition: the explicit --system-map/--vmlinux does not match the running
  //   kernel (with the evidence);
  //  NotFound: no source has it: the message says whether kallsyms lacks data symbols
  //   (CONFIG_KALLSYMS_ALL), lists every source tried and why it failed, and how to pass
  //   --system-map / --vmlinux. Never a guessed address.
  absl::StatusOr<KernelSymbolAddress> Resolve(absl::string_view name);

  // function+offset of a kernel text address (from kallsyms).
  std::optional<KernelTextLocation> TextAt(uint64_t addr) const { return kallsyms_.TextAt(addr); }

  // Loads the line tables of the first vmlinux of the chain (--vmlinux, then perf's places)
  // that matches the running kernel and has DWARF (.debug_info, .debug_line). NotFound when
  // none does: the message lists each file tried and why. Loaded once; later calls return
  // the first answer.
  absl::Status LoadLines();
  // file:line (and the innermost inlined function) of a run-time kernel text address, from
  // that vmlinux's DWARF at the address minus the KASLR slide; nullopt without a vmlinux
  // (LoadLines says why) or when the address has no line.
  std::optional<symbols::SourceLine> LineAt(uint64_t addr);
  // A kernel code address for a recording's sites table: `function` ("name" or "name [module]",
  // "" outside any known function), `offset` from its start, and file:line as Describe shows
  // them (file relative to the kernel tree; "" and 0 without a vmlinux's lines).
  struct CodeSite {
    std::string function;
    uint64_t offset = 0;
    std::string file;
    int line = 0;
  };
  CodeSite Locate(uint64_t addr);
  // How kwatch names a kernel code address: "func+0x1a (fs/read_write.c:482)" with a
  // vmlinux's lines, "func+0x1a" from kallsyms alone, "0xffffffff81234567" outside any
  // known function. The file is shown relative to the kernel source tree when it lies in
  // one (the path after the compilation directory's last "linux-*/" or "build/"), else whole.
  std::string Describe(uint64_t addr);
  // The vmlinux LineAt reads ("" until LoadLines found one).
  const std::string& lines_file() const { return lines_file_; }

  const KernelSymbolTable& kallsyms() const { return kallsyms_; }
  const std::string& release() const { return sources_.release; }

 private:
  struct Listing {
    std::string kind;  // "System.map" or "vmlinux"
    std::string path;
    bool explicit_file = false;
    absl::Status status;  // why it cannot be used (ok: usable)
    std::optional<KernelSymbolTable> table;
    SlideCheck slide;
  };

  KernelSymbolResolver(KernelSymbolSources sources, KernelSymbolTable kallsyms)
      : sources_(std::move(sources)), kallsyms_(std::move(kallsyms)) {}
  void LoadListings();
  Listing LoadListing(const std::string& kind, const std::string& path, bool explicit_file) const;

  KernelSymbolSources sources_;
  KernelSymbolTable kallsyms_;
  bool listings_loaded_ = false;
  std::vector<Listing> listings_;             // in chain order
  std::optional<absl::Status> lines_status_;  // set by the first LoadLines
  std::unique_ptr<symbols::Symbols> lines_;   // the vmlinux's DWARF, at link-time addresses
  std::string lines_file_;
  int64_t lines_slide_ = 0;
};

// The symbols of a vmlinux ELF file (.symtab) as a listing, with nm's letters derived from
// the symbol's section (text, data, bss, read-only). `banner` receives the linux_banner
// string when the file has one.
absl::StatusOr<KernelSymbolTable> LoadVmlinuxSymbols(const std::string& path, std::string* banner);

}  // namespace kwatch::core::kernel
