// ElfSymbolIndex against the tools' view of the same files: readelf's symbol table and
// section headers, the file's own bytes, and libdwfl's address lookup (the rule the index
// follows), on the fixture programs of tests/targets.

#include "core/symbols/elf_index.h"

#include <dirent.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/symbols/dwarf_types.h"
#include "tests/test_util.h"

namespace kwatch::core::symbols {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// One row of `readelf -sW`'s .symtab listing.
struct ReadelfSym {
  std::string name;
  uint64_t value = 0;
  uint64_t size = 0;
  std::string type;  // FUNC, OBJECT, NOTYPE, TLS, ...
  std::string bind;  // LOCAL, GLOBAL, WEAK, ...
  std::string ndx;   // a number, UND, ABS, COM
};

std::string Readelf(const std::string& flags, const std::string& path) {
  auto r = ::kwatch::testing::Run({"/usr/bin/readelf", flags, path});
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r.ok() ? r->exit_code : -1, 0) << (r.ok() ? r->err : "");
  return r.ok() ? r->out : "";
}

uint64_t Hex(absl::string_view s) {
  uint64_t v = 0;
  EXPECT_TRUE(absl::SimpleHexAtoi(s, &v)) << s;
  return v;
}

// The .symtab rows, in table order (readelf prints large sizes as 0x...).
std::vector<ReadelfSym> ReadelfSymtab(const std::string& path) {
  std::vector<ReadelfSym> out;
  bool in_symtab = false;
  for (absl::string_view line : absl::StrSplit(Readelf("-sW", path), '\n')) {
    if (absl::StrContains(line, "Symbol table '")) {
      in_symtab = absl::StrContains(line, "'.symtab'");
      continue;
    }
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!in_symtab || f.size() < 7 || f[0] == "Num:") {
      continue;
    }
    ReadelfSym s;
    s.value = Hex(f[1]);
    if (absl::StartsWith(f[2], "0x")) {
      s.size = Hex(f[2].substr(2));
    } else {
      EXPECT_TRUE(absl::SimpleAtoi(f[2], &s.size)) << line;
    }
    s.type = std::string(f[3]);
    s.bind = std::string(f[4]);
    s.ndx = std::string(f[6]);
    s.name = f.size() > 7 ? std::string(f[7]) : "";
    out.push_back(std::move(s));
  }
  return out;
}

std::string TypeName(uint8_t type) {
  switch (type) {
    case STT_NOTYPE:
      return "NOTYPE";
    case STT_OBJECT:
      return "OBJECT";
    case STT_FUNC:
      return "FUNC";
    case STT_TLS:
      return "TLS";
    case STT_GNU_IFUNC:
      return "IFUNC";
    case STT_COMMON:
      return "COMMON";
    default:
      return absl::StrCat("type ", type);
  }
}

std::string BindName(uint8_t bind) {
  switch (bind) {
    case STB_LOCAL:
      return "LOCAL";
    case STB_GLOBAL:
      return "GLOBAL";
    case STB_WEAK:
      return "WEAK";
    case STB_GNU_UNIQUE:
      return "UNIQUE";
    default:
      return absl::StrCat("bind ", bind);
  }
}

std::string NdxName(uint32_t shndx) {
  switch (shndx) {
    case SHN_ABS:
      return "ABS";
    case SHN_COMMON:
      return "COM";
    default:
      return absl::StrCat(shndx);
  }
}

// What the index should hold: readelf's rows that are defined, named, and not section or
// file symbols, as one comparable line each.
std::vector<std::string> Expected(const std::vector<ReadelfSym>& rows) {
  std::vector<std::string> out;
  for (const ReadelfSym& s : rows) {
    if (s.name.empty() || s.ndx == "UND" || s.type == "SECTION" || s.type == "FILE") {
      continue;
    }
    out.push_back(absl::StrCat(s.name, " ", absl::Hex(s.value), " ", s.size, " ", s.type, " ",
                               s.bind, " ", s.ndx));
  }
  return out;
}

