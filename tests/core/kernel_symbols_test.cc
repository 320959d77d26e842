#include "core/kernel/kernel_symbols.h"

#include <stdlib.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/kernel/kallsyms.h"
#include "tests/test_util.h"

namespace kwatch::core::kernel {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A fake link base: fixture maps are made as if the kernel had been linked this much lower,
// so the slide kwatch must compute is exactly this (whatever KASLR did on this boot).
constexpr uint64_t kFixtureSlide = 0x1e00000;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Release() {
  utsname u{};
  uname(&u);
  return u.release;
}

// The kernel image's lines of /proc/kallsyms, parsed independently of kwatch.
struct RawSym {
  uint64_t addr;
  char type;
  std::string name;
};
std::vector<RawSym> RawKallsyms() {
  std::vector<RawSym> out;
  std::istringstream in(ReadFile("/proc/kallsyms"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.find('[') != std::string::npos) {
      continue;  // modules
    }
    char name[512] = {};
    char type = 0;
    unsigned long long addr = 0;
    if (std::sscanf(line.c_str(), "%llx %c %511s", &addr, &type, name) == 3) {
      out.push_back(RawSym{addr, type, name});
    }
  }
  return out;
}

bool IsTextLetter(char c) {
  return c == 'T' || c == 't' || c == 'W' || c == 'w';
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kwatch-kernel-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { (void)!std::system(("rm -rf " + path_).c_str()); }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The address the fixtures give `jiffies`: inside the kernel's .data, which on x86-64 begins
// with init_stack (__start_init_stack, the first data symbol after the read-only sections);
// its lowest word holds STACK_END_MAGIC, written once at boot, so no watch ever fires on it.
uint64_t FixtureJiffiesRunAddr(const std::vector<RawSym>& syms) {
  for (const RawSym& s : syms) {
    if (s.name == "__start_init_stack") {
      return s.addr;
    }
  }
  return 0;
}

// A System.map made from this machine's kallsyms: text symbols moved to the fixture link
// base, plus a `jiffies` data line. `skew` moves every other symbol by that many more bytes.
std::string FixtureMap(const std::vector<RawSym>& syms, uint64_t skew = 0) {
  std::string out;
  size_t i = 0;
  for (const RawSym& s : syms) {
    if (!IsTextLetter(s.type)) {
      continue;
    }
    const uint64_t extra = (skew != 0 && (i++ % 2) == 1) ? skew : 0;
    out += absl::StrFormat("%016x %c %s\n", s.addr - kFixtureSlide + extra, s.type, s.name);
  }
  out += absl::StrFormat("%016x D jiffies\n", FixtureJiffiesRunAddr(syms) - kFixtureSlide);
  return out;
}

TEST(KallsymsTest, ParsesThisKernelsListing) {
  const std::vector<RawSym> raw = RawKallsyms();
  size_t text = 0;
  size_t data = 0;
  for (const RawSym& s : raw) {
    text += IsTextLetter(s.type) ? 1 : 0;
    data += std::string("dDbBrRvV").find(s.type) != std::string::npos ? 1 : 0;
  }
  auto t = KernelSymbolTable::Load("/proc/kallsyms");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->addresses_hidden());  // root
  EXPECT_EQ(t->text_count(), text);
  EXPECT_EQ(t->data_count(), data);
  ASSERT_NE(t->Find("_text"), nullptr);
  EXPECT_EQ(t->Find("_text")->type, 'T');
  // This project's kernels are built without CONFIG_KALLSYMS_ALL (DESIGN.md).
  EXPECT_EQ(t->Find("jiffies"), nullptr);
  EXPECT_FALSE(t->HasDataSymbols());
}

TEST(KallsymsTest, SymbolizesKernelText) {
  auto t = KernelSymbolTable::Load("/proc/kallsyms");
  ASSERT_TRUE(t.ok()) << t.status();
  const KernelSymbol* sched = t->Find("schedule");
  ASSERT_NE(sched, nullptr);
  // The next text symbol after schedule bounds the offsets that still name it.
  uint64_t next = UINT64_MAX;
  for (const KernelSymbol& s : t->symbols()) {
    if (s.IsText() && s.addr > sched->addr && s.addr < next) {
      next = s.addr;
    }
  }
  ASSERT_GT(next - sched->addr, 0x10U);
  auto loc = t->TextAt(sched->addr + 0x10);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->ToString(), "schedule+0x10");
  EXPECT_EQ(t->TextAt(sched->addr)->ToString(), "schedule");
  EXPECT_FALSE(t->TextAt(0x1000).has_value());  // a user address
}

