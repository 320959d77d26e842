#include "core/probe/probe_target.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::core::probe {
namespace {

using ::testing::ElementsAre;

std::string FixturePath() {
  return kwatch::testing::TargetPath("probe_args");
}

std::string SourcePath() {
  return std::string(KWATCH_SOURCE_DIR) + "/tests/targets/probe_args.c";
}

std::vector<std::string> SourceLines() {
  std::ifstream in(SourcePath());
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
  }
  return lines;
}

int FixtureLine(const std::string& marker) {
  const std::vector<std::string> lines = SourceLines();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find(marker) != std::string::npos) {
      return static_cast<int>(i + 1);
    }
  }
  ADD_FAILURE() << "no line with " << marker;
  return 0;
}

struct ElfSym {
  uint64_t value = 0;
  uint64_t size = 0;
};

// The fixture's .symtab, PT_LOAD headers and contents, read with libelf alone (as nm would).
struct ElfFacts {
  std::map<std::string, ElfSym> symbols;
  std::vector<GElf_Phdr> loads;
  std::string bytes;  // the whole file

  uint64_t FileOffset(uint64_t vaddr) const {
    for (const GElf_Phdr& p : loads) {
      if (vaddr >= p.p_vaddr && vaddr < p.p_vaddr + p.p_filesz) {
        return vaddr - p.p_vaddr + p.p_offset;
      }
    }
    ADD_FAILURE() << "no segment for " << vaddr;
    return 0;
  }
};

ElfFacts ReadElf(const std::string& path) {
  ElfFacts facts;
  std::ifstream in(path, std::ios::binary);
  facts.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  elf_version(EV_CURRENT);
  const int fd = open(path.c_str(), O_RDONLY);
  Elf* elf = elf_begin(fd, ELF_C_READ, nullptr);
  size_t phnum = 0;
  elf_getphdrnum(elf, &phnum);
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD) {
      facts.loads.push_back(ph);
    }
  }
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr || shdr.sh_type != SHT_SYMTAB) {
      continue;
    }
    Elf_Data* data = elf_getdata(scn, nullptr);
    for (size_t i = 0; i < shdr.sh_size / shdr.sh_entsize; ++i) {
      GElf_Sym sym;
      gelf_getsym(data, static_cast<int>(i), &sym);
      const char* name = elf_strptr(elf, shdr.sh_link, sym.st_name);
      if (name != nullptr && *name != '\0' && sym.st_shndx != SHN_UNDEF) {
        facts.symbols[name] = ElfSym{sym.st_value, sym.st_size};
      }
    }
  }
  elf_end(elf);
  close(fd);
  return facts;
}

class ProbeTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = ProbeTarget::Open(FixturePath());
    ASSERT_TRUE(t.ok()) << t.status();
    target_ = *std::move(t);
    elf_ = ReadElf(FixturePath());
  }

  std::vector<ResolvedPoint> Resolve(const std::string& text) {
    auto p = ParseProbePoint(text);
    EXPECT_TRUE(p.ok()) << p.status();
    auto r = target_->Resolve(*p);
    EXPECT_TRUE(r.ok()) << text << ": " << r.status();
    return r.ok() ? *r : std::vector<ResolvedPoint>{};
  }

  absl::Status Error(const std::string& text) {
    auto p = ParseProbePoint(text);
    EXPECT_TRUE(p.ok()) << p.status();
    auto r = target_->Resolve(*p);
    EXPECT_FALSE(r.ok()) << text;
    return r.status();
  }

  uint64_t Start(const std::string& fn) { return elf_.symbols.at(fn).value; }

  std::unique_ptr<ProbeTarget> target_;
  ElfFacts elf_;
};

TEST_F(ProbeTargetTest, FunctionEntriesMatchTheSymbolTable) {
  for (const char* fn : {"add_ints", "sum_item", "name_len", "scale", "fact", "many_args",
                         "local_item", "tick", "loop_lines", "main"}) {
    SCOPED_TRACE(fn);
    const std::vector<ResolvedPoint> r = Resolve(fn);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].event, fn);
    EXPECT_EQ(r[0].function, fn);
    EXPECT_EQ(r[0].vaddr.value, Start(fn));
    EXPECT_EQ(r[0].function_start.value, Start(fn));
    EXPECT_EQ(r[0].offset, 0u);
    EXPECT_FALSE(r[0].is_return);
    EXPECT_EQ(r[0].file, SourcePath());
    EXPECT_EQ(r[0].file_offset, elf_.FileOffset(Start(fn)));
    EXPECT_EQ(target_->FileOffset(r[0].vaddr), elf_.FileOffset(Start(fn)));
    EXPECT_GT(r[0].insn_len, 0);
    EXPECT_FALSE(r[0].insn_text.empty());
  }
  const ResolvedPoint add = Resolve("add_ints")[0];
  EXPECT_EQ(add.insn_text, "lea (%rdi,%rsi,1), %eax");
  EXPECT_EQ(add.insn_len, 3);
  EXPECT_EQ(add.line, FixtureLine("return a + b;"));  // the last row at the entry
  // lea (%rdi,%rsi,1),%eax is 8d 04 37 in the file at file_offset.
  EXPECT_EQ(elf_.bytes.substr(add.file_offset, 3), std::string("\x8d\x04\x37", 3));
}

