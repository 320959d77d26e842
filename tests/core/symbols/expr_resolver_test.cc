// ResolveExpr alone: variables with made-up addresses whose DWARF types come from
// tests/targets/layouts, a fake memory holding the pointers, and addresses computed from the
// C layout of the same types (copied below: the ABI fixes their offsets).

#include "core/symbols/expr_resolver.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/symbols/expr.h"
#include "tests/test_util.h"

namespace kwatch::core::symbols {
namespace {

struct Inner {
  int a;
  int b;
};
struct Stats {
  long hits;
  int misses;
  short flags;
  char tag[8];
  unsigned mode : 3;
  unsigned ready : 1;
  unsigned level : 12;
  Inner inner;
  union {
    int as_int;
    float as_float;
  } u;
  struct {
    short x;
    short y;
  };
};
struct Line {
  unsigned long tag;
  unsigned char valid : 1;
  unsigned char dirty : 1;
  short owner;
  long data[2];
};
struct Cache {
  int nlines;
  Line lines[4];
  Cache* next;
};

const Dwfl_Callbacks kCallbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = nullptr,
};

// The fixture's variables at made-up addresses, with their DWARF types, and a memory of
// 8-byte pointers.
class ExprResolverTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kStats = 0x10000;
  static constexpr uint64_t kCache = 0x20000;      // g_cache
  static constexpr uint64_t kCachePtr = 0x30000;   // cache (cache_t *)
  static constexpr uint64_t kLinePtr = 0x30008;    // g_line_ptr (struct line *)
  static constexpr uint64_t kNullCache = 0x30010;  // g_null_cache
  static constexpr uint64_t kMatrix = 0x40000;     // g_matrix (int[3][4])
  static constexpr uint64_t kLines = 0x50000;      // g_lines (struct line[3])
  static constexpr uint64_t kHeapCache = 0x7f0000001000;
  static constexpr uint64_t kHeapLines = 0x7f0000002000;

  static void SetUpTestSuite() {
    dwfl_ = dwfl_begin(&kCallbacks);
    const std::string path = ::kwatch::testing::TargetPath("layouts");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    dwfl_report_begin(dwfl_);
    Dwfl_Module* mod = dwfl_report_offline(dwfl_, path.c_str(), path.c_str(), fd);
    dwfl_report_end(dwfl_, nullptr, nullptr);
    ASSERT_NE(mod, nullptr) << dwfl_errmsg(-1);
    Dwarf_Addr bias = 0;
    for (Dwarf_Die* cu = nullptr; (cu = dwfl_module_nextcu(mod, cu, &bias)) != nullptr;) {
      Dwarf_Die child;
      if (dwarf_child(cu, &child) != 0) {
        continue;
      }
      do {
        if (dwarf_tag(&child) == DW_TAG_variable) {
          if (const std::optional<Dwarf_Die> t = TypeOf(child); t.has_value()) {
            types_.emplace(DieName(child), TypeRef{*t, 0});
          }
        }
      } while (dwarf_siblingof(&child, &child) == 0);
    }
  }
  static void TearDownTestSuite() {
    dwfl_end(dwfl_);
    dwfl_ = nullptr;
  }

  static VariableLookup Lookup() {
    return [](const std::string& name) -> absl::StatusOr<ExprVariable> {
      static const std::map<std::string, uint64_t> kAt = {
          {"g_stats", kStats},      {"g_cache", kCache},          {"cache", kCachePtr},
          {"g_line_ptr", kLinePtr}, {"g_null_cache", kNullCache}, {"g_matrix", kMatrix},
          {"g_lines", kLines}};
      ExprVariable v;
      v.name = name;
      v.module = "/lib/fake.so";
      if (name == "untyped") {
        v.addr = 0x60000;
        v.elf_size = 24;
        return v;
      }
      if (name == "unsized") {
        v.addr = 0x61000;
        return v;
      }
      const auto at = kAt.find(name);
      if (at == kAt.end()) {
        return absl::NotFoundError(absl::StrCat("lookup: no '", name, "'"));
      }
      v.addr = at->second;
      v.type = types_.at(name);
      return v;
    };
  }