std::vector<std::string> Actual(const ElfSymbolIndex& index) {
  std::vector<std::string> out;
  for (const ElfSymbol& s : index.symbols()) {
    out.push_back(absl::StrCat(std::string(s.name), " ", absl::Hex(s.addr), " ", s.size, " ",
                               TypeName(s.type), " ", BindName(s.bind), " ", NdxName(s.shndx)));
  }
  return out;
}

// Every program of tests/targets.
std::vector<std::string> TargetPrograms() {
  std::vector<std::string> out;
  const std::string dir = std::string(KWATCH_SOURCE_DIR) + "/tests/targets";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    ADD_FAILURE() << "cannot list " << dir;
    return out;
  }
  while (const dirent* e = ::readdir(d)) {  // NOLINT(concurrency-mt-unsafe): own DIR*
    const std::string name = e->d_name;
    if (name == "jump_funcs.c") {  // built twice, as jump_funcs_O0 and jump_funcs_O2
      out.push_back(::kwatch::testing::TargetPath("jump_funcs_O0"));
      out.push_back(::kwatch::testing::TargetPath("jump_funcs_O2"));
    } else if (absl::EndsWith(name, ".c")) {
      out.push_back(::kwatch::testing::TargetPath(name.substr(0, name.size() - 2)));
    }
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// A file reported to libdwfl as ProbeTarget does (dwfl_report_offline).
struct OfflineModule {
  DwflPtr dwfl;
  Dwfl_Module* mod = nullptr;
};

const Dwfl_Callbacks kCallbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = nullptr,
};

OfflineModule Report(const std::string& path) {
  OfflineModule m;
  m.dwfl.reset(dwfl_begin(&kCallbacks));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  dwfl_report_begin(m.dwfl.get());
  m.mod = dwfl_report_offline(m.dwfl.get(), path.c_str(), path.c_str(), fd);
  dwfl_report_end(m.dwfl.get(), nullptr, nullptr);
  EXPECT_NE(m.mod, nullptr) << path << ": " << dwfl_errmsg(-1);
  return m;
}

TEST(ElfIndexTest, FromFileHoldsReadelfsSymtabInTableOrder) {
  for (const std::string& path : TargetPrograms()) {
    auto index = ElfSymbolIndex::FromFile(path);
    ASSERT_TRUE(index.ok()) << index.status();
    const std::vector<std::string> expected = Expected(ReadelfSymtab(path));
    ASSERT_GT(expected.size(), 20u) << path;
    EXPECT_EQ(Actual(*index), expected) << path;
  }
}

TEST(ElfIndexTest, FromModuleHoldsTheSameSymbolsAtLinkTimeAddresses) {
  for (const std::string& path : TargetPrograms()) {
    auto file = ElfSymbolIndex::FromFile(path);
    ASSERT_TRUE(file.ok()) << file.status();
    const OfflineModule m = Report(path);
    ASSERT_NE(m.mod, nullptr);
    const ElfSymbolIndex module = ElfSymbolIndex::FromModule(m.mod);
    Dwarf_Addr start = 0;
    dwfl_module_info(m.mod, nullptr, &start, nullptr, nullptr, nullptr, nullptr, nullptr);
    EXPECT_EQ(module.bias(), start) << path;  // a PIE at its link-time address 0 + bias
    EXPECT_EQ(Actual(module), Actual(*file)) << path;
  }
}

