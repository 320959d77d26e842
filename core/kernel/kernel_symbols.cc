#include "core/kernel/kernel_symbols.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "core/symbols/elf_index.h"

namespace kwatch::core::kernel {

namespace {

constexpr size_t kMinCompared = 16;
constexpr size_t kMaxEvidence = 5;

std::string SignedHex(int64_t v) {
  return v < 0 ? absl::StrFormat("-0x%x", static_cast<uint64_t>(0) - static_cast<uint64_t>(v))
               : absl::StrFormat("+0x%x", static_cast<uint64_t>(v));
}

// name -> address of text symbols of the kernel image that appear exactly once.
absl::flat_hash_map<std::string, uint64_t> UniqueText(const KernelSymbolTable& t) {
  absl::flat_hash_map<std::string, uint64_t> out;
  absl::flat_hash_map<std::string, int> count;
  for (const KernelSymbol& s : t.symbols()) {
    if (s.module.empty() && s.IsText()) {
      ++count[s.name];
      out[s.name] = s.addr;
    }
  }
  for (const auto& [name, n] : count) {
    if (n != 1) {
      out.erase(name);
    }
  }
  return out;
}

struct ElfDeleter {
  void operator()(Elf* e) const { elf_end(e); }
};

// An ELF file opened for reading with libelf; the descriptor lives as long as the handle.
struct ElfFile {
  UniqueFd fd;
  std::unique_ptr<Elf, ElfDeleter> elf;
};

absl::StatusOr<ElfFile> OpenElf(const std::string& path) {
  ElfFile f{UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), nullptr};
  if (!f.fd) {
    const int err = errno;
    return SyscallError(err, absl::StrCat("open(", path, ")"));
  }
  elf_version(EV_CURRENT);
  f.elf.reset(elf_begin(f.fd.get(), ELF_C_READ_MMAP, nullptr));
  if (f.elf == nullptr || elf_kind(f.elf.get()) != ELF_K_ELF) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an ELF file"));
  }
  return f;
}

std::string ElfError(absl::string_view call) {
  return absl::StrCat(call, ": ", elf_errmsg(-1));
}

std::string RunningRelease() {
  utsname u{};
  if (uname(&u) != 0) {
    return "";
  }
  return u.release;
}

std::string StatusText(const absl::Status& s) {
  std::string text(s.message());
  return text;
}

}  // namespace

absl::StatusOr<SlideCheck> ComputeSlide(const KernelSymbolTable& running,
                                        const KernelSymbolTable& link) {
  if (running.addresses_hidden()) {
    return absl::FailedPreconditionError(HiddenAddressesAdvice());
  }
  SlideCheck check;
  const KernelSymbol* run_anchor = nullptr;
  const KernelSymbol* link_anchor = nullptr;
  for (const char* anchor : {"_text", "_stext"}) {
    run_anchor = running.Find(anchor);
    link_anchor = link.Find(anchor);
    if (run_anchor != nullptr && link_anchor != nullptr) {
      check.anchor = anchor;
      break;
    }
  }
  if (check.anchor.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(link.origin(), " has no _text or _stext symbol in common with ",
                     running.origin(), ": it is not a symbol listing of a Linux kernel image"));
  }
  check.slide = static_cast<int64_t>(run_anchor->addr - link_anchor->addr);
  const auto run_text = UniqueText(running);
  const auto link_text = UniqueText(link);
  std::vector<std::pair<std::string, uint64_t>> sorted(link_text.begin(), link_text.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  for (const auto& [name, link_addr] : sorted) {
    auto it = run_text.find(name);
    if (it == run_text.end()) {
      continue;
    }
    ++check.compared;
    if (it->second - link_addr != static_cast<uint64_t>(check.slide)) {
      ++check.disagreeing;
      if (check.evidence.size() < kMaxEvidence) {
        check.evidence.push_back(SlideDisagreement{name, link_addr, it->second});
      }
    }
  }
  if (check.compared < kMinCompared) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s shares only %d text symbols with %s (at least %d are needed to check the KASLR "
        "slide): it does not describe the running kernel",
        link.origin(), check.compared, running.origin(), kMinCompared));
  }
  if (check.disagreeing > 0) {
    std::vector<std::string> ev;
    for (const SlideDisagreement& d : check.evidence) {
      ev.push_back(absl::StrFormat("%s at 0x%x in the file, 0x%x running (slide %s)", d.name,
                                   d.link_addr, d.run_addr,
                                   SignedHex(static_cast<int64_t>(d.run_addr - d.link_addr))));
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s does not match the running kernel: %s gives a KASLR slide of %s (0x%x in the "
        "file, 0x%x in %s), but %d of the %d text symbols found in both disagree, e.g. %s",
        link.origin(), check.anchor, SignedHex(check.slide), link_anchor->addr, run_anchor->addr,
        running.origin(), check.disagreeing, check.compared, absl::StrJoin(ev, "; ")));
  }
  return check;
}