TEST_F(ProbeTargetTest, OffsetsMustBeInstructionBoundariesInsideTheFunction) {
  const ResolvedPoint ret = Resolve("add_ints+3")[0];
  EXPECT_EQ(ret.vaddr.value, Start("add_ints") + 3);
  EXPECT_EQ(ret.offset, 3u);
  EXPECT_EQ(ret.insn_text, "ret");
  EXPECT_EQ(ret.Where(), "add_ints+0x3");
  EXPECT_EQ(Resolve("add_ints+0x3")[0].vaddr, ret.vaddr);

  absl::Status mid = Error("add_ints+1");
  EXPECT_EQ(mid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(mid.message()),
            "add_ints+0x1 is inside 'lea (%rdi,%rsi,1), %eax' at add_ints+0x0: probe an "
            "instruction boundary");
  EXPECT_EQ(std::string(Error("sum_item+0x5").message()),
            "sum_item+0x5 is inside 'movsxdl 0x24(%rdi), %rdx' at sum_item+0x4: probe an "
            "instruction boundary");
  const absl::Status past = Error("add_ints+0x40");
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(past.message()),
            absl::StrFormat("add_ints+0x40 is past the end of add_ints (its size is 0x%x bytes)",
                            elf_.symbols.at("add_ints").size));
  EXPECT_FALSE(target_
                   ->Resolve(*ParseProbePoint(
                       absl::StrFormat("add_ints+%d", elf_.symbols.at("add_ints").size)))
                   .ok());
}

TEST_F(ProbeTargetTest, UnknownFunctionsSuggestNearNames) {
  const absl::Status s = Error("add_intz");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(s.message()),
            "unknown function 'add_intz' in probe_args; did you mean 'add_ints'?");
  EXPECT_EQ(std::string(Error("completely_unknown").message()),
            "unknown function 'completely_unknown' in probe_args");
  EXPECT_EQ(std::string(Error("add_ints@other.c").message()),
            absl::StrCat("no function 'add_ints' in a source file matching 'other.c' of "
                         "probe_args (it is in ",
                         SourcePath(), ")"));
  EXPECT_EQ(Resolve("add_ints@probe_args.c")[0].vaddr.value, Start("add_ints"));
  EXPECT_EQ(Resolve("add_ints@targets/probe_args.c")[0].vaddr.value, Start("add_ints"));
}

TEST_F(ProbeTargetTest, ReturnProbesAndEventNames) {
  const ResolvedPoint r = Resolve("fact%return")[0];
  EXPECT_TRUE(r.is_return);
  EXPECT_EQ(r.vaddr.value, Start("fact"));
  EXPECT_EQ(r.event, "fact__return");
  const ResolvedPoint named = Resolve("grp:hit=add_ints+3")[0];
  EXPECT_EQ(named.event, "hit");
  EXPECT_EQ(named.group, "grp");
  EXPECT_EQ(Resolve("add_ints+3")[0].event, "add_ints");
}

// Several line-table rows share sum_item+0x12 (lines 53, 54, 56; the last, 54, is not a
// statement): the point names the last statement, 56, as gdb does (`break probe_args.c:56`
// and `info line *ADDR` both say line 56 there), not libdw's last row.
TEST_F(ProbeTargetTest, APointNamesTheLineGdbNamesForItsAddress) {
  const int ret = FixtureLine("return total + p->id;");
  const std::vector<ResolvedPoint> r = Resolve(absl::StrCat("probe_args.c:", ret));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].function, "sum_item");
  EXPECT_EQ(r[0].offset, 0x12u);
  EXPECT_EQ(r[0].line, ret);
  auto symbols = symbols::Symbols::ForFile(FixturePath());
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  const std::optional<symbols::SourceLine> line = (*symbols)->LineAt(r[0].vaddr);
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->line, ret);
}

