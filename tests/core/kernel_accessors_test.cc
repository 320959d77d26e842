// core/kernel/accessors.h: a kernel variable's address from the code of a function that reads
// it (decoded with Zydis), and core/kernel/bpf_kernel_reader.h reading that code.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/kernel/accessors.h"
#include "core/kernel/bpf_kernel_reader.h"

namespace kwatch::core::kernel {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kStart = 0xffffffff81426660;

// jiffies_read as this project's kernels have it: nop5 (ftrace), mov disp(%rip),%rax, then
// the jump to the return thunk.
const std::vector<uint8_t> kJiffiesRead = {0x0f, 0x1f, 0x44, 0x00, 0x00, 0x48, 0x8b,
                                           0x05, 0x14, 0x33, 0xbe, 0x01, 0xe9, 0x6f,
                                           0xc2, 0xdd, 0x00, 0xcc, 0xcc, 0xcc};

TEST(KernelAccessors, TheLoadOfJiffiesReadNamesJiffies) {
  auto ops = RipOperands(kStart, kJiffiesRead);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 1U);
  const RipOperand& op = (*ops)[0];
  EXPECT_EQ(op.offset, 5U);
  EXPECT_EQ(op.target, kStart + 12 + 0x1be3314);
  EXPECT_EQ(op.size, 8U);
  EXPECT_TRUE(op.load);
  EXPECT_EQ(op.text, "mov 0x1be3314(%rip), %rax");
  const KnownAccessor* known = FindKnownAccessor("jiffies");
  ASSERT_NE(known, nullptr);
  EXPECT_EQ(known->function, "jiffies_read");
  EXPECT_EQ(FindKnownAccessor("jiffies_64")->function, "jiffies_read");
  EXPECT_EQ(FindKnownAccessor("nr_threads"), nullptr);
  auto picked = PickOperand("jiffies", "jiffies_read", *ops, std::nullopt, known);
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(picked->target, op.target);
}

TEST(KernelAccessors, AStoreWhereTheTableExpectsALoadIsRefusedWithWhatWasFound) {
  // mov %rax, disp(%rip): the same operand, written.
  std::vector<uint8_t> code = {0x48, 0x89, 0x05, 0x10, 0x00, 0x00, 0x00, 0xc3};
  auto ops = RipOperands(kStart, code);
  ASSERT_TRUE(ops.ok());
  ASSERT_EQ(ops->size(), 1U);
  EXPECT_FALSE((*ops)[0].load);
  auto picked =
      PickOperand("jiffies", "jiffies_read", *ops, std::nullopt, FindKnownAccessor("jiffies"));
  ASSERT_FALSE(picked.ok());
  EXPECT_EQ(picked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(picked.status().message()),
              HasSubstr("jiffies_read does not read jiffies as kwatch expects (a 8-byte mov into "
                        "a register as its first RIP-relative operand); found: +0x0: mov %rax, "
                        "0x10(%rip) (0xffffffff81426677)"));
}

TEST(KernelAccessors, SeveralOperandsNeedAnOffsetAndTheOffsetPicks) {
  // mov disp(%rip),%rax; add %rax, disp2(%rip); ret
  std::vector<uint8_t> code = {0x48, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00, 0x48,
                               0x01, 0x05, 0x00, 0x20, 0x00, 0x00, 0xc3};
  auto ops = RipOperands(kStart, code);
  ASSERT_TRUE(ops.ok());
  ASSERT_EQ(ops->size(), 2U);
  auto none = PickOperand("v", "f", *ops, std::nullopt, nullptr);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(),
            "f has 2 RIP-relative operands: +0x0: mov 0x1000(%rip), %rax (0xffffffff81427667); "
            "+0x7: add %rax, 0x2000(%rip) (0xffffffff8142866e). Say which reads v with --via "
            "f+OFF");
  auto second = PickOperand("v", "f", *ops, 7, nullptr);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->target, kStart + 14 + 0x2000);
  auto wrong = PickOperand("v", "f", *ops, 3, nullptr);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("no instruction of f at +0x3 has a RIP-relative operand"));
  // Nothing after the first return counts.
  code.insert(code.begin() + 7, 0xc3);
  EXPECT_EQ(RipOperands(kStart, code)->size(), 1U);
}