std::vector<std::string> DefaultSystemMapPlaces(const std::string& release) {
  return {absl::StrCat("/boot/System.map-", release),
          absl::StrCat("/lib/modules/", release, "/build/System.map")};
}

std::vector<std::string> DefaultVmlinuxPlaces(const std::string& release) {
  return {absl::StrCat("/boot/vmlinux-", release),
          absl::StrCat("/usr/lib/debug/boot/vmlinux-", release),
          absl::StrCat("/usr/lib/debug/boot/vmlinux-", release, ".debug"),
          absl::StrCat("/lib/modules/", release, "/build/vmlinux"),
          absl::StrCat("/usr/lib/debug/lib/modules/", release, "/vmlinux"),
          absl::StrCat("/usr/lib/debug/lib/modules/", release, "/vmlinux.debug")};
}

namespace {

// Whether the ELF file at `path` carries DWARF line tables (.debug_info and .debug_line).
absl::Status HasLineTables(const std::string& path) {
  KW_ASSIGN_OR_RETURN(ElfFile file, OpenElf(path));
  std::unique_ptr<Elf, ElfDeleter>& elf = file.elf;
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf.get(), &shstrndx) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", ElfError("elf_getshdrstrndx")));
  }
  bool info = false;
  bool line = false;
  for (Elf_Scn* scn = elf_nextscn(elf.get(), nullptr); scn != nullptr;
       scn = elf_nextscn(elf.get(), scn)) {
    GElf_Shdr shdr{};
    const char* name = gelf_getshdr(scn, &shdr) != nullptr
                           ? elf_strptr(elf.get(), shstrndx, shdr.sh_name)
                           : nullptr;
    if (name != nullptr && shdr.sh_type != SHT_NOBITS) {
      info = info || std::strcmp(name, ".debug_info") == 0;
      line = line || std::strcmp(name, ".debug_line") == 0;
    }
  }
  if (!info || !line) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " has no DWARF line tables (", info ? "" : ".debug_info ", line ? "" : ".debug_line ",
        "missing): a kernel built without CONFIG_DEBUG_INFO, or stripped"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KernelSymbolResolver::LoadLines() {
  if (lines_status_.has_value()) {
    return *lines_status_;
  }
  LoadListings();
  std::vector<std::string> tried;
  for (const Listing& l : listings_) {
    if (l.kind != "vmlinux") {
      continue;
    }
    absl::Status usable = l.status.ok() ? HasLineTables(l.path) : l.status;
    absl::StatusOr<std::unique_ptr<symbols::Symbols>> syms = absl::InternalError("unused");
    if (usable.ok()) {
      syms = symbols::Symbols::ForFile(l.path);
      usable = syms.status();
    }
    if (!usable.ok()) {
      tried.push_back(absl::StrCat(l.path, ": ", StatusText(usable)));
      continue;
    }
    lines_ = *std::move(syms);
    lines_file_ = l.path;
    lines_slide_ = l.slide.slide;
    lines_status_ = absl::OkStatus();
    return *lines_status_;
  }
  lines_status_ = absl::NotFoundError(absl::StrCat(
      "no vmlinux with debug info matches the running kernel (", sources_.release,
      "), so kernel code is shown as function+offset without file:line",
      tried.empty() ? std::string(" (no vmlinux places configured)")
                    : absl::StrCat(".\nvmlinux files tried:\n  ", absl::StrJoin(tried, "\n  ")),
      "\nGive one with --vmlinux FILE (from the kernel build, or the distribution's debug "
      "package, e.g. linux-image-",
      sources_.release, "-dbg)."));
  return *lines_status_;
}

