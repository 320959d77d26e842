// Kernel file:line from a vmlinux with DWARF (KernelSymbolResolver::LoadLines/LineAt).
//
// No vmlinux of the running kernel exists on these machines, so the test builds a small
// kernel-like image (tests/core/fixtures/fake_vmlinux.c, linked at 0xffffffff81000000 with
// -mcmodel=kernel, with _text, linux_banner and 20 functions) and a "running kernel" for it:
// a kallsyms listing of the image's text symbols moved by a KASLR slide, and a /proc/version
// holding its banner. The resolver must find the slide, and map run-time addresses back to
// the image's line table.

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/kernel/kernel_symbols.h"
#include "tests/test_util.h"

namespace kwatch::core::kernel {
namespace {

constexpr uint64_t kSlide = 0x2c00000;
constexpr char kRelease[] = "0.0.0-kwatch-fixture";

std::string FixtureSource() {
  return std::string(KWATCH_SOURCE_DIR) + "/tests/core/fixtures/fake_vmlinux.c";
}

// The 1-based line of the source holding `marker`, or 0.
int LineOf(const std::string& marker) {
  std::ifstream in(FixtureSource());
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (absl::StrContains(line, marker)) {
      return n;
    }
  }
  return 0;
}

class KernelLinesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kwatch-vmlinux-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    vmlinux_ = dir_ + "/vmlinux";
    auto cc = ::kwatch::testing::Run(
        {"/usr/bin/cc", "-g", "-O0", "-fno-toplevel-reorder", "-mcmodel=kernel", "-fno-pic",
         "-no-pie", "-nostdlib", "-static", "-ffreestanding", "-fno-asynchronous-unwind-tables",
         "-Wl,-Ttext-segment=0xffffffff81000000", "-Wl,-e,_text", "-Wl,--build-id=none", "-o",
         vmlinux_, FixtureSource()});
    ASSERT_TRUE(cc.ok()) << cc.status();
    ASSERT_EQ(cc->exit_code, 0) << "building the fixture image failed (needs gcc):\n" << cc->err;
    std::string banner;
    auto syms = LoadVmlinuxSymbols(vmlinux_, &banner);
    ASSERT_TRUE(syms.ok()) << syms.status();
    ASSERT_TRUE(absl::StartsWith(banner, "Linux version 0.0.0-kwatch-fixture")) << banner;
    std::string listing;
    for (const KernelSymbol& s : syms->symbols()) {
      if (s.IsText()) {
        absl::StrAppendFormat(&listing, "%016x %c %s\n", s.addr + kSlide, s.type, s.name);
        link_[s.name] = s.addr;
      }
    }
    ASSERT_GE(link_.size(), 21u);
    kallsyms_ = Write("kallsyms", listing);
    version_ = Write("version", banner);
  }
  void TearDown() override { (void)!std::system(("rm -rf " + dir_).c_str()); }

  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

  KernelSymbolSources Sources(const std::string& vmlinux) const {
    KernelSymbolSources src;
    src.kallsyms = kallsyms_;
    src.vmlinux = vmlinux;
    src.release = kRelease;
    src.proc_version = version_;
    src.system_map_places = std::vector<std::string>{};
    src.vmlinux_places = std::vector<std::string>{};
    return src;
  }

  std::string dir_;
  std::string vmlinux_;
  std::string kallsyms_;
  std::string version_;
  std::map<std::string, uint64_t> link_;
};