  // The memory: the pointers the fixture's pointer variables hold.
  static MemoryReader Memory() {
    return [](RemoteAddr addr, std::span<uint8_t> out) {
      static const std::map<uint64_t, uint64_t> kPointers = {
          {kCachePtr, kHeapCache}, {kLinePtr, kHeapLines}, {kNullCache, 0}};
      const auto it = kPointers.find(addr.value);
      if (it == kPointers.end() || out.size() != 8) {
        return absl::OutOfRangeError(absl::StrCat("nothing mapped at ", addr.value));
      }
      std::memcpy(out.data(), &it->second, 8);
      return absl::OkStatus();
    };
  }

  // Types by name for casts: "line" is the type g_line_ptr points to, "cache_t" g_cache's.
  static TypeLookup Types() {
    return [](const ExprType& t) -> absl::StatusOr<TypeRef> {
      if (t.name == "line") {
        return TypeRef{*TypeOf(types_.at("g_line_ptr").die), 0};
      }
      if (t.name == "cache_t") {
        return types_.at("g_cache");
      }
      return absl::NotFoundError(absl::StrCat("types: no '", t.name, "'"));
    };
  }

  static absl::StatusOr<ResolvedExpr> Resolve(const std::string& text,
                                              const MemoryReader& read = Memory()) {
    auto e = ParseExpr(text);
    if (!e.ok()) {
      return e.status();
    }
    return ResolveExpr(*e, Lookup(), read, Types());
  }

  static Dwfl* dwfl_;
  static std::map<std::string, TypeRef> types_;
};

Dwfl* ExprResolverTest::dwfl_ = nullptr;
std::map<std::string, TypeRef> ExprResolverTest::types_;

TEST_F(ExprResolverTest, MembersAndIndexesAddTheirOffsets) {
  auto r = Resolve("g_cache.lines[2].data[1]");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->display, "g_cache.lines[2].data[1]");
  EXPECT_EQ(r->addr.value,
            kCache + offsetof(Cache, lines) + 2 * sizeof(Line) + offsetof(Line, data) + 8);
  EXPECT_EQ(r->length, 8u);
  EXPECT_EQ(r->type_name, "long");
  EXPECT_EQ(r->module, "/lib/fake.so");
  ASSERT_TRUE(r->layout.has_value());
  EXPECT_EQ(r->layout->size, 8u);

  auto inner = Resolve("g_stats.inner.b");
  ASSERT_TRUE(inner.ok()) << inner.status();
  EXPECT_EQ(inner->addr.value, kStats + offsetof(Stats, inner) + offsetof(Inner, b));
  EXPECT_EQ(inner->length, sizeof(int));

  auto anonymous = Resolve("g_stats.y");  // a member of the anonymous struct
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_EQ(anonymous->addr.value, kStats + offsetof(Stats, y));
  EXPECT_EQ(anonymous->type_name, "short");
}

TEST_F(ExprResolverTest, RowsOfAMatrix) {
  auto cell = Resolve("g_matrix[2][3]");
  ASSERT_TRUE(cell.ok()) << cell.status();
  EXPECT_EQ(cell->addr.value, kMatrix + (2 * 4 + 3) * sizeof(int));
  EXPECT_EQ(cell->length, sizeof(int));
  auto row = Resolve("g_matrix[1]");
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->addr.value, kMatrix + 4 * sizeof(int));
  EXPECT_EQ(row->length, 4 * sizeof(int));
  EXPECT_EQ(row->type_name, "int[4]");
}