std::optional<symbols::SourceLine> KernelSymbolResolver::LineAt(uint64_t addr) {
  if (!LoadLines().ok()) {
    return std::nullopt;
  }
  return lines_->LineAt(RemoteAddr{addr - static_cast<uint64_t>(lines_slide_)});
}

KernelSymbolResolver::CodeSite KernelSymbolResolver::Locate(uint64_t addr) {
  CodeSite site;
  const std::optional<KernelTextLocation> text = TextAt(addr);
  if (!text.has_value()) {
    return site;
  }
  site.function =
      text->module.empty() ? text->name : absl::StrCat(text->name, " [", text->module, "]");
  site.offset = text->offset;
  if (!text->module.empty()) {
    return site;  // lines come from vmlinux, which holds no module code
  }
  if (std::optional<symbols::SourceLine> line = LineAt(addr); line.has_value()) {
    absl::string_view file = line->file;
    for (absl::string_view tree : {"/linux-", "/build/"}) {
      const size_t at = file.rfind(tree);
      if (at != absl::string_view::npos) {
        const size_t slash = file.find('/', at + 1);
        file = slash == absl::string_view::npos ? file : file.substr(slash + 1);
        break;
      }
    }
    site.file.assign(file.data(), file.size());
    site.line = line->line;
  }
  return site;
}

std::string KernelSymbolResolver::Describe(uint64_t addr) {
  const std::optional<KernelTextLocation> text = TextAt(addr);
  std::string out = text.has_value() ? text->ToString() : absl::StrFormat("0x%x", addr);
  if (!text.has_value() || !text->module.empty()) {
    return out;
  }
  const CodeSite site = Locate(addr);
  if (!site.file.empty()) {
    absl::StrAppendFormat(&out, " (%s:%d)", site.file, site.line);
  }
  return out;
}

absl::StatusOr<KernelSymbolTable> LoadVmlinuxSymbols(const std::string& path, std::string* banner) {
  KW_ASSIGN_OR_RETURN(const symbols::ElfSymbolIndex index, symbols::ElfSymbolIndex::FromFile(path));
  if (std::none_of(index.sections().begin(), index.sections().end(),
                   [](const symbols::ElfSection& s) { return s.type == SHT_SYMTAB; })) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no symbol table (.symtab): a stripped image has no symbols"));
  }
  std::vector<KernelSymbol> syms;
  syms.reserve(index.symbols().size());
  const symbols::ElfSymbol* banner_sym = nullptr;
  for (const symbols::ElfSymbol& sym : index.symbols()) {
    // nm's letter from the section: text, bss, data, read-only; 'a' outside any section.
    char letter = 'a';
    if (const symbols::ElfSection* scn = index.SectionOf(sym); scn != nullptr) {
      if ((scn->flags & SHF_EXECINSTR) != 0) {
        letter = 't';
      } else if (scn->type == SHT_NOBITS) {
        letter = 'b';
      } else if ((scn->flags & SHF_WRITE) != 0) {
        letter = 'd';
      } else {
        letter = 'r';
      }
    }
    if (sym.is_global()) {
      letter = static_cast<char>(absl::ascii_toupper(static_cast<unsigned char>(letter)));
    }
    if (sym.name == "linux_banner") {
      banner_sym = &sym;
    }
    syms.push_back(KernelSymbol{std::string(sym.name), sym.addr, letter, ""});
  }
  if (banner != nullptr && banner_sym != nullptr && banner_sym->addr != 0) {
    const symbols::ElfSection* scn = index.SectionOf(*banner_sym);
    const absl::StatusOr<std::span<const uint8_t>> bytes =
        scn != nullptr ? index.SectionBytes(*scn) : absl::NotFoundError("no section");
    if (bytes.ok() && banner_sym->addr >= scn->addr &&
        banner_sym->addr - scn->addr < bytes->size()) {
      const auto* p = reinterpret_cast<const char*>(bytes->data() + (banner_sym->addr - scn->addr));
      const size_t left = bytes->size() - (banner_sym->addr - scn->addr);
      *banner = std::string(p, strnlen(p, left));
    }
  }
  if (syms.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the symbol table is empty"));
  }
  return KernelSymbolTable::FromSymbols(std::move(syms), path);
}