TEST(ElfIndexTest, SectionsAreReadelfsSectionHeaders) {
  const std::string path = ::kwatch::testing::TargetPath("probe_args");
  auto index = ElfSymbolIndex::FromFile(path);
  ASSERT_TRUE(index.ok()) << index.status();
  std::vector<std::string> expected;
  for (absl::string_view line : absl::StrSplit(Readelf("-SW", path), '\n')) {
    // "  [ 1] .interp PROGBITS 0000000000000318 000318 00001c 00 A 0 0 1"
    const size_t close = line.find(']');
    if (!absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "[") ||
        close == absl::string_view::npos) {
      continue;
    }
    int nr = 0;
    const absl::string_view number =
        absl::StripAsciiWhitespace(line.substr(line.find('[') + 1, close - line.find('[') - 1));
    if (!absl::SimpleAtoi(number, &nr) || nr == 0) {
      continue;  // the header row, and the null section (elf_nextscn starts at 1)
    }
    const std::vector<absl::string_view> f =
        absl::StrSplit(line.substr(close + 1), ' ', absl::SkipEmpty());
    ASSERT_GE(f.size(), 5u) << line;
    expected.push_back(absl::StrCat(nr, " ", f[0], " ", f[1], " ", absl::Hex(Hex(f[2])), " ",
                                    absl::Hex(Hex(f[3])), " ", absl::Hex(Hex(f[4]))));
  }
  std::vector<std::string> actual;
  for (const ElfSection& s : index->sections()) {
    const std::string type = s.type == SHT_PROGBITS      ? "PROGBITS"
                             : s.type == SHT_NOBITS      ? "NOBITS"
                             : s.type == SHT_SYMTAB      ? "SYMTAB"
                             : s.type == SHT_DYNSYM      ? "DYNSYM"
                             : s.type == SHT_STRTAB      ? "STRTAB"
                             : s.type == SHT_NOTE        ? "NOTE"
                             : s.type == SHT_RELA        ? "RELA"
                             : s.type == SHT_DYNAMIC     ? "DYNAMIC"
                             : s.type == SHT_GNU_HASH    ? "GNU_HASH"
                             : s.type == SHT_INIT_ARRAY  ? "INIT_ARRAY"
                             : s.type == SHT_FINI_ARRAY  ? "FINI_ARRAY"
                             : s.type == SHT_GNU_versym  ? "VERSYM"
                             : s.type == SHT_GNU_verneed ? "VERNEED"
                                                         : absl::StrCat("type ", s.type);
    actual.push_back(absl::StrCat(s.index, " ", s.name, " ", type, " ", absl::Hex(s.addr), " ",
                                  absl::Hex(s.offset), " ", absl::Hex(s.size)));
  }
  ASSERT_GT(expected.size(), 20u);
  EXPECT_EQ(actual, expected);
}

TEST(ElfIndexTest, SectionBytesAreTheFilesBytes) {
  const std::string path = ::kwatch::testing::TargetPath("probe_args");
  auto index = ElfSymbolIndex::FromFile(path);
  ASSERT_TRUE(index.ok()) << index.status();
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const ElfSymbol* main_fn = index->Find("main", kFunctionSymbols);
  ASSERT_NE(main_fn, nullptr);
  const ElfSection* text = index->SectionWithBytesAt(main_fn->addr);
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(text->name, ".text");
  EXPECT_EQ(index->SectionOf(*main_fn), text);
  auto bytes = index->SectionBytes(*text);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_EQ(bytes->size(), text->size);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()),
            file.substr(text->offset, text->size));
  // g_total is in .bss: the file holds no bytes for it.
  const ElfSymbol* total = index->Find("g_total", kDataSymbols);
  ASSERT_NE(total, nullptr);
  ASSERT_NE(index->SectionOf(*total), nullptr);
  EXPECT_EQ(index->SectionOf(*total)->name, ".bss");
  EXPECT_EQ(index->SectionWithBytesAt(total->addr), nullptr);
}