TEST(KallsymsTest, ModulesAndErrors) {
  auto t = KernelSymbolTable::Parse(
      "ffffffff81000000 T _text\n"
      "ffffffff81000100 t helper\n"
      "ffffffffc0001000 t xfs_iget\t[xfs]\n",
      "fixture");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->TextAt(0xffffffffc0001010)->ToString(), "xfs_iget+0x10 [xfs]");
  EXPECT_EQ(t->TextAt(0xffffffff81000104)->ToString(), "helper+0x4");
  EXPECT_EQ(t->Find("xfs_iget"), nullptr);  // the image's symbols only

  auto bad = KernelSymbolTable::Parse("ffffffff81000000 T _text\nzzzz T foo\n", "map");
  EXPECT_EQ(bad.status().message(), "map:2: 'zzzz' is not a hexadecimal address: 'zzzz T foo'");
  auto short_line = KernelSymbolTable::Parse("ffffffff81000000 T\n", "map");
  EXPECT_EQ(short_line.status().message(),
            "map:1: not a symbol listing line (expected 'ADDRESS TYPE NAME'): "
            "'ffffffff81000000 T'");
  EXPECT_EQ(KernelSymbolTable::Parse("\n\n", "empty").status().message(),
            "empty: no symbols in it");
}

TEST(KallsymsTest, HiddenAddressesAreDetected) {
  // What a reader without CAP_SYSLOG sees under kernel.kptr_restrict.
  auto t = KernelSymbolTable::Parse(
      "0000000000000000 T _text\n0000000000000000 T _stext\n0000000000000000 t helper\n",
      "/proc/kallsyms");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->addresses_hidden());
  EXPECT_FALSE(t->TextAt(0).has_value());
  auto map = KernelSymbolTable::Parse("ffffffff81000000 T _text\n", "System.map");
  auto slide = ComputeSlide(*t, *map);
  EXPECT_EQ(slide.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(slide.status().message()),
              StartsWith("/proc/kallsyms shows every address as 0: kernel.kptr_restrict (now "));
  EXPECT_THAT(std::string(slide.status().message()), HasSubstr("run kwatch as root"));
}

TEST(KernelSlideTest, FixtureMapGivesTheSlideItWasMadeWith) {
  const std::vector<RawSym> raw = RawKallsyms();
  std::map<std::string, int> names;
  for (const RawSym& s : raw) {
    if (IsTextLetter(s.type)) {
      ++names[s.name];
    }
  }
  size_t unique = 0;
  for (const auto& [n, c] : names) {
    unique += c == 1 ? 1 : 0;
  }
  auto running = KernelSymbolTable::Load("/proc/kallsyms");
  auto map = KernelSymbolTable::Parse(FixtureMap(raw), "fixture.map");
  ASSERT_TRUE(running.ok() && map.ok());
  auto slide = ComputeSlide(*running, *map);
  ASSERT_TRUE(slide.ok()) << slide.status();
  EXPECT_EQ(slide->slide, static_cast<int64_t>(kFixtureSlide));
  EXPECT_EQ(slide->anchor, "_text");
  EXPECT_EQ(slide->compared, unique);
  EXPECT_EQ(slide->disagreeing, 0U);
}

