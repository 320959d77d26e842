#include "core/symbols/symbolizer.h"

#include <Zydis/Zydis.h>

#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::core::symbols {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

int MarkerLine() {
  std::ifstream in(std::string(KWATCH_SOURCE_DIR) + "/tests/targets/layouts.c");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find("/* LINE_MARKER */") != std::string::npos) {
      return n;
    }
  }
  return -1;
}

// Where the first instruction of `fn` that touches memory (not `lea`) starts and ends.
struct Insn {
  RemoteAddr start;
  RemoteAddr end;
};

Insn FirstMemoryAccess(const Symbols& symbols, const FunctionSymbol& fn) {
  std::vector<uint8_t> code(fn.size);
  EXPECT_TRUE(symbols.ReadCode(fn.start, std::span<uint8_t>(code)).ok());
  ZydisDecoder decoder;
  ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
  ZydisDecodedInstruction insn;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  for (size_t off = 0; off < code.size(); off += insn.length) {
    if (!ZYAN_SUCCESS(
            ZydisDecoderDecodeFull(&decoder, code.data() + off, code.size() - off, &insn, ops))) {
      break;
    }
    for (uint8_t i = 0; i < insn.operand_count_visible; ++i) {
      if (ops[i].type == ZYDIS_OPERAND_TYPE_MEMORY && ops[i].mem.type == ZYDIS_MEMOP_TYPE_MEM) {
        return Insn{fn.start + off, fn.start + off + insn.length};
      }
    }
  }
  ADD_FAILURE() << "no memory access in " << fn.name;
  return Insn{};
}

class SymbolizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Symbols::ForFile(kwatch::testing::TargetPath("layouts"));
    ASSERT_TRUE(s.ok()) << s.status();
    symbols_ = *std::move(s);
    symbolizer_ = std::make_unique<Symbolizer>(*symbols_);
  }

  FunctionSymbol Function(const char* name) {
    auto f = symbols_->FindFunction(name);
    EXPECT_TRUE(f.has_value()) << name;
    return f.value_or(FunctionSymbol{});
  }

  std::unique_ptr<Symbols> symbols_;
  std::unique_ptr<Symbolizer> symbolizer_;
};

TEST_F(SymbolizerTest, SiteForTrapFindsTheStore) {
  const FunctionSymbol fn = Function("StoreHits");
  const Insn store = FirstMemoryAccess(*symbols_, fn);
  // A data watchpoint traps after the access: trap_ip is the next instruction.
  const AccessSite& site = symbolizer_->SiteForTrap(store.end);
  EXPECT_TRUE(site.exact);
  EXPECT_EQ(site.ip, store.start);
  EXPECT_TRUE(site.writes);
  EXPECT_FALSE(site.reads);
  EXPECT_THAT(site.disassembly, StartsWith("mov"));
  EXPECT_THAT(site.disassembly, HasSubstr("(%rip)"));
  // Cached: the same object comes back.
  EXPECT_EQ(&symbolizer_->SiteForTrap(store.end), &site);

  // The access instruction's line is the marked store.
  const CodeLocation& loc = symbolizer_->Locate(site.ip);
  EXPECT_EQ(loc.function, "StoreHits");
  EXPECT_EQ(loc.offset, site.ip - fn.start);
  EXPECT_EQ(loc.line, MarkerLine());
  EXPECT_EQ(loc.ip, site.ip);
  EXPECT_EQ(&symbolizer_->Locate(site.ip), &loc);
  const std::string text = Symbolizer::Format(loc);
  EXPECT_THAT(text, StartsWith("StoreHits"));
  EXPECT_THAT(text, HasSubstr("(layouts.c:" + std::to_string(MarkerLine()) + ")"));
}

TEST_F(SymbolizerTest, SiteForTrapReadAndReadModifyWrite) {
  const Insn load = FirstMemoryAccess(*symbols_, Function("LoadMisses"));
  const AccessSite& read = symbolizer_->SiteForTrap(load.end);
  EXPECT_TRUE(read.exact);
  EXPECT_EQ(read.ip, load.start);
  EXPECT_TRUE(read.reads);
  EXPECT_FALSE(read.writes);

  const Insn add = FirstMemoryAccess(*symbols_, Function("IncCounter"));
  const AccessSite& rmw = symbolizer_->SiteForTrap(add.end);
  EXPECT_TRUE(rmw.exact);
  EXPECT_EQ(rmw.ip, add.start);
  EXPECT_TRUE(rmw.reads);
  EXPECT_TRUE(rmw.writes);
  EXPECT_THAT(rmw.disassembly, StartsWith("add"));
  EXPECT_THAT(rmw.disassembly, HasSubstr("$0x1, 0x"));
  EXPECT_THAT(rmw.disassembly, HasSubstr("(%rip)"));
}

TEST_F(SymbolizerTest, TrapInsideAnInstructionIsNotExact) {
  const Insn store = FirstMemoryAccess(*symbols_, Function("StoreHits"));
  ASSERT_GT(store.end - store.start, 2u);
  const RemoteAddr mid = store.start + 2;
  const AccessSite& site = symbolizer_->SiteForTrap(mid);
  EXPECT_FALSE(site.exact);
  EXPECT_EQ(site.ip, mid);
  // No function at all.
  const AccessSite& nowhere = symbolizer_->SiteForTrap(RemoteAddr{0x10});
  EXPECT_FALSE(nowhere.exact);
  EXPECT_EQ(nowhere.ip.value, 0x10u);
}

TEST_F(SymbolizerTest, LocateUnknownAddress) {
  const CodeLocation& loc = symbolizer_->Locate(RemoteAddr{0x10});
  EXPECT_TRUE(loc.function.empty());
  EXPECT_TRUE(loc.file.empty());
  EXPECT_EQ(Symbolizer::Format(loc), "0x10");
}

TEST(SymbolizerFormatTest, Forms) {
  CodeLocation loc;
  loc.ip = RemoteAddr{0x401234};
  EXPECT_EQ(Symbolizer::Format(loc), "0x401234");
  loc.function = "handle_request";
  loc.offset = 0x1a;
  EXPECT_EQ(Symbolizer::Format(loc), "handle_request+0x1a");
  loc.file = "/src/server/handler.c";
  loc.line = 42;
  EXPECT_EQ(Symbolizer::Format(loc), "handle_request+0x1a (handler.c:42)");
  loc.offset = 0;
  EXPECT_EQ(Symbolizer::Format(loc), "handle_request (handler.c:42)");
  loc.inlined_function = "parse_len";
  EXPECT_EQ(Symbolizer::Format(loc), "parse_len inlined in handle_request (handler.c:42)");
  loc.function.clear();
  loc.inlined_function.clear();
  EXPECT_EQ(Symbolizer::Format(loc), "0x401234 (handler.c:42)");
}

}  // namespace
}  // namespace kwatch::core::symbols