TEST(ElfIndexTest, FindsByNameAndKind) {
  const std::string path = ::kwatch::testing::TargetPath("probe_args");
  auto index = ElfSymbolIndex::FromFile(path);
  ASSERT_TRUE(index.ok()) << index.status();
  for (const ReadelfSym& s : ReadelfSymtab(path)) {
    if (s.name == "sum_item" || s.name == "g_total" || s.name == "g_items") {
      const ElfSymbol* found = index->Find(s.name);
      ASSERT_NE(found, nullptr) << s.name;
      EXPECT_EQ(found->addr, s.value) << s.name;
      EXPECT_EQ(found->size, s.size) << s.name;
    }
  }
  EXPECT_NE(index->Find("sum_item", kFunctionSymbols), nullptr);
  EXPECT_EQ(index->Find("sum_item", kDataSymbols), nullptr);
  EXPECT_NE(index->Find("g_total", kObjectSymbols), nullptr);
  EXPECT_EQ(index->Find("g_total", kFunctionSymbols), nullptr);
  EXPECT_EQ(index->Find("no_such_symbol"), nullptr);
  EXPECT_THAT(index->FindAll("sum_item"), ::testing::SizeIs(1));
}

TEST(ElfIndexTest, VersionedNamesAreFoundByTheirBareName) {
  // A non-PIE program copies libc's `stdout` into its .bss (a copy relocation): its .symtab
  // spells it "stdout@GLIBC_2.2.5".
  char dir_template[] = "/tmp/kwatch-elfindex-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string src = dir + "/copyreloc.c";
  const std::string exe = dir + "/copyreloc";
  std::ofstream(src) << "#include <stdio.h>\nint main(void) { fputs(\"x\", stdout); return 0; }\n";
  auto cc = ::kwatch::testing::Run({"/usr/bin/cc", "-no-pie", "-fno-pic", "-o", exe, src});
  ASSERT_TRUE(cc.ok()) << cc.status();
  ASSERT_EQ(cc->exit_code, 0) << cc->err;
  auto index = ElfSymbolIndex::FromFile(exe);
  ASSERT_TRUE(index.ok()) << index.status();
  uint64_t value = 0;
  for (const ReadelfSym& s : ReadelfSymtab(exe)) {
    if (absl::StartsWith(s.name, "stdout@")) {
      value = s.value;
    }
  }
  ASSERT_NE(value, 0u) << "no stdout@VERSION in the .symtab of " << exe;
  const ElfSymbol* bare = index->Find("stdout", kObjectSymbols);
  ASSERT_NE(bare, nullptr);
  EXPECT_EQ(bare->name, "stdout@GLIBC_2.2.5");
  EXPECT_EQ(bare->bare_name(), "stdout");
  EXPECT_EQ(bare->addr, value);
  EXPECT_EQ(index->Find("stdout@GLIBC_2.2.5"), bare);
  EXPECT_EQ(index->Find("stdout@GLIBC_9.9"), nullptr);
  (void)::kwatch::testing::Run({"rm", "-rf", dir});
}

TEST(ElfIndexTest, ThreadLocalSymbolsHaveNoAddressToLookUp) {
  const std::string path = ::kwatch::testing::TargetPath("layouts");
  auto index = ElfSymbolIndex::FromFile(path);
  ASSERT_TRUE(index.ok()) << index.status();
  const ElfSymbol* tls = index->Find("t_tls", kTlsSymbols);
  ASSERT_NE(tls, nullptr);
  EXPECT_EQ(tls->type, STT_TLS);
  EXPECT_EQ(index->Find("t_tls", kObjectSymbols | kFunctionSymbols), nullptr);
  EXPECT_NE(index->SymbolAt(tls->addr), tls);  // an offset in the TLS block, not an address
}

