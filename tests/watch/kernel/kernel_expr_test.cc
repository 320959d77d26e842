// watch/kernel/kernel_expr.h: kernel watch expressions against this machine's kernel, through
// a fixture System.map made from /proc/kallsyms (this kernel lacks CONFIG_KALLSYMS_ALL).
#include "watch/kernel/kernel_expr.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/kernel/btf_types.h"
#include "core/kernel/kernel_symbols.h"
#include "core/symbols/symbols.h"

// A word of this test program, watched by --kernel-accesses expressions below.
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables)
alignas(8) long g_kernel_expr_test_word = 0;

namespace kwatch::watch::kernel {
namespace {

// The fixture map is made as if the kernel had been linked this much lower than it runs.
constexpr uint64_t kSlide = 0x1e00000;

struct RawSym {
  uint64_t addr = 0;
  char type = 0;
  std::string name;
};

// The kernel image's lines of /proc/kallsyms (modules left out).
std::vector<RawSym> Kallsyms() {
  std::ifstream in("/proc/kallsyms");
  std::vector<RawSym> out;
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StrContains(line, '[')) {
      continue;
    }
    std::istringstream fields(line);
    RawSym s;
    std::string addr;
    fields >> addr >> s.type >> s.name;
    s.addr = std::stoull(addr, nullptr, 16);
    out.push_back(s);
  }
  return out;
}

uint64_t AddrOf(const std::vector<RawSym>& syms, const std::string& name) {
  for (const RawSym& s : syms) {
    if (s.name == name) {
      return s.addr;
    }
  }
  return 0;
}

KernelExprOptions Opts(std::optional<uint64_t> len, std::string type = "", bool exec = false) {
  KernelExprOptions o;
  o.len = len;
  o.type = std::move(type);
  o.exec = exec;
  return o;
}

class KernelExprTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("kwatch-kexpr-", getpid());
    std::filesystem::create_directories(dir_);
    const std::vector<RawSym> raw = Kallsyms();
    // jiffies and friends on the first word of the kernel's .data (init_stack: written once at
    // boot); pcpu_thing below the kernel's half, as per-CPU variables are.
    data_ = AddrOf(raw, "__start_init_stack");
    ASSERT_NE(data_, 0U) << "/proc/kallsyms has no __start_init_stack (or hides addresses)";
    std::string map;
    for (const RawSym& s : raw) {
      if (s.type == 'T' || s.type == 't' || s.type == 'W' || s.type == 'w') {
        map += absl::StrFormat("%016x %c %s\n", s.addr - kSlide, s.type, s.name);
      }
    }
    map += absl::StrFormat("%016x D jiffies\n", data_ - kSlide);
    map += absl::StrFormat("%016x D odd_word\n", data_ + 10 - kSlide);
    map += absl::StrFormat("%016x r ro_word\n", data_ + 16 - kSlide);
    map += absl::StrFormat("%016x D pcpu_thing\n", uint64_t{0x12340});
    map_ = (dir_ / "System.map").string();
    std::ofstream(map_) << map;
    core::kernel::KernelSymbolSources src;
    src.system_map = map_;
    src.system_map_places = std::vector<std::string>{};
    src.vmlinux_places = std::vector<std::string>{};
    auto r = core::kernel::KernelSymbolResolver::Create(src);
    ASSERT_TRUE(r.ok()) << r.status();
    symbols_ = *std::move(r);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  absl::StatusOr<ResolvedKernelExpr> Resolve(const std::string& text,
                                             const KernelExprOptions& opts = {},
                                             const core::kernel::KernelBtf* btf = nullptr) {
    return ResolveKernelExpr(text, opts, *symbols_, btf);
  }

  std::filesystem::path dir_;
  std::string map_;
  uint64_t data_ = 0;
  std::unique_ptr<core::kernel::KernelSymbolResolver> symbols_;
};

TEST(LengthWithinTest, LargestAlignedLengthInTheRoom) {
  EXPECT_EQ(LengthWithin(0x1000, std::nullopt), 8U);
  EXPECT_EQ(LengthWithin(0x1004, std::nullopt), 4U);
  EXPECT_EQ(LengthWithin(0x1002, std::nullopt), 2U);
  EXPECT_EQ(LengthWithin(0x1001, std::nullopt), 1U);
  EXPECT_EQ(LengthWithin(0x1000, 8), 8U);
  EXPECT_EQ(LengthWithin(0x1000, 7), 4U);
  EXPECT_EQ(LengthWithin(0x1000, 3), 2U);
  EXPECT_EQ(LengthWithin(0x1000, 0), 1U);
  EXPECT_EQ(LengthWithin(0x1004, 100), 4U);
}