TEST(KernelSlideTest, InconsistentMapIsRefusedWithEvidence) {
  const std::vector<RawSym> raw = RawKallsyms();
  auto running = KernelSymbolTable::Load("/proc/kallsyms");
  auto map = KernelSymbolTable::Parse(FixtureMap(raw, /*skew=*/0x1000), "skewed.map");
  ASSERT_TRUE(running.ok() && map.ok());
  auto slide = ComputeSlide(*running, *map);
  ASSERT_EQ(slide.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(slide.status().message());
  EXPECT_THAT(msg, StartsWith("skewed.map does not match the running kernel: _text gives a "
                              "KASLR slide of +0x1e00000"));
  EXPECT_THAT(msg, HasSubstr("in the file, 0x"));
  EXPECT_THAT(msg, HasSubstr("running (slide +0x1dff000)"));
}

TEST(KernelSlideTest, UnrelatedListingIsRefused) {
  auto running = KernelSymbolTable::Load("/proc/kallsyms");
  auto other = KernelSymbolTable::Parse("0000000000401000 T main\n", "a.out.map");
  ASSERT_TRUE(running.ok() && other.ok());
  EXPECT_EQ(ComputeSlide(*running, *other).status().message(),
            "a.out.map has no _text or _stext symbol in common with /proc/kallsyms: it is not "
            "a symbol listing of a Linux kernel image");
}

TEST(KernelResolverTest, KallsymsTextSymbol) {
  auto r = KernelSymbolResolver::Create({});
  ASSERT_TRUE(r.ok()) << r.status();
  auto a = (*r)->Resolve("schedule");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->addr, (*r)->kallsyms().Find("schedule")->addr);
  EXPECT_EQ(a->source, "/proc/kallsyms");
  EXPECT_EQ(a->slide, 0);
}

TEST(KernelResolverTest, NothingResolvesJiffiesHere) {
  TempDir dir;
  KernelSymbolSources src;
  src.system_map_places = std::vector<std::string>{dir.path() + "/System.map"};
  src.vmlinux_places = std::vector<std::string>{dir.path() + "/vmlinux"};
  auto r = KernelSymbolResolver::Create(src);
  ASSERT_TRUE(r.ok()) << r.status();
  const size_t text = (*r)->kallsyms().text_count();
  const size_t data = (*r)->kallsyms().data_count();
  auto a = (*r)->Resolve("jiffies");
  ASSERT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      a.status().message(),
      absl::StrFormat(
          "cannot find kernel symbol 'jiffies': this kernel was built without "
          "CONFIG_KALLSYMS_ALL, so /proc/kallsyms lists functions but not variables, and no "
          "System.map or vmlinux of this kernel (%s) was found.\n"
          "Sources tried:\n"
          "  /proc/kallsyms: no symbol 'jiffies'; it lists %d text symbols but no data "
          "symbols (only %d section boundaries): CONFIG_KALLSYMS_ALL is off\n"
          "  System.map %s/System.map: open(%s/System.map): No such file or directory\n"
          "  vmlinux %s/vmlinux: open(%s/vmlinux): No such file or directory\n"
          "Give the kernel's System.map with --system-map FILE, or its vmlinux with debug info "
          "with --vmlinux FILE (from the kernel build, or the distribution's debug package). "
          "kwatch never guesses an address.",
          Release(), text, data, dir.path(), dir.path(), dir.path(), dir.path()));
}

TEST(KernelResolverTest, SystemMapResolvesWithTheSlide) {
  const std::vector<RawSym> raw = RawKallsyms();
  TempDir dir;
  const std::string map = dir.Write("System.map", FixtureMap(raw));
  KernelSymbolSources src;
  src.system_map = map;
  src.system_map_places = std::vector<std::string>{};
  src.vmlinux_places = std::vector<std::string>{};
  auto r = KernelSymbolResolver::Create(src);
  ASSERT_TRUE(r.ok()) << r.status();
  auto a = (*r)->Resolve("jiffies");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->addr, FixtureJiffiesRunAddr(raw));
  EXPECT_EQ(a->link_addr, FixtureJiffiesRunAddr(raw) - kFixtureSlide);
  EXPECT_EQ(a->slide, static_cast<int64_t>(kFixtureSlide));
  EXPECT_EQ(a->source, "System.map " + map);
  EXPECT_EQ(a->type, 'D');

  auto missing = (*r)->Resolve("no_such_variable_anywhere");
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr(absl::StrFormat("System.map %s: matches the running kernel (slide "
                                        "+0x1e00000) but has no symbol "
                                        "'no_such_variable_anywhere'",
                                        map)));
}