TEST_F(ProbeTargetTest, RelativeAndAbsoluteLines) {
  const int body = FixtureLine("PROBE: loop body");
  const int decl = FixtureLine("long loop_lines(int n)");
  auto symbols = symbols::Symbols::ForFile(FixturePath());
  ASSERT_TRUE(symbols.ok());
  auto rows = (*symbols)->AddressesOfLine("probe_args.c", body);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const uint64_t first = std::min_element(rows->begin(), rows->end())->value;

  const ResolvedPoint rel = Resolve(absl::StrCat("loop_lines:", body - decl))[0];
  EXPECT_EQ(rel.vaddr.value, first);
  EXPECT_EQ(rel.line, body);
  EXPECT_EQ(rel.function, "loop_lines");
  EXPECT_EQ(rel.event, absl::StrCat("loop_lines_L", body - decl));
  const std::vector<ResolvedPoint> abs = Resolve(absl::StrCat("probe_args.c:", body));
  ASSERT_EQ(abs.size(), 1u);
  EXPECT_EQ(abs[0].vaddr.value, first);
  EXPECT_EQ(abs[0].event, absl::StrCat("loop_lines_L", body));
  EXPECT_EQ(abs[0].offset, first - Start("loop_lines"));
  // The declaration line is the function's entry.
  EXPECT_EQ(Resolve("loop_lines:0")[0].vaddr.value, Start("loop_lines"));
}

TEST_F(ProbeTargetTest, LinesWithoutCodeNameTheNearestOnes) {
  const int blank = FixtureLine("PROBE: no code");  // and the blank line above it
  const int decl = FixtureLine("long loop_lines(int n)");
  const absl::Status s = Error(absl::StrCat("probe_args.c:", blank));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(s.message()),
            absl::StrCat("no code at probe_args.c:", blank,
                         "; nearest lines with code: ", blank - 2, ", ", blank + 1));
  EXPECT_EQ(std::string(Error(absl::StrCat("loop_lines:", blank - 1 - decl)).message()),
            absl::StrCat("no code at loop_lines:", blank - 1 - decl, " (probe_args.c:", blank - 1,
                         "); nearest lines with code: ", blank - 2 - decl, ", ", blank + 1 - decl));
  EXPECT_EQ(std::string(Error("loop_lines:40").message()),
            absl::StrCat("loop_lines:40 (probe_args.c:", decl + 40,
                         ") is past the end of loop_lines (its last line is loop_lines:8)"));
  EXPECT_EQ(std::string(Error("nosuch.c:3").message()),
            "no source file matching 'nosuch.c' in the line table of probe_args (files: "
            "probe_args.c)");
}

TEST_F(ProbeTargetTest, LazyPatterns) {
  const int body = FixtureLine("PROBE: loop body");
  const std::vector<ResolvedPoint> in_fn = Resolve("loop_lines;acc += tick*");
  ASSERT_EQ(in_fn.size(), 1u);
  EXPECT_EQ(in_fn[0].line, body);
  const std::vector<ResolvedPoint> in_file = Resolve("probe_args.c;return n*fact(*");
  ASSERT_EQ(in_file.size(), 1u);
  EXPECT_EQ(in_file[0].function, "fact");
  EXPECT_EQ(in_file[0].line, FixtureLine("return n * fact(n - 1);"));
  EXPECT_EQ(std::string(Error("loop_lines;nothing*like*this").message()),
            "no line of loop_lines matches the pattern 'nothing*like*this'");
}

TEST_F(ProbeTargetTest, RawAddresses) {
  const ResolvedPoint a = Resolve(absl::StrFormat("0x%x", Start("tick")))[0];
  EXPECT_EQ(a.function, "tick");
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(a.event, absl::StrFormat("abs_%x", Start("tick")));
  EXPECT_EQ(std::string(Error(absl::StrFormat("0x%x", Start("add_ints") + 1)).message()),
            "add_ints+0x1 is inside 'lea (%rdi,%rsi,1), %eax' at add_ints+0x0: probe an "
            "instruction boundary");
  EXPECT_EQ(std::string(Error(absl::StrFormat("0x%x", Start("g_items"))).message()),
            absl::StrFormat("0x%x is not in an executable segment of probe_args: give a code "
                            "address",
                            Start("g_items")));
}

TEST_F(ProbeTargetTest, ListLinesLikePerf) {
  auto listings = target_->ListLines(*ParseProbePoint("loop_lines"));
  ASSERT_TRUE(listings.ok()) << listings.status();
  ASSERT_EQ(listings->size(), 1u);
  const std::vector<std::string> src = SourceLines();
  const int decl = FixtureLine("long loop_lines(int n)");
  // Relative lines with code: declaration, acc = 0, for, body, return, closing brace.
  const std::vector<bool> code = {true, true, false, false, true, true, false, true, true};
  std::string expected = absl::StrCat("<loop_lines@", SourcePath(), ":0>\n");
  for (int rel = 0; rel < static_cast<int>(code.size()); ++rel) {
    const std::string& text = src[static_cast<size_t>(decl + rel - 1)];
    expected += code[static_cast<size_t>(rel)] ? absl::StrFormat("%7d  %s\n", rel, text)
                                               : absl::StrCat("         ", text, "\n");
  }
  EXPECT_EQ(FormatLineListing((*listings)[0]), expected);
  EXPECT_TRUE((*listings)[0].have_source);
  EXPECT_FALSE(target_->ListLines(*ParseProbePoint("probe_args.c:3")).ok());
}