absl::StatusOr<std::unique_ptr<KernelSymbolResolver>> KernelSymbolResolver::Create(
    KernelSymbolSources sources) {
  if (sources.release.empty()) {
    sources.release = RunningRelease();
  }
  absl::StatusOr<KernelSymbolTable> kallsyms = KernelSymbolTable::Load(sources.kallsyms);
  if (!kallsyms.ok()) {
    return kallsyms.status();
  }
  if (kallsyms->addresses_hidden()) {
    return absl::FailedPreconditionError(HiddenAddressesAdvice());
  }
  return std::unique_ptr<KernelSymbolResolver>(
      new KernelSymbolResolver(std::move(sources), *std::move(kallsyms)));
}

KernelSymbolResolver::Listing KernelSymbolResolver::LoadListing(const std::string& kind,
                                                                const std::string& path,
                                                                bool explicit_file) const {
  Listing l;
  l.kind = kind;
  l.path = path;
  l.explicit_file = explicit_file;
  absl::StatusOr<KernelSymbolTable> table;
  if (kind == "System.map") {
    // A System.map named for a release says which kernel it belongs to.
    const std::string base = path.substr(path.find_last_of('/') + 1);
    constexpr absl::string_view kPrefix = "System.map-";
    if (absl::StartsWith(base, kPrefix) && base.substr(kPrefix.size()) != sources_.release) {
      l.status = absl::FailedPreconditionError(
          absl::StrFormat("%s is named for release %s, but the running kernel is %s", path,
                          base.substr(kPrefix.size()), sources_.release));
      return l;
    }
    table = KernelSymbolTable::Load(path);
  } else {
    std::string banner;
    table = LoadVmlinuxSymbols(path, &banner);
    if (table.ok()) {
      absl::StatusOr<std::string> version = ReadWholeFile(sources_.proc_version);
      if (banner.empty()) {
        l.status = absl::FailedPreconditionError(absl::StrCat(
            path, " has no linux_banner string to compare with ", sources_.proc_version));
        return l;
      }
      if (version.ok() &&
          absl::StripAsciiWhitespace(*version) != absl::StripAsciiWhitespace(banner)) {
        l.status = absl::FailedPreconditionError(
            absl::StrFormat("%s is another kernel build: its linux_banner is '%s', %s says '%s'",
                            path, absl::StripAsciiWhitespace(banner), sources_.proc_version,
                            absl::StripAsciiWhitespace(*version)));
        return l;
      }
    }
  }
  if (!table.ok()) {
    l.status = table.status();
    return l;
  }
  absl::StatusOr<SlideCheck> slide = ComputeSlide(kallsyms_, *table);
  if (!slide.ok()) {
    l.status = slide.status();
    return l;
  }
  l.slide = *slide;
  l.table = *std::move(table);
  return l;
}

void KernelSymbolResolver::LoadListings() {
  if (listings_loaded_) {
    return;
  }
  listings_loaded_ = true;
  const std::vector<std::string> maps =
      sources_.system_map_places.value_or(DefaultSystemMapPlaces(sources_.release));
  const std::vector<std::string> vmlinuxes =
      sources_.vmlinux_places.value_or(DefaultVmlinuxPlaces(sources_.release));
  if (!sources_.system_map.empty()) {
    listings_.push_back(LoadListing("System.map", sources_.system_map, true));
  }
  for (const std::string& p : maps) {
    if (p != sources_.system_map) {
      listings_.push_back(LoadListing("System.map", p, false));
    }
  }
  if (!sources_.vmlinux.empty()) {
    listings_.push_back(LoadListing("vmlinux", sources_.vmlinux, true));
  }
  for (const std::string& p : vmlinuxes) {
    if (p != sources_.vmlinux) {
      listings_.push_back(LoadListing("vmlinux", p, false));
    }
  }
}