TEST(KernelResolverTest, DefaultPlaceIsUsedAfterAMissingOne) {
  const std::vector<RawSym> raw = RawKallsyms();
  TempDir dir;
  const std::string map = dir.Write("System.map", FixtureMap(raw));
  KernelSymbolSources src;
  src.system_map_places = std::vector<std::string>{dir.path() + "/absent.map", map};
  src.vmlinux_places = std::vector<std::string>{};
  auto r = KernelSymbolResolver::Create(src);
  ASSERT_TRUE(r.ok());
  auto a = (*r)->Resolve("jiffies");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->addr, FixtureJiffiesRunAddr(raw));
}

TEST(KernelResolverTest, ExplicitMismatchedMapIsRefused) {
  const std::vector<RawSym> raw = RawKallsyms();
  TempDir dir;
  const std::string map = dir.Write("System.map", FixtureMap(raw, 0x1000));
  KernelSymbolSources src;
  src.system_map = map;
  src.system_map_places = std::vector<std::string>{};
  src.vmlinux_places = std::vector<std::string>{};
  auto r = KernelSymbolResolver::Create(src);
  ASSERT_TRUE(r.ok());
  auto a = (*r)->Resolve("jiffies");
  ASSERT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(a.status().message()),
              StartsWith(absl::StrFormat("refusing --system-map %s: %s does not match the "
                                         "running kernel: _text gives a KASLR slide of "
                                         "+0x1e00000",
                                         map, map)));
}

TEST(KernelResolverTest, MapNamedForAnotherReleaseIsRefused) {
  const std::vector<RawSym> raw = RawKallsyms();
  TempDir dir;
  const std::string map = dir.Write("System.map-0.0.1-other", FixtureMap(raw));
  KernelSymbolSources src;
  src.system_map = map;
  src.system_map_places = std::vector<std::string>{};
  src.vmlinux_places = std::vector<std::string>{};
  auto r = KernelSymbolResolver::Create(src);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->Resolve("jiffies").status().message(),
            absl::StrFormat("refusing --system-map %s: %s is named for release 0.0.1-other, but "
                            "the running kernel is %s. kwatch never guesses an address: give "
                            "the file of the running kernel (%s)",
                            map, map, Release(), Release()));
}

TEST(KernelResolverTest, VmlinuxThatIsNotAKernel) {
  TempDir dir;
  const std::string text = dir.Write("vmlinux", "not an ELF file\n");
  EXPECT_EQ(LoadVmlinuxSymbols(text, nullptr).status().message(), text + ": not an ELF file");
  // A real ELF file with symbols but no linux_banner: not a kernel image.
  const std::string elf = ::kwatch::testing::TargetPath("field_writer");
  KernelSymbolSources src;
  src.vmlinux = elf;
  src.system_map_places = std::vector<std::string>{};
  src.vmlinux_places = std::vector<std::string>{};
  auto r = KernelSymbolResolver::Create(src);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->Resolve("jiffies").status().message(),
            absl::StrFormat("refusing --vmlinux %s: %s has no linux_banner string to compare "
                            "with /proc/version. kwatch never guesses an address: give the "
                            "file of the running kernel (%s)",
                            elf, elf, Release()));
  auto syms = LoadVmlinuxSymbols(elf, nullptr);
  ASSERT_TRUE(syms.ok()) << syms.status();
  ASSERT_NE(syms->Find("main"), nullptr);
  EXPECT_EQ(syms->Find("main")->type, 'T');
}

}  // namespace
}  // namespace kwatch::core::kernel