TEST_F(ProbeTargetTest, ListVarsLikePerf) {
  auto add = target_->ListVars(*ParseProbePoint("add_ints"));
  ASSERT_TRUE(add.ok()) << add.status();
  EXPECT_EQ(FormatVarListing("add_ints", *add),
            "Available variables at add_ints\n\t@<add_ints+0>\n\t\tint\ta\n\t\tint\tb\n");

  const int body = FixtureLine("PROBE: loop body");
  auto loop = target_->ListVars(*ParseProbePoint(absl::StrCat("probe_args.c:", body)));
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_EQ(loop->size(), 1u);
  std::vector<std::string> vars;
  for (const VarInfo& v : (*loop)[0].vars) {
    vars.push_back(absl::StrCat(v.type_name, " ", v.name, v.is_param ? " (param)" : "",
                                v.available ? "" : " (unavailable)"));
  }
  EXPECT_THAT(vars, ElementsAre("int i", "int n (param)", "long acc"));

  auto local = target_->ListVars(
      *ParseProbePoint(absl::StrCat("probe_args.c:", FixtureLine("PROBE: local_item call"))));
  ASSERT_TRUE(local.ok()) << local.status();
  vars.clear();
  for (const VarInfo& v : (*local)[0].vars) {
    vars.push_back(absl::StrCat(v.type_name, " ", v.name));
  }
  EXPECT_THAT(vars, ElementsAre("long id", "struct item local"));

  auto end = target_->ListVars(*ParseProbePoint("loop_lines:8"));
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_EQ((*end)[0].vars.size(), 2u);
  EXPECT_EQ((*end)[0].vars[0].name, "n");
  EXPECT_FALSE((*end)[0].vars[0].available);
  EXPECT_EQ((*end)[0].vars[1].name, "acc");
  EXPECT_FALSE((*end)[0].vars[1].available);
  EXPECT_EQ((*end)[0].vars[1].reason,
            absl::StrCat("variable 'acc' is optimized out at ", (*end)[0].point.Where()));
  EXPECT_EQ(FormatVarListing("loop_lines:8", *end),
            absl::StrCat("Available variables at loop_lines:8\n\t@<loop_lines+",
                         (*end)[0].point.offset, ">\n"));

  auto ret = target_->ListVars(*ParseProbePoint("fact%return"));
  ASSERT_FALSE(ret.ok());
  EXPECT_EQ(std::string(ret.status().message()),
            "'fact%return' is a return probe: only $retval is available there");
}

TEST_F(ProbeTargetTest, SymbolsAndLoadBias) {
  EXPECT_EQ(target_->SymbolAddress("g_items")->value, Start("g_items"));
  EXPECT_EQ(target_->SymbolAddress("tick")->value, Start("tick"));
  EXPECT_FALSE(target_->SymbolAddress("no_such_symbol").has_value());
  EXPECT_FALSE(target_->FileOffset(RemoteAddr{0xffffffff0000}).has_value());

  struct stat st {};
  ASSERT_EQ(stat(FixturePath().c_str(), &st), 0);
  const GElf_Phdr& text = *std::find_if(elf_.loads.begin(), elf_.loads.end(),
                                        [](const GElf_Phdr& p) { return (p.p_flags & PF_X) != 0; });
  ptrace::MapEntry m;
  m.start = RemoteAddr{0x555555554000 + (text.p_vaddr & ~0xfffULL)};
  m.end = m.start + 0x1000;
  m.exec = true;
  m.offset = text.p_offset & ~0xfffULL;
  m.inode = st.st_ino;
  m.path = FixturePath();
  auto bias = target_->LoadBias({m});
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_EQ(*bias, 0x555555554000u);
  m.inode += 1;
  EXPECT_EQ(target_->LoadBias({m}).status().code(), absl::StatusCode::kNotFound);
}

TEST(ProbeTargetOpen, ErrorsNameTheFile) {
  auto missing = ProbeTarget::Open("/nonexistent/probe_args");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              ::testing::HasSubstr("/nonexistent/probe_args"));
  auto text = ProbeTarget::Open(SourcePath());
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kwatch::core::probe