absl::StatusOr<KernelSymbolAddress> KernelSymbolResolver::Resolve(absl::string_view name) {
  const auto room_after = [](const KernelSymbolTable& t, uint64_t addr) -> std::optional<uint64_t> {
    std::optional<uint64_t> best;
    for (const KernelSymbol& s : t.symbols()) {
      if (s.module.empty() && s.addr > addr && (!best.has_value() || s.addr - addr < *best)) {
        best = s.addr - addr;
      }
    }
    return best;
  };
  std::vector<std::string> tried;
  if (const KernelSymbol* s = kallsyms_.Find(name); s != nullptr) {
    KernelSymbolAddress out;
    out.name.assign(name.data(), name.size());
    out.addr = out.link_addr = s->addr;
    out.type = s->type;
    out.source = out.file = sources_.kallsyms;
    out.room = room_after(kallsyms_, s->addr);
    return out;
  }
  const bool all = kallsyms_.HasDataSymbols();
  tried.push_back(
      all ? absl::StrFormat("%s: no symbol '%s' (it lists %d text and %d data symbols)",
                            sources_.kallsyms, name, kallsyms_.text_count(), kallsyms_.data_count())
          : absl::StrFormat("%s: no symbol '%s'; it lists %d text symbols but no data symbols "
                            "(only %d section boundaries): CONFIG_KALLSYMS_ALL is off",
                            sources_.kallsyms, name, kallsyms_.text_count(),
                            kallsyms_.data_count()));
  LoadListings();
  for (const Listing& l : listings_) {
    if (!l.status.ok()) {
      // A file the user named that does not match is refused outright, with the evidence.
      if (l.explicit_file && !absl::IsNotFound(l.status) &&
          l.status.code() == absl::StatusCode::kFailedPrecondition) {
        return absl::FailedPreconditionError(
            absl::StrCat("refusing --", l.kind == "System.map" ? "system-map" : "vmlinux", " ",
                         l.path, ": ", StatusText(l.status),
                         ". kwatch never guesses an address: give the file "
                         "of the running kernel (",
                         sources_.release, ")"));
      }
      tried.push_back(absl::StrCat(l.kind, " ", l.path, ": ", StatusText(l.status)));
      continue;
    }
    const KernelSymbol* s = l.table->Find(name);
    if (s == nullptr) {
      tried.push_back(
          absl::StrFormat("%s %s: matches the running kernel (slide %s) but has no "
                          "symbol '%s'",
                          l.kind, l.path, SignedHex(l.slide.slide), name));
      continue;
    }
    KernelSymbolAddress out;
    out.name.assign(name.data(), name.size());
    out.link_addr = s->addr;
    out.slide = l.slide.slide;
    out.addr = s->addr + static_cast<uint64_t>(l.slide.slide);
    out.type = s->type;
    out.source = absl::StrCat(l.kind, " ", l.path);
    out.file = l.path;
    out.from_vmlinux = l.kind == "vmlinux";
    out.room = room_after(*l.table, s->addr);
    return out;
  }
  std::string head =
      all ? absl::StrFormat("no kernel symbol '%s' in any source", name)
          : absl::StrFormat(
                "cannot find kernel symbol '%s': this kernel was built without "
                "CONFIG_KALLSYMS_ALL, so /proc/kallsyms lists functions but not variables, and "
                "no System.map or vmlinux of this kernel (%s) was found",
                name, sources_.release);
  return absl::NotFoundError(absl::StrCat(
      head, ".\nSources tried:\n  ", absl::StrJoin(tried, "\n  "),
      "\nGive the kernel's System.map with --system-map FILE, or its vmlinux with debug info "
      "with --vmlinux FILE (from the kernel build, or the distribution's debug package). "
      "kwatch never guesses an address."));
}

}  // namespace kwatch::core::kernel