TEST_F(KernelExprTest, RawAddress) {
  auto r = Resolve("0xffffffff81000010:4");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->watch.expr, "0xffffffff81000010:4");
  EXPECT_EQ(r->watch.addr, 0xffffffff81000010ULL);
  EXPECT_EQ(r->watch.len, 4U);
  EXPECT_EQ(r->watch.display, "0xffffffff81000010");
  EXPECT_EQ(r->watch.source, "raw address");
  EXPECT_EQ(r->watch.slide, 0);
  EXPECT_EQ(r->symbol, "");
  EXPECT_EQ(r->symbol_type, 0);
  EXPECT_FALSE(r->length_guessed);
  EXPECT_FALSE(r->read_only_section);
  // No length in the expression: 8 bytes, or --len.
  EXPECT_EQ(Resolve("0xffffffff81000010")->watch.len, 8U);
  EXPECT_EQ(Resolve("0xffffffff81000010:4", Opts(2))->watch.len, 2U);
}

TEST_F(KernelExprTest, UntypedSymbolGetsTheLengthThatFits) {
  auto r = Resolve("&jiffies");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->watch.addr, data_);
  EXPECT_EQ(r->watch.display, "jiffies");
  EXPECT_EQ(r->watch.len, 8U);
  EXPECT_EQ(r->watch.type_name, "");
  EXPECT_EQ(r->watch.source, "System.map " + map_);
  EXPECT_EQ(r->watch.slide, static_cast<int64_t>(kSlide));
  EXPECT_EQ(r->symbol, "jiffies");
  EXPECT_EQ(r->symbol_type, 'D');
  EXPECT_TRUE(r->length_guessed);
  EXPECT_FALSE(r->read_only_section);
  // Two bytes into an 8-byte word, with 6 to the next symbol: 2 bytes.
  auto odd = Resolve("odd_word");
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ(odd->watch.addr, data_ + 10);
  EXPECT_EQ(odd->watch.len, 2U);
  EXPECT_TRUE(odd->length_guessed);
  // A read-only section is said; the length was not asked for there either.
  auto ro = Resolve("ro_word");
  ASSERT_TRUE(ro.ok()) << ro.status();
  EXPECT_TRUE(ro->read_only_section);
  EXPECT_EQ(ro->symbol_type, 'r');
}

TEST_F(KernelExprTest, GivenLengthsWin) {
  auto exec = Resolve("jiffies", Opts(4, "", true));
  ASSERT_TRUE(exec.ok()) << exec.status();
  EXPECT_EQ(exec->watch.len, 1U);
  EXPECT_FALSE(exec->length_guessed);
  auto len = Resolve("jiffies", Opts(2));
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(len->watch.len, 2U);
  EXPECT_FALSE(len->length_guessed);
}

TEST_F(KernelExprTest, CodeIsWatchedAtItsFirstBytesSilently) {
  const uint64_t schedule = AddrOf(Kallsyms(), "schedule");
  ASSERT_NE(schedule, 0U);
  auto r = Resolve("schedule");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->watch.addr, schedule);
  EXPECT_EQ(r->watch.source, "/proc/kallsyms");
  EXPECT_EQ(r->watch.slide, 0);
  EXPECT_FALSE(r->length_guessed);
  EXPECT_TRUE(r->read_only_section);
  EXPECT_EQ(r->symbol_type, 'T');
}