TEST_F(KernelLinesTest, RunTimeAddressesMapToTheImagesLines) {
  auto r = KernelSymbolResolver::Create(Sources(vmlinux_));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*r)->LoadLines().ok()) << (*r)->LoadLines();
  EXPECT_EQ((*r)->lines_file(), vmlinux_);
  for (int i : {0, 7, 19}) {
    const std::string fn = absl::StrFormat("fixture_fn%02d", i);
    const uint64_t run = link_.at(fn) + kSlide;
    // The function's first instruction is on its declaration's line; 4 bytes on (after
    // push %rbp; mov %rsp,%rbp at -O0) the body's statement begins.
    const int body = LineOf(absl::StrCat("// line of ", fn));
    ASSERT_GT(body, 1) << fn;
    std::optional<symbols::SourceLine> at_entry = (*r)->LineAt(run);
    ASSERT_TRUE(at_entry.has_value()) << fn;
    EXPECT_TRUE(absl::EndsWith(at_entry->file, "fake_vmlinux.c")) << at_entry->file;
    EXPECT_EQ(at_entry->line, body - 1) << fn;
    std::optional<symbols::SourceLine> in_body = (*r)->LineAt(run + 4);
    ASSERT_TRUE(in_body.has_value()) << fn;
    EXPECT_EQ(in_body->line, body) << fn;
    // function+offset still comes from kallsyms, at the run-time address.
    auto text = (*r)->TextAt(run + 4);
    ASSERT_TRUE(text.has_value());
    EXPECT_EQ(text->ToString(), fn + "+0x4");
  }
  // Describe: function+offset from kallsyms, the line from the vmlinux (the fixture was
  // compiled outside a kernel tree: the path stays whole).
  const uint64_t fn7 = link_.at("fixture_fn07") + kSlide;
  const std::string desc = (*r)->Describe(fn7 + 4);
  EXPECT_TRUE(absl::StartsWith(desc, "fixture_fn07+0x4 (")) << desc;
  EXPECT_TRUE(
      absl::EndsWith(desc, absl::StrCat("fake_vmlinux.c:", LineOf("// line of fixture_fn07"), ")")))
      << desc;
  EXPECT_EQ((*r)->Describe(0xffffffff00001000), "0xffffffff00001000");
  // An address of the image's link-time layout, unslid, is not kernel text of this kernel
  // and has no line.
  EXPECT_FALSE((*r)->LineAt(link_.at("fixture_fn07") - kSlide).has_value());
}

TEST_F(KernelLinesTest, ImageWithoutDebugInfoIsNamedWithTheReason) {
  const std::string stripped = dir_ + "/vmlinux.stripped";
  auto strip = ::kwatch::testing::Run({"/usr/bin/objcopy", "--strip-debug", vmlinux_, stripped});
  ASSERT_TRUE(strip.ok()) << strip.status();
  ASSERT_EQ(strip->exit_code, 0) << strip->err;
  auto r = KernelSymbolResolver::Create(Sources(stripped));
  ASSERT_TRUE(r.ok()) << r.status();
  const absl::Status s = (*r)->LoadLines();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            absl::StrFormat("no vmlinux with debug info matches the running kernel (%s), so "
                            "kernel code is shown as function+offset without file:line.\n"
                            "vmlinux files tried:\n"
                            "  %s: %s has no DWARF line tables (.debug_info .debug_line "
                            "missing): a kernel built without CONFIG_DEBUG_INFO, or stripped\n"
                            "Give one with --vmlinux FILE (from the kernel build, or the "
                            "distribution's debug package, e.g. linux-image-%s-dbg).",
                            kRelease, stripped, stripped, kRelease));
  EXPECT_FALSE((*r)->LineAt(link_.at("fixture_fn07") + kSlide).has_value());
  EXPECT_EQ((*r)->lines_file(), "");
  // Its symbols still resolve function+offset (kallsyms), without a line.
  EXPECT_EQ((*r)->Describe(link_.at("fixture_fn07") + kSlide + 2), "fixture_fn07+0x2");
  EXPECT_EQ((*r)->TextAt(link_.at("fixture_fn07") + kSlide + 2)->ToString(), "fixture_fn07+0x2");
}

TEST_F(KernelLinesTest, ImageOfAnotherBuildIsNotUsedForLines) {
  const std::string other = Write("version-other", "Linux version 0.0.0-other (x) #2 SMP\n");
  KernelSymbolSources src = Sources(vmlinux_);
  src.proc_version = other;
  auto r = KernelSymbolResolver::Create(src);
  ASSERT_TRUE(r.ok()) << r.status();
  const absl::Status s = (*r)->LoadLines();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(
      s.message(), absl::StrFormat("%s: %s is another kernel build: its linux_banner is "
                                   "'Linux version 0.0.0-kwatch-fixture (test) #1 SMP', %s "
                                   "says 'Linux version 0.0.0-other (x) #2 SMP'",
                                   vmlinux_, vmlinux_, other)))
      << s.message();
  EXPECT_FALSE((*r)->LineAt(link_.at("fixture_fn07") + kSlide).has_value());
}

}  // namespace
}  // namespace kwatch::core::kernel