TEST_F(ExprResolverTest, PointersAreFollowedThroughTheMemory) {
  auto arrow = Resolve("cache->lines[1].owner");
  ASSERT_TRUE(arrow.ok()) << arrow.status();
  EXPECT_EQ(arrow->display, "cache->lines[1].owner");
  EXPECT_EQ(arrow->addr.value,
            kHeapCache + offsetof(Cache, lines) + sizeof(Line) + offsetof(Line, owner));
  EXPECT_EQ(arrow->length, sizeof(short));

  auto deref = Resolve("*cache");
  ASSERT_TRUE(deref.ok()) << deref.status();
  EXPECT_EQ(deref->addr.value, kHeapCache);
  EXPECT_EQ(deref->length, sizeof(Cache));
  EXPECT_EQ(deref->type_name, "cache_t");

  auto indexed = Resolve("g_line_ptr[2].data[0]");
  ASSERT_TRUE(indexed.ok()) << indexed.status();
  EXPECT_EQ(indexed->addr.value, kHeapLines + 2 * sizeof(Line) + offsetof(Line, data));

  // An array takes '*' and '->' as its first element (a->m is a[0].m).
  auto first = Resolve("g_lines->owner");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->addr.value, kLines + offsetof(Line, owner));
  auto star = Resolve("*g_lines");
  ASSERT_TRUE(star.ok()) << star.status();
  EXPECT_EQ(star->addr.value, kLines);
  EXPECT_EQ(star->length, sizeof(Line));
}

// Every pointer read is listed, in order, with where it is stored and what it held (what
// --follow watches); a location without pointers lists none, nor does an array's first element.
TEST_F(ExprResolverTest, ThePointersReadAreListedInOrder) {
  auto arrow = Resolve("cache->lines[1].owner");
  ASSERT_TRUE(arrow.ok()) << arrow.status();
  ASSERT_EQ(arrow->pointers.size(), 1u);
  EXPECT_EQ(arrow->pointers[0].display, "cache");
  EXPECT_EQ(arrow->pointers[0].addr.value, kCachePtr);
  EXPECT_EQ(arrow->pointers[0].size, 8u);
  EXPECT_EQ(arrow->pointers[0].value, kHeapCache);

  auto indexed = Resolve("g_line_ptr[2].data[0]");
  ASSERT_TRUE(indexed.ok()) << indexed.status();
  ASSERT_EQ(indexed->pointers.size(), 1u);
  EXPECT_EQ(indexed->pointers[0].display, "g_line_ptr");
  EXPECT_EQ(indexed->pointers[0].value, kHeapLines);

  auto plain = Resolve("g_cache.lines[2].data[1]");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->pointers.empty());
  auto first = Resolve("g_lines->owner");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->pointers.empty());
}

// A cast's address is a pointer value: '->', '*' and '[i]' take it as it is, and pointers
// stored there (a cast to `T **`) are read from the memory.
TEST_F(ExprResolverTest, CastsStartFromTheirAddress) {
  auto owner = Resolve("((struct line *)0x7f0000002000)->owner");
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(owner->addr.value, kHeapLines + offsetof(Line, owner));
  EXPECT_EQ(owner->display, "((struct line *)0x7f0000002000)->owner");
  EXPECT_EQ(owner->module, "");

  auto element = Resolve("((cache_t *)0x7f0000001000)->lines[3].data[1]");
  ASSERT_TRUE(element.ok()) << element.status();
  EXPECT_EQ(element->addr.value,
            kHeapCache + offsetof(Cache, lines) + 3 * sizeof(Line) + offsetof(Line, data) + 8);

  // g_line_ptr (at kLinePtr) holds kHeapLines.
  auto through = Resolve("(*(struct line **)0x30008)[2].owner");
  ASSERT_TRUE(through.ok()) << through.status();
  EXPECT_EQ(through->addr.value, kHeapLines + 2 * sizeof(Line) + offsetof(Line, owner));
  EXPECT_EQ(through->display, "(*(struct line **)0x30008)[2].owner");
  auto pointer = Resolve("*(struct line **)0x30008");
  ASSERT_TRUE(pointer.ok()) << pointer.status();
  EXPECT_EQ(pointer->addr.value, kLinePtr);
  EXPECT_EQ(pointer->type_name, "struct line *");
  EXPECT_EQ(pointer->length, 8u);
  auto dot = Resolve("(*(struct line **)0x30008).owner");
  ASSERT_FALSE(dot.ok());
  EXPECT_EQ(dot.status().message(),
            "'*(struct line **)0x30008' is a pointer (struct line *): use "
            "'(*(struct line **)0x30008)->owner'");

  auto unknown = Resolve("((struct lin *)0x10)->owner");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(),
            "types: no 'lin' at column 3\n"
            "  ((struct lin *)0x10)->owner\n"
            "    ^");
  auto e = ParseExpr("(struct line *)0x10");
  ASSERT_TRUE(e.ok());
  auto no_types = ResolveExpr(*e, Lookup(), Memory());
  ASSERT_FALSE(no_types.ok());
  EXPECT_EQ(no_types.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ExprResolverTest, ABitfieldIsItsStorageUnit) {
  auto r = Resolve("g_stats.level");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->layout.has_value());
  ASSERT_EQ(r->layout->fields.size(), 1u);
  const FieldLayout& f = r->layout->fields[0];
  EXPECT_EQ(f.bit_size, 12u);
  EXPECT_EQ(r->length, f.size);
  // The field's first bit, counted from the object's start, is where the ABI puts it.
  Stats probe;
  std::memset(&probe, 0, sizeof(probe));
  probe.level = 1;
  unsigned char bytes[sizeof(Stats)];
  std::memcpy(bytes, &probe, sizeof(probe));
  uint64_t first_bit = 0;
  while (((bytes[first_bit / 8] >> (first_bit % 8)) & 1) == 0) {
    ++first_bit;
  }
  EXPECT_EQ((r->addr.value - kStats) * 8 + f.bit_offset, first_bit);
}