TEST_F(KernelExprTest, Errors) {
  EXPECT_EQ(Resolve("jiffies.count").status(),
            absl::FailedPreconditionError(
                "no type for kernel symbol 'jiffies': the kernel's BTF describes only per-CPU "
                "variables, and System.map and kallsyms carry no types; name its type with "
                "--type, e.g. `kwatch --rw 'jiffies.count' --type 'struct task_struct'`"));
  EXPECT_EQ(Resolve("jiffies", Opts(std::nullopt, "struct task_struct")).status(),
            absl::FailedPreconditionError("--type needs the kernel's BTF "
                                          "(/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)"));
  EXPECT_EQ(Resolve("pcpu_thing").status(),
            absl::InvalidArgumentError(absl::StrFormat(
                "kernel symbol 'pcpu_thing' is at 0x%x in System.map %s, outside the kernel's "
                "address space: it is a per-CPU variable (an offset into each CPU's area), which "
                "kwatch cannot watch yet",
                0x12340 + kSlide, map_)));
  EXPECT_EQ(Resolve("no_such_kernel_symbol_here").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Resolve("((struct task_struct *)0xffffffff81000000)->prio").status(),
            absl::InvalidArgumentError(
                "a cast names the type of a process's object (its DWARF): watch a kernel address "
                "as 0xffffffff81000000:LEN"));
}

TEST_F(KernelExprTest, TypeFromBtf) {
  auto btf = core::kernel::KernelBtf::Load();
  ASSERT_TRUE(btf.ok()) << "this machine has /sys/kernel/btf/vmlinux: " << btf.status();
  auto task = (*btf)->FindType("struct task_struct");
  ASSERT_TRUE(task.ok()) << task.status();
  auto prio = (*btf)->Walk(*task, core::symbols::ParseExpr("t.prio")->steps);
  ASSERT_TRUE(prio.ok()) << prio.status();
  auto r = Resolve("jiffies.prio", Opts(std::nullopt, "struct task_struct"), btf->get());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->watch.addr, data_ + prio->offset);
  EXPECT_EQ(r->watch.display, "jiffies.prio");
  EXPECT_EQ(r->watch.type_name, "int");
  EXPECT_EQ(r->watch.len, 4U);
  EXPECT_FALSE(r->length_guessed);
  // A whole structure does not fit a debug register.
  EXPECT_EQ(Resolve("jiffies", Opts(std::nullopt, "struct list_head"), btf->get()).status(),
            absl::InvalidArgumentError(
                "jiffies is a struct list_head of 16 bytes: one debug register watches 1, 2, 4 "
                "or 8 aligned bytes; watch a member, or give --len"));
}

TEST(ResolveProcessExprTest, SymbolsOfTheProcess) {
  auto syms = core::symbols::Symbols::ForProcess(getpid());
  ASSERT_TRUE(syms.ok()) << syms.status();
  const core::symbols::MemoryReader read = [](core::RemoteAddr addr, std::span<uint8_t> out) {
    // NOLINTNEXTLINE(performance-no-int-to-ptr): this process's own memory
    std::copy_n(reinterpret_cast<const uint8_t*>(addr.value), out.size(), out.begin());
    return absl::OkStatus();
  };
  auto w = ResolveProcessExpr("g_kernel_expr_test_word", std::nullopt, **syms, read);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->expr, "g_kernel_expr_test_word");
  EXPECT_EQ(w->addr, reinterpret_cast<uintptr_t>(&g_kernel_expr_test_word));
  EXPECT_EQ(w->len, 8U);
  EXPECT_EQ(w->display, "g_kernel_expr_test_word");
  EXPECT_EQ(w->type_name, "long");
  EXPECT_EQ(w->source, "the target's symbols");
  EXPECT_EQ(ResolveProcessExpr("g_kernel_expr_test_word", 2, **syms, read)->len, 2U);
  auto raw = ResolveProcessExpr("0x1000:4", std::nullopt, **syms, read);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->addr, 0x1000U);
  EXPECT_EQ(raw->len, 4U);
  EXPECT_EQ(raw->display, "0x1000");
  EXPECT_EQ(raw->source, "the target's symbols");
  EXPECT_FALSE(ResolveProcessExpr("no_such_symbol_in_this_test", std::nullopt, **syms, read).ok());
  // A cast is the typed object at the address (this test's own long).
  auto cast = ResolveProcessExpr(
      absl::StrFormat("(long *)0x%x", reinterpret_cast<uintptr_t>(&g_kernel_expr_test_word)),
      std::nullopt, **syms, read);
  ASSERT_TRUE(cast.ok()) << cast.status();
  EXPECT_EQ(cast->addr, reinterpret_cast<uintptr_t>(&g_kernel_expr_test_word));
  EXPECT_EQ(cast->len, 8U);
  EXPECT_EQ(cast->type_name, "long");
}

}  // namespace
}  // namespace kwatch::watch::kernel