TEST(ElfIndexTest, EveryFunctionContainsItsOwnAddresses) {
  const std::string path = ::kwatch::testing::TargetPath("probe_args");
  auto index = ElfSymbolIndex::FromFile(path);
  ASSERT_TRUE(index.ok()) << index.status();
  int checked = 0;
  for (const ReadelfSym& s : ReadelfSymtab(path)) {
    if (s.type != "FUNC" || s.size == 0 || s.ndx == "UND") {
      continue;
    }
    for (const uint64_t a : {s.value, s.value + s.size / 2, s.value + s.size - 1}) {
      const ElfSymbol* f = index->FunctionAt(a);
      ASSERT_NE(f, nullptr) << s.name << " at 0x" << std::hex << a;
      EXPECT_EQ(f->name, s.name) << "0x" << std::hex << a;
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
  const ElfSymbol* total = index->Find("g_total");
  ASSERT_NE(total, nullptr);
  EXPECT_EQ(index->FunctionAt(total->addr), nullptr);  // data
  EXPECT_EQ(index->SymbolAt(total->addr), total);
}

// The index's address lookup is libdwfl's (what Symbols::FunctionAt answered before the index
// existed): the same symbol for every byte of every loaded section of every fixture.
TEST(ElfIndexTest, SymbolAtAgreesWithLibdwflEverywhere) {
  size_t compared = 0;
  size_t functions = 0;
  for (const std::string& path : TargetPrograms()) {
    const OfflineModule m = Report(path);
    ASSERT_NE(m.mod, nullptr);
    const ElfSymbolIndex index = ElfSymbolIndex::FromModule(m.mod);
    for (const ElfSection& s : index.sections()) {
      if ((s.flags & SHF_ALLOC) == 0 || s.size == 0) {
        continue;
      }
      for (uint64_t a = s.addr; a < s.addr + s.size; ++a) {
        GElf_Off offset = 0;
        GElf_Sym sym;
        const char* name =
            dwfl_module_addrinfo(m.mod, a + index.bias(), &offset, &sym, nullptr, nullptr, nullptr);
        const ElfSymbol* ours = index.SymbolAt(a);
        const std::string want =
            name == nullptr ? "(none)" : absl::StrCat(name, "@0x", absl::Hex(a - offset));
        const std::string got =
            ours == nullptr ? "(none)"
                            : absl::StrCat(std::string(ours->name), "@0x", absl::Hex(ours->addr));
        ASSERT_EQ(got, want) << path << " at 0x" << std::hex << a << " in " << s.name;
        const int type = name == nullptr ? STT_NOTYPE : GELF_ST_TYPE(sym.st_info);
        const bool function = type == STT_FUNC || type == STT_GNU_IFUNC;
        ASSERT_EQ(index.FunctionAt(a) != nullptr, function) << path << " at 0x" << std::hex << a;
        functions += function ? 1 : 0;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 100000u);
  EXPECT_GT(functions, 10000u);
}

TEST(ElfIndexTest, NearNamesSuggestSymbolsOfTheKindAsked) {
  auto index = ElfSymbolIndex::FromFile(::kwatch::testing::TargetPath("probe_args"));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(index->NearNames("sum_itme", 3, kFunctionSymbols), ElementsAre("sum_item"));
  EXPECT_THAT(index->NearNames("g_totl", 3, kDataSymbols), ElementsAre("g_total"));
  EXPECT_THAT(index->NearNames("g_totl", 3, kFunctionSymbols), IsEmpty());
  EXPECT_THAT(index->NearNames("sum_item", 3, kFunctionSymbols), IsEmpty());  // itself: never
  EXPECT_THAT(index->NearNames("helpr", 3, kFunctionSymbols, {"helper"}), ElementsAre("helper"));
}

TEST(ElfIndexTest, FileErrorsNameTheFile) {
  EXPECT_EQ(ElfSymbolIndex::FromFile("/nonexistent/kwatch").status().message(),
            "open(/nonexistent/kwatch): No such file or directory");
  const std::string source = std::string(KWATCH_SOURCE_DIR) + "/tests/targets/probe_args.c";
  EXPECT_EQ(ElfSymbolIndex::FromFile(source).status().message(), source + ": not an ELF file");
}

}  // namespace
}  // namespace kwatch::core::symbols