TEST(KernelAccessors, ViaTakesAFunctionAndAnOffset) {
  EXPECT_EQ(ParseVia("jiffies_read")->function, "jiffies_read");
  EXPECT_FALSE(ParseVia("jiffies_read")->offset.has_value());
  EXPECT_EQ(ParseVia("f+0x68")->offset, 0x68U);
  EXPECT_EQ(ParseVia("f+104")->offset, 104U);
  EXPECT_FALSE(ParseVia("+4").ok());
  EXPECT_EQ(ParseVia("f+x").status().message(),
            "--via 'f+x': OFF must be a number (decimal or 0x hex)");
}

TEST(KernelAccessors, RepStringInstructionsAreToldFromOthers) {
  const std::vector<uint8_t> rep_movsb = {0xf3, 0xa4};
  const std::vector<uint8_t> rep_stosq = {0xf3, 0x48, 0xab};
  const std::vector<uint8_t> movsb = {0xa4};
  const std::vector<uint8_t> store = {0x48, 0x89, 0x45, 0x78};  // mov %rax, 0x78(%rbp)
  EXPECT_EQ(IsRepString(rep_movsb), true);
  EXPECT_EQ(IsRepString(rep_stosq), true);
  EXPECT_EQ(IsRepString(movsb), false);
  EXPECT_EQ(IsRepString(store), false);
  EXPECT_EQ(IsRepString(std::vector<uint8_t>{0x48}), std::nullopt);  // cut short
}

// The running kernel's jiffies_read, read through BPF as kwatch does without /proc/kcore.
TEST(BpfKernelReader, ReadsTheCodeOfJiffiesReadAndRefusesAnUnmappedAddress) {
  std::ifstream kallsyms("/proc/kallsyms");
  std::string line;
  uint64_t fn = 0;
  while (std::getline(kallsyms, line)) {
    std::istringstream f(line);
    std::string addr;
    char type = 0;
    std::string name;
    f >> addr >> type >> name;
    if (name == "jiffies_read") {
      fn = std::stoull(addr, nullptr, 16);
      break;
    }
  }
  ASSERT_NE(fn, 0U) << "/proc/kallsyms has no jiffies_read";
  auto reader = BpfKernelReader::Open();
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint8_t> code(300);  // more than one run of the program
  ASSERT_TRUE((*reader)->Read(fn, code).ok());
  auto ops = RipOperands(fn, code);
  ASSERT_TRUE(ops.ok()) << ops.status();
  auto jiffies =
      PickOperand("jiffies", "jiffies_read", *ops, std::nullopt, FindKnownAccessor("jiffies"));
  ASSERT_TRUE(jiffies.ok()) << jiffies.status();
  // jiffies itself, read twice: a counter of ticks since boot, never going back.
  uint64_t a = 0;
  uint64_t b = 0;
  ASSERT_TRUE((*reader)->Read(jiffies->target, {reinterpret_cast<uint8_t*>(&a), 8}).ok());
  usleep(50'000);
  ASSERT_TRUE((*reader)->Read(jiffies->target, {reinterpret_cast<uint8_t*>(&b), 8}).ok());
  EXPECT_GT(b, a);  // 50 ms: several ticks at any HZ
  std::vector<uint8_t> nothing(8);
  auto unmapped = (*reader)->Read(0x10, nothing);
  EXPECT_EQ(unmapped.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unmapped.message()),
              HasSubstr("kernel memory at 0x10: bpf_probe_read_kernel returned"));
}

}  // namespace
}  // namespace kwatch::core::kernel
