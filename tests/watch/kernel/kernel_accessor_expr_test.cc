// watch/kernel/kernel_expr.h on a kernel without data symbols and without System.map or
// vmlinux (this project's machines): a variable found through the code of its accessor, with
// that code given by the test (exact instructions) or read through BPF (the running kernel).
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "core/kernel/kernel_symbols.h"
#include "watch/kernel/kernel_expr.h"

namespace kwatch::watch::kernel {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

class AccessorExprTest : public ::testing::Test {
 protected:
  void SetUp() override {
    core::kernel::KernelSymbolSources src;  // /proc/kallsyms only
    src.system_map_places = std::vector<std::string>{};
    src.vmlinux_places = std::vector<std::string>{};
    auto r = core::kernel::KernelSymbolResolver::Create(src);
    ASSERT_TRUE(r.ok()) << r.status();
    symbols_ = *std::move(r);
    const core::kernel::KernelSymbol* fn = symbols_->kallsyms().Find("jiffies_read");
    ASSERT_NE(fn, nullptr);
    jiffies_read_ = fn->addr;
    ASSERT_FALSE(symbols_->kallsyms().HasDataSymbols())
        << "this kernel lists data symbols: these tests are for kernels that do not";
  }

  // Options whose kernel memory is `code` at jiffies_read.
  KernelExprOptions Code(std::vector<uint8_t> code, std::string via = "") {
    KernelExprOptions o;
    o.via = std::move(via);
    o.read_kernel = [this, code](uint64_t addr, std::span<uint8_t> out) {
      ++reads_;
      EXPECT_EQ(addr, jiffies_read_);
      std::memset(out.data(), 0xcc, out.size());
      std::memcpy(out.data(), code.data(), std::min(code.size(), out.size()));
      return absl::OkStatus();
    };
    return o;
  }

  std::unique_ptr<core::kernel::KernelSymbolResolver> symbols_;
  uint64_t jiffies_read_ = 0;
  int reads_ = 0;
};

TEST_F(AccessorExprTest, JiffiesIsTheOperandOfJiffiesReadsLoad) {
  // nop5; mov 0x1000(%rip),%rax; ret
  auto r = ResolveKernelExpr(
      "&jiffies",
      Code({0x0f, 0x1f, 0x44, 0x00, 0x00, 0x48, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00, 0xc3}),
      *symbols_, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(reads_, 1);
  EXPECT_EQ(r->watch.addr, jiffies_read_ + 12 + 0x1000);
  EXPECT_EQ(r->watch.len, 8U);
  EXPECT_EQ(r->watch.type_name, "unsigned long");
  EXPECT_EQ(r->watch.source,
            "the code of jiffies_read (+0x5: mov 0x1000(%rip), %rax), read through BPF");
  EXPECT_EQ(r->watch.slide, 0);
  EXPECT_FALSE(r->length_guessed);
  EXPECT_FALSE(r->read_only_section);
}

TEST_F(AccessorExprTest, ACodeThatIsNotTheExpectedLoadIsRefusedAfterTheListingsReasons) {
  // xor %eax,%eax; ret: no operand at all.
  auto r = ResolveKernelExpr("&jiffies", Code({0x31, 0xc0, 0xc3}), *symbols_, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("cannot find kernel symbol 'jiffies': "));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("\nIts accessor: jiffies_read has no RIP-relative memory operand before "
                        "its first return or jump: it does not read a global variable there"));
}

TEST_F(AccessorExprTest, WithoutBpfTheReasonIsSaid) {
  KernelExprOptions o;
  o.read_kernel = [](uint64_t, std::span<uint8_t>) {
    return absl::PermissionDeniedError(
        "bpf(BPF_PROG_LOAD, BPF_PROG_TYPE_SYSCALL): Operation not "
        "permitted");
  };
  auto r = ResolveKernelExpr("&jiffies", o, *symbols_, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("\nIts accessor: reading the code of jiffies_read: bpf(BPF_PROG_LOAD, "
                        "BPF_PROG_TYPE_SYSCALL): Operation not permitted"));
  // A variable with no accessor in the table: the listings' reasons alone.
  auto other = ResolveKernelExpr("&max_threads", o, *symbols_, nullptr);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(other.status().message()), Not(HasSubstr("accessor")));
}

TEST_F(AccessorExprTest, ViaNamesAnyFunctionAndAnOffset) {
  // mov 0x1000(%rip),%rax; mov %rax,0x2000(%rip); ret
  const std::vector<uint8_t> code = {0x48, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00, 0x48,
                                     0x89, 0x05, 0x00, 0x20, 0x00, 0x00, 0xc3};
  auto several = ResolveKernelExpr("&x", Code(code, "jiffies_read"), *symbols_, nullptr);
  ASSERT_FALSE(several.ok());
  EXPECT_THAT(std::string(several.status().message()),
              HasSubstr(absl::StrFormat("jiffies_read has 2 RIP-relative operands: +0x0: mov "
                                        "0x1000(%%rip), %%rax (0x%x); +0x7: mov %%rax, "
                                        "0x2000(%%rip) (0x%x). Say which reads x with --via "
                                        "jiffies_read+OFF",
                                        jiffies_read_ + 7 + 0x1000, jiffies_read_ + 14 + 0x2000)));
  auto second = ResolveKernelExpr("&x", Code(code, "jiffies_read+7"), *symbols_, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->watch.addr, jiffies_read_ + 14 + 0x2000);
  EXPECT_EQ(second->watch.display, "x");
  EXPECT_EQ(second->watch.type_name, "");  // a variable of the user's: no type known
  // No type: what the operand's 8 bytes allow at that address's alignment, said to the user.
  EXPECT_EQ(second->watch.len, LengthWithin(second->watch.addr, 8));
  EXPECT_TRUE(second->length_guessed);
  auto nowhere = ResolveKernelExpr("&x", Code(code, "no_such_function"), *symbols_, nullptr);
  ASSERT_FALSE(nowhere.ok());
  EXPECT_THAT(std::string(nowhere.status().message()),
              HasSubstr("no kernel function 'no_such_function' in /proc/kallsyms"));
}

// The running kernel's code, read through BPF: jiffies_read's load and the add of
// tick_do_update_jiffies64 (the writer of jiffies) name the same address.
TEST_F(AccessorExprTest, TheRunningKernelsReaderAndWriterOfJiffiesAgree) {
  auto r = ResolveKernelExpr("&jiffies", {}, *symbols_, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->watch.source, StartsWith("the code of jiffies_read (+0x"));
  KernelExprOptions o;
  o.via = "tick_do_update_jiffies64";
  auto listing = ResolveKernelExpr("&x", o, *symbols_, nullptr);
  ASSERT_FALSE(listing.ok());
  EXPECT_THAT(std::string(listing.status().message()),
              HasSubstr(absl::StrFormat("(0x%x)", r->watch.addr)));
}

}  // namespace
}  // namespace kwatch::watch::kernel