TEST_F(ExprResolverTest, UntypedVariablesTakeTheirSymbolsSize) {
  auto r = Resolve("untyped");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->addr.value, 0x60000u);
  EXPECT_EQ(r->length, 24u);
  EXPECT_EQ(r->type_name, "");
  EXPECT_FALSE(r->layout.has_value());
  EXPECT_EQ(Resolve("unsized").status().message(),
            "'unsized' has no DWARF type and its ELF symbol has no size: give the length "
            "(--len), or build the program with -g");
  EXPECT_EQ(Resolve("untyped.x").status().message(),
            "'untyped' has no DWARF type information (was the program built with -g?): "
            "members, indexes and '*' need one. Watch the whole symbol, or give an address as "
            "0xADDR:LEN");
}

TEST_F(ExprResolverTest, AbsoluteAddressesNeedNoLookup) {
  auto r = ResolveExpr(*ParseExpr("0x1234:4"), VariableLookup(), MemoryReader());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->display, "0x1234");
  EXPECT_EQ(r->addr.value, 0x1234u);
  EXPECT_EQ(r->length, 4u);
  EXPECT_EQ(r->module, "");
  auto eight = ResolveExpr(*ParseExpr("0x1234"), VariableLookup(), MemoryReader());
  ASSERT_TRUE(eight.ok()) << eight.status();
  EXPECT_EQ(eight->length, 8u);
}

TEST_F(ExprResolverTest, ErrorsNameTheExpressionSoFar) {
  EXPECT_EQ(Resolve("nothing").status().message(), "lookup: no 'nothing'");
  EXPECT_EQ(Resolve("g_null_cache->nlines").status().message(),
            "'g_null_cache' is NULL: there is nothing to watch behind it yet");
  EXPECT_EQ(Resolve("cache->nlines", MemoryReader()).status().message(),
            "following the pointer 'cache' needs the target's memory, and none is given");
  const absl::Status unreadable = Resolve("cache->next->nlines").status();
  EXPECT_EQ(unreadable.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(
      unreadable.message(),
      absl::StrFormat("reading the pointer 'cache->next' at 0x%x: nothing mapped at %d",
                      kHeapCache + offsetof(Cache, next), kHeapCache + offsetof(Cache, next)));
  EXPECT_EQ(Resolve("g_cache.lines[4]").status().message(),
            "index 4 is out of bounds for 'g_cache.lines' (struct line[4]): valid indexes are 0 "
            "to 3");
  EXPECT_EQ(Resolve("g_cache.line").status().message(),
            "cache_t has no member 'line'; did you mean 'lines'? Members: nlines, lines, next");
}

}  // namespace
}  // namespace kwatch::core::symbols
