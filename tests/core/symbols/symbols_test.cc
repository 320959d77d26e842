#include "core/symbols/symbols.h"

#include <sys/uio.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/symbols/expr.h"
#include "tests/test_util.h"

namespace kwatch::core::symbols {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Copies of tests/targets/layouts.c's types: the ABI decides their layout, so offsetof and
// sizeof here give the offsets the DWARF must describe.
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

// The first bit (from the start of the object, little-endian numbering) that `set` changes.
template <typename T, typename Set>
uint32_t FirstBit(Set set) {
  T t;
  std::memset(&t, 0, sizeof(t));
  set(t);
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &t, sizeof(t));
  for (uint32_t i = 0; i < sizeof(T) * 8; ++i) {
    if ((bytes[i / 8] >> (i % 8)) & 1) {
      return i;
    }
  }
  return ~0u;
}

std::string LayoutsPath() {
  return kwatch::testing::TargetPath("layouts");
}

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

// A reader that fails: expressions that need no memory must not call it.
MemoryReader NoReader() {
  return [](RemoteAddr, std::span<uint8_t>) {
    ADD_FAILURE() << "unexpected memory read";
    return absl::InternalError("no memory");
  };
}

// A reader that answers `value` (8 bytes) at `at` and fails elsewhere.
MemoryReader PointerAt(uint64_t at, uint64_t value) {
  return [at, value](RemoteAddr addr, std::span<uint8_t> out) {
    if (addr.value != at || out.size() != sizeof(value)) {
      return absl::InternalError("read at an unexpected address");
    }
    std::memcpy(out.data(), &value, sizeof(value));
    return absl::OkStatus();
  };
}

// The symbols of one fixture program (`Target::Path()`), opened once per suite.
template <typename Target>
class SymbolsOf : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = Symbols::ForFile(Target::Path());
    ASSERT_TRUE(s.ok()) << s.status();
    symbols_ = s->release();
  }
  static void TearDownTestSuite() {
    delete symbols_;
    symbols_ = nullptr;
  }

  static absl::StatusOr<ResolvedExpr> Resolve(const std::string& text,
                                              const MemoryReader& read = NoReader()) {
    auto e = ParseExpr(text);
    if (!e.ok()) {
      return e.status();
    }
    return symbols_->Resolve(*e, read);
  }

  static const Symbols* symbols_;
};

template <typename Target>
const Symbols* SymbolsOf<Target>::symbols_ = nullptr;

struct LayoutsTarget {
  static std::string Path() { return LayoutsPath(); }
};
class SymbolsFileTest : public SymbolsOf<LayoutsTarget> {};

TEST_F(SymbolsFileTest, ForFileMissingFile) {
  auto s = Symbols::ForFile("/nonexistent/kwatch-layouts");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("/nonexistent/kwatch-layouts"));
}

TEST_F(SymbolsFileTest, StructVariableAndLinkTimeAddress) {
  auto r = Resolve("g_stats");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->display, "g_stats");
  EXPECT_EQ(r->type_name, "struct stats");
  EXPECT_EQ(r->length, sizeof(Stats));
  EXPECT_EQ(r->module, LayoutsPath());
  // A PIE file is read at its link-time addresses: small, non-zero.
  EXPECT_GT(r->addr.value, 0u);
  EXPECT_LT(r->addr.value, 0x100000u);
  auto amp = Resolve("&g_stats");
  ASSERT_TRUE(amp.ok()) << amp.status();
  EXPECT_EQ(amp->display, "g_stats");
  EXPECT_EQ(amp->addr, r->addr);
}

TEST_F(SymbolsFileTest, StructLayoutIsFlattenedInOrder) {
  auto r = Resolve("g_stats");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->layout.has_value());
  const TypeLayout& t = *r->layout;
  EXPECT_EQ(t.type_name, "struct stats");
  EXPECT_EQ(t.size, sizeof(Stats));

  const uint32_t mode_bit = FirstBit<Stats>([](Stats& s) { s.mode = 7; });
  const uint32_t ready_bit = FirstBit<Stats>([](Stats& s) { s.ready = 1; });
  const uint32_t level_bit = FirstBit<Stats>([](Stats& s) { s.level = 0xfff; });
  // A bitfield's storage unit is its declared type (unsigned int), aligned.
  const uint64_t mode_unit = mode_bit / 32 * 4;

  struct Want {
    std::string path;
    std::string type;
    uint64_t offset;
    uint64_t size;
    uint32_t bit_offset;
    uint32_t bit_size;
    int depth;
    bool leaf;
  };
  const std::vector<Want> want = {
      {".hits", "long", offsetof(Stats, hits), 8, 0, 0, 0, true},
      {".misses", "int", offsetof(Stats, misses), 4, 0, 0, 0, true},
      {".flags", "short", offsetof(Stats, flags), 2, 0, 0, 0, true},
      {".tag", "char[8]", offsetof(Stats, tag), 8, 0, 0, 0, true},
      {".mode", "unsigned int", mode_unit, 4, mode_bit - 8 * static_cast<uint32_t>(mode_unit), 3, 0,
       true},
      {".ready", "unsigned int", ready_bit / 32 * 4, 4, ready_bit % 32, 1, 0, true},
      {".level", "unsigned int", level_bit / 32 * 4, 4, level_bit % 32, 12, 0, true},
      {".inner", "struct inner", offsetof(Stats, inner), sizeof(Inner), 0, 0, 0, false},
      {".inner.a", "int", offsetof(Stats, inner) + offsetof(Inner, a), 4, 0, 0, 1, true},
      {".inner.b", "int", offsetof(Stats, inner) + offsetof(Inner, b), 4, 0, 0, 1, true},
      {".u", "union {...}", offsetof(Stats, u), 4, 0, 0, 0, false},
      {".u.as_int", "int", offsetof(Stats, u), 4, 0, 0, 1, true},
      {".u.as_float", "float", offsetof(Stats, u), 4, 0, 0, 1, true},
      {".x", "short", offsetof(Stats, x), 2, 0, 0, 0, true},
      {".y", "short", offsetof(Stats, y), 2, 0, 0, 0, true},
  };
  ASSERT_EQ(t.fields.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const FieldLayout& f = t.fields[i];
    SCOPED_TRACE(want[i].path);
    EXPECT_EQ(f.path, want[i].path);
    EXPECT_EQ(f.type_name, want[i].type);
    EXPECT_EQ(f.offset, want[i].offset);
    EXPECT_EQ(f.size, want[i].size);
    EXPECT_EQ(f.bit_offset, want[i].bit_offset);
    EXPECT_EQ(f.bit_size, want[i].bit_size);
    EXPECT_EQ(f.depth, want[i].depth);
    EXPECT_EQ(f.is_leaf, want[i].leaf);
    EXPECT_EQ(f.is_union, want[i].path == ".u");  // counted once, its members not apart
  }
  ASSERT_NE(t.LeafAt(offsetof(Stats, inner) + 5), nullptr);
  EXPECT_EQ(t.LeafAt(offsetof(Stats, inner) + 5)->path, ".inner.b");
}

TEST_F(SymbolsFileTest, MemberPath) {
  auto base = Resolve("g_stats");
  auto r = Resolve("g_stats.inner.b");
  ASSERT_TRUE(base.ok() && r.ok()) << r.status();
  EXPECT_EQ(r->display, "g_stats.inner.b");
  EXPECT_EQ(r->addr, base->addr + (offsetof(Stats, inner) + offsetof(Inner, b)));
  EXPECT_EQ(r->length, 4u);
  EXPECT_EQ(r->type_name, "int");
  ASSERT_TRUE(r->layout.has_value());
  ASSERT_EQ(r->layout->fields.size(), 1u);
  EXPECT_EQ(r->layout->fields[0].path, "");
  EXPECT_EQ(r->layout->fields[0].type_name, "int");
  EXPECT_EQ(r->layout->fields[0].size, 4u);

  auto anon = Resolve("g_stats.y");
  ASSERT_TRUE(anon.ok()) << anon.status();
  EXPECT_EQ(anon->addr, base->addr + offsetof(Stats, y));
  EXPECT_EQ(anon->type_name, "short");
}

TEST_F(SymbolsFileTest, BitfieldMemberIsItsStorageUnit) {
  auto base = Resolve("g_stats");
  auto r = Resolve("g_stats.ready");
  ASSERT_TRUE(base.ok() && r.ok()) << r.status();
  const uint32_t ready_bit = FirstBit<Stats>([](Stats& s) { s.ready = 1; });
  EXPECT_EQ(r->addr, base->addr + ready_bit / 32 * 4);
  EXPECT_EQ(r->length, 4u);
  ASSERT_TRUE(r->layout.has_value());
  ASSERT_EQ(r->layout->fields.size(), 1u);
  EXPECT_EQ(r->layout->fields[0].bit_offset, ready_bit % 32);
  EXPECT_EQ(r->layout->fields[0].bit_size, 1u);
}

TEST_F(SymbolsFileTest, ArrayOfStructs) {
  auto r = Resolve("g_lines");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type_name, "struct line[3]");
  EXPECT_EQ(r->length, 3 * sizeof(Line));
  ASSERT_TRUE(r->layout.has_value());
  const auto& fields = r->layout->fields;
  // Each element: [i], .tag, .valid, .dirty, .owner, .data, .data[0], .data[1].
  ASSERT_EQ(fields.size(), 3u * 8u);
  EXPECT_EQ(fields[8].path, "[1]");
  EXPECT_EQ(fields[8].type_name, "struct line");
  EXPECT_EQ(fields[8].offset, sizeof(Line));
  EXPECT_EQ(fields[8].depth, 0);
  EXPECT_FALSE(fields[8].is_leaf);
  EXPECT_EQ(fields[9].path, "[1].tag");
  EXPECT_EQ(fields[9].type_name, "unsigned long");
  EXPECT_EQ(fields[9].depth, 1);
  const uint32_t dirty_bit = FirstBit<Line>([](Line& l) { l.dirty = 1; });
  EXPECT_EQ(fields[11].path, "[1].dirty");
  EXPECT_EQ(fields[11].type_name, "unsigned char");
  EXPECT_EQ(fields[11].offset, sizeof(Line) + dirty_bit / 8);
  EXPECT_EQ(fields[11].size, 1u);
  EXPECT_EQ(fields[11].bit_offset, dirty_bit % 8);
  EXPECT_EQ(fields[11].bit_size, 1u);
  EXPECT_EQ(fields[12].path, "[1].owner");
  EXPECT_EQ(fields[12].offset, sizeof(Line) + offsetof(Line, owner));
  EXPECT_EQ(fields[13].path, "[1].data");
  EXPECT_EQ(fields[13].type_name, "long[2]");
  EXPECT_FALSE(fields[13].is_leaf);
  EXPECT_EQ(fields[15].path, "[1].data[1]");
  EXPECT_EQ(fields[15].offset, sizeof(Line) + offsetof(Line, data) + 8);
  EXPECT_EQ(fields[15].depth, 2);

  auto elem = Resolve("g_lines[2].owner");
  ASSERT_TRUE(elem.ok()) << elem.status();
  EXPECT_EQ(elem->display, "g_lines[2].owner");
  EXPECT_EQ(elem->addr, r->addr + (2 * sizeof(Line) + offsetof(Line, owner)));
  EXPECT_EQ(elem->type_name, "short");
  auto hex = Resolve("g_lines[0x2]");
  ASSERT_TRUE(hex.ok()) << hex.status();
  EXPECT_EQ(hex->display, "g_lines[2]");
  EXPECT_EQ(hex->type_name, "struct line");
}

TEST_F(SymbolsFileTest, TypedefStructWithNestedArray) {
  auto r = Resolve("g_cache.lines[3]");
  auto base = Resolve("g_cache");
  ASSERT_TRUE(r.ok() && base.ok()) << r.status();
  EXPECT_EQ(base->type_name, "cache_t");
  EXPECT_EQ(base->length, sizeof(Cache));
  EXPECT_EQ(r->display, "g_cache.lines[3]");
  EXPECT_EQ(r->addr, base->addr + offsetof(Cache, lines) + 3 * sizeof(Line));
  EXPECT_EQ(r->type_name, "struct line");
  ASSERT_TRUE(r->layout.has_value());
  EXPECT_EQ(r->layout->type_name, "struct line");
  ASSERT_EQ(r->layout->fields.size(), 7u);
  EXPECT_EQ(r->layout->fields[0].path, ".tag");
  EXPECT_EQ(r->layout->fields[6].path, ".data[1]");

  ASSERT_TRUE(base->layout.has_value());
  const auto& fields = base->layout->fields;
  EXPECT_EQ(fields.front().path, ".nlines");
  EXPECT_EQ(fields[1].path, ".lines");
  EXPECT_EQ(fields[1].type_name, "struct line[4]");
  EXPECT_EQ(fields.back().path, ".next");
  EXPECT_EQ(fields.back().type_name, "struct cache *");
  EXPECT_EQ(fields.back().offset, offsetof(Cache, next));
}

TEST_F(SymbolsFileTest, MultiDimensionalArray) {
  auto base = Resolve("g_matrix");
  auto row = Resolve("g_matrix[2]");
  auto cell = Resolve("g_matrix[2][3]");
  ASSERT_TRUE(base.ok() && row.ok() && cell.ok()) << cell.status();
  EXPECT_EQ(base->type_name, "int[3][4]");
  EXPECT_EQ(base->length, 48u);
  EXPECT_EQ(row->type_name, "int[4]");
  EXPECT_EQ(row->length, 16u);
  EXPECT_EQ(row->addr, base->addr + 32);
  ASSERT_TRUE(row->layout.has_value());
  ASSERT_EQ(row->layout->fields.size(), 4u);
  EXPECT_EQ(row->layout->fields[3].path, "[3]");
  EXPECT_EQ(row->layout->fields[3].offset, 12u);
  EXPECT_EQ(cell->type_name, "int");
  EXPECT_EQ(cell->addr, base->addr + 44);
  auto oob = Resolve("g_matrix[2][4]");
  ASSERT_FALSE(oob.ok());
  EXPECT_EQ(oob.status().message(),
            "index 4 is out of bounds for 'g_matrix[2]' (int[4]): valid indexes are 0 to 3");
}

TEST_F(SymbolsFileTest, LargeArrayIsOneField) {
  auto r = Resolve("g_big");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type_name, "long[1000]");
  EXPECT_EQ(r->length, 8000u);
  ASSERT_TRUE(r->layout.has_value());
  ASSERT_EQ(r->layout->fields.size(), 1u);
  EXPECT_EQ(r->layout->fields[0].path, "");
  EXPECT_EQ(r->layout->fields[0].size, 8000u);
  auto last = Resolve("g_big[999]");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->addr, r->addr + 999 * 8);
}

TEST_F(SymbolsFileTest, UnionMembersShareOffsetZero) {
  auto r = Resolve("g_value");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type_name, "union value");
  EXPECT_EQ(r->length, 8u);
  ASSERT_TRUE(r->layout.has_value());
  const auto& f = r->layout->fields;
  ASSERT_EQ(f.size(), 4u);
  // The union itself first: the one field accesses count on (CountedFields).
  EXPECT_EQ(f[0].path, "");
  EXPECT_EQ(f[0].type_name, "union value");
  EXPECT_EQ(f[0].size, 8u);
  EXPECT_TRUE(f[0].is_union);
  EXPECT_FALSE(f[0].is_leaf);
  EXPECT_EQ(f[1].path, ".l");
  EXPECT_EQ(f[2].path, ".d");
  EXPECT_EQ(f[2].type_name, "double");
  EXPECT_EQ(f[3].path, ".bytes");
  EXPECT_EQ(f[3].type_name, "unsigned char[8]");
  for (size_t i = 1; i < f.size(); ++i) {
    EXPECT_EQ(f[i].offset, 0u);
    EXPECT_EQ(f[i].depth, 1);
    EXPECT_TRUE(f[i].is_leaf);
    EXPECT_FALSE(f[i].is_union);
  }
  EXPECT_EQ(CountedFields(f), std::vector<size_t>{0});
}

TEST_F(SymbolsFileTest, ScalarsTypedefsAndPointers) {
  auto counter = Resolve("g_counter");
  ASSERT_TRUE(counter.ok()) << counter.status();
  EXPECT_EQ(counter->type_name, "counter_t");
  EXPECT_EQ(counter->length, 8u);
  ASSERT_TRUE(counter->layout.has_value());
  ASSERT_EQ(counter->layout->fields.size(), 1u);
  EXPECT_EQ(counter->layout->fields[0].path, "");
  EXPECT_EQ(counter->layout->fields[0].type_name, "counter_t");

  auto name = Resolve("g_name");
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(name->type_name, "const char *");
  EXPECT_EQ(name->length, 8u);

  auto ptr = Resolve("cache");
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  EXPECT_EQ(ptr->type_name, "cache_t *");
}

TEST_F(SymbolsFileTest, StaticVariables) {
  auto file_static = Resolve("s_file_static");
  ASSERT_TRUE(file_static.ok()) << file_static.status();
  EXPECT_EQ(file_static->type_name, "int");
  EXPECT_EQ(file_static->length, 4u);

  auto plain = Resolve("calls");
  auto qualified = Resolve("BumpCalls::calls");
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(qualified.ok()) << qualified.status();
  EXPECT_EQ(plain->addr, qualified->addr);
  EXPECT_EQ(plain->type_name, "int");
  EXPECT_EQ(qualified->display, "BumpCalls::calls");
}

TEST_F(SymbolsFileTest, AbsoluteAddresses) {
  auto r = Resolve("0x601040");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->display, "0x601040");
  EXPECT_EQ(r->addr.value, 0x601040u);
  EXPECT_EQ(r->length, 8u);
  EXPECT_FALSE(r->layout.has_value());
  EXPECT_TRUE(r->type_name.empty());
  EXPECT_TRUE(r->module.empty());
  auto len = Resolve("0x601040:0x10");
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(len->length, 16u);
}

TEST_F(SymbolsFileTest, ArrowFollowsThePointer) {
  auto ptr = Resolve("cache");
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  const uint64_t target = 0x7f0000001000;
  auto r = Resolve("cache->lines[3]", PointerAt(ptr->addr.value, target));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->display, "cache->lines[3]");
  EXPECT_EQ(r->addr.value, target + offsetof(Cache, lines) + 3 * sizeof(Line));
  EXPECT_EQ(r->type_name, "struct line");
  EXPECT_EQ(r->length, sizeof(Line));

  auto deref = Resolve("*cache", PointerAt(ptr->addr.value, target));
  ASSERT_TRUE(deref.ok()) << deref.status();
  EXPECT_EQ(deref->display, "*cache");
  EXPECT_EQ(deref->addr.value, target);
  EXPECT_EQ(deref->type_name, "cache_t");

  auto lp = Resolve("g_line_ptr");
  ASSERT_TRUE(lp.ok());
  auto indexed = Resolve("g_line_ptr[1].owner", PointerAt(lp->addr.value, target));
  ASSERT_TRUE(indexed.ok()) << indexed.status();
  EXPECT_EQ(indexed->addr.value, target + sizeof(Line) + offsetof(Line, owner));
  EXPECT_EQ(indexed->display, "g_line_ptr[1].owner");
}

TEST_F(SymbolsFileTest, NullPointer) {
  auto p = Resolve("g_null_cache");
  ASSERT_TRUE(p.ok()) << p.status();
  auto r = Resolve("g_null_cache->nlines", PointerAt(p->addr.value, 0));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), StartsWith("'g_null_cache' is NULL"));
}

TEST_F(SymbolsFileTest, ReaderErrorsPropagate) {
  auto r = Resolve("cache->nlines", [](RemoteAddr, std::span<uint8_t>) {
    return absl::NotFoundError("process_vm_readv: No such process");
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("reading the pointer 'cache'"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("No such process"));
}

TEST_F(SymbolsFileTest, UnknownNameSuggestsNearMatches) {
  auto r = Resolve("g_stat");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "no variable 'g_stat' in layouts; did you mean 'g_stats'?");
  auto two = Resolve("g_cach");
  ASSERT_FALSE(two.ok());
  EXPECT_THAT(std::string(two.status().message()),
              EndsWith("did you mean 'g_cache' or 'g_cache2'?"));
  auto none = Resolve("completely_unrelated_name");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "no variable 'completely_unrelated_name' in layouts");
}

TEST_F(SymbolsFileTest, FunctionGivenForData) {
  for (const char* name : {"main", "StoreHits"}) {
    auto r = Resolve(name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              std::string("'") + name +
                  "' is a function, not data: use `kwatch probe` for code, or watch a variable");
  }
}

TEST_F(SymbolsFileTest, ThreadLocalIsRefused) {
  auto r = Resolve("t_tls");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("'t_tls' is thread-local"));
}

TEST_F(SymbolsFileTest, TypeErrors) {
  struct Case {
    const char* expr;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"g_stats.hit", absl::StatusCode::kInvalidArgument,
       "struct stats has no member 'hit'; did you mean 'hits'? Members: hits, misses, flags, "
       "tag, mode, ready, level, inner, u, x, y"},
      {"cache.nlines", absl::StatusCode::kInvalidArgument,
       "'cache' is a pointer (cache_t *): use 'cache->nlines'"},
      {"g_stats->hits", absl::StatusCode::kInvalidArgument,
       "'g_stats' is struct stats, not a pointer: use 'g_stats.hits'"},
      {"g_lines[3]", absl::StatusCode::kInvalidArgument,
       "index 3 is out of bounds for 'g_lines' (struct line[3]): valid indexes are 0 to 2"},
      {"g_lines[-1]", absl::StatusCode::kInvalidArgument,
       "index -1 of 'g_lines' is negative: indexes start at 0"},
      {"g_counter.x", absl::StatusCode::kInvalidArgument,
       "'g_counter' is counter_t, not a struct or union: it has no member 'x'"},
      {"g_counter[1]", absl::StatusCode::kInvalidArgument,
       "'g_counter' is counter_t, not an array or a pointer: it takes no [index]"},
      {"*g_counter", absl::StatusCode::kInvalidArgument,
       "'g_counter' is counter_t, not a pointer: it cannot take '*'"},
      {"g_stats.mode.x", absl::StatusCode::kInvalidArgument,
       "'g_stats.mode' is a bitfield: it has no members, elements or target"},
      {"0x1000.x", absl::StatusCode::kInvalidArgument, ""},  // parse error
  };
  for (const Case& c : cases) {
    auto r = Resolve(c.expr);
    ASSERT_FALSE(r.ok()) << c.expr;
    EXPECT_EQ(r.status().code(), c.code) << c.expr << ": " << r.status();
    if (*c.message != '\0') {
      EXPECT_EQ(r.status().message(), c.message) << c.expr;
    }
  }
}

TEST_F(SymbolsFileTest, FunctionAtAndLineAt) {
  auto f = symbols_->FindFunction("StoreHits");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->name, "StoreHits");
  EXPECT_GT(f->size, 0u);
  auto at = symbols_->FunctionAt(f->start + 1);
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(at->name, "StoreHits");
  EXPECT_EQ(at->start, f->start);
  EXPECT_EQ(at->size, f->size);
  EXPECT_EQ(at->module, LayoutsPath());
  EXPECT_FALSE(symbols_->FunctionAt(RemoteAddr{0x10}).has_value());
  // Data addresses are not functions.
  auto data = Resolve("g_stats");
  ASSERT_TRUE(data.ok());
  EXPECT_FALSE(symbols_->FunctionAt(data->addr).has_value());

  const int marker = MarkerLine();
  ASSERT_GT(marker, 0);
  auto addrs = symbols_->AddressesOfLine("layouts.c", marker);
  ASSERT_TRUE(addrs.ok()) << addrs.status();
  ASSERT_FALSE(addrs->empty());
  for (RemoteAddr a : *addrs) {
    auto fn = symbols_->FunctionAt(a);
    ASSERT_TRUE(fn.has_value());
    EXPECT_EQ(fn->name, "StoreHits");
    auto line = symbols_->LineAt(a);
    ASSERT_TRUE(line.has_value());
    EXPECT_EQ(line->line, marker);
    EXPECT_THAT(line->file, EndsWith("tests/targets/layouts.c"));
  }
  auto missing = symbols_->AddressesOfLine("no_such_file.c", 3);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// The code inlined from ScaleHits into StoreScaled names ScaleHits; the rest of StoreScaled
// (g_counter += 2) names no inlined function.
TEST_F(SymbolsFileTest, LineAtNamesTheInlinedFunction) {
  auto f = symbols_->FindFunction("StoreScaled");
  ASSERT_TRUE(f.has_value());
  int inlined = 0;
  int plain = 0;
  for (uint64_t off = 0; off < f->size; ++off) {
    auto line = symbols_->LineAt(f->start + off);
    if (!line.has_value()) {
      continue;
    }
    if (line->inlined_function == "ScaleHits") {
      ++inlined;
      EXPECT_THAT(line->file, EndsWith("tests/targets/layouts.c"));
    } else {
      EXPECT_EQ(line->inlined_function, "") << "at StoreScaled+" << off;
      ++plain;
    }
  }
  EXPECT_GT(inlined, 0);
  EXPECT_GT(plain, 0);
}

TEST_F(SymbolsFileTest, QualifiedArrayNamesItsQualifierOnce) {
  auto r = Resolve("g_vrows");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type_name, "volatile struct inner[4]");
  auto e = Resolve("g_vrows[3]");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->type_name, "volatile struct inner");
}

TEST_F(SymbolsFileTest, ReadCodeComesFromTheFile) {
  auto f = symbols_->FindFunction("IncCounter");
  ASSERT_TRUE(f.has_value());
  std::vector<uint8_t> code(f->size);
  ASSERT_TRUE(symbols_->ReadCode(f->start, std::span<uint8_t>(code)).ok());
  // IncCounter ends with `ret` (0xc3).
  EXPECT_EQ(code.back(), 0xc3);
  std::vector<uint8_t> none(4);
  EXPECT_FALSE(symbols_->ReadCode(RemoteAddr{0x10}, std::span<uint8_t>(none)).ok());
}

// ---------------------------------------------------------------------------------------
// A live process: run-time (PIE-biased) addresses, and '->' through its real memory.

std::map<std::string, uint64_t> ParseAddrs(const std::string& out) {
  std::map<std::string, uint64_t> addrs;
  std::istringstream in(out);
  std::string word;
  while (in >> word) {
    if (word != "addr") {
      continue;
    }
    std::string name;
    std::string hex;
    in >> name >> hex;
    addrs[name] = std::stoull(hex, nullptr, 16);
  }
  return addrs;
}

MemoryReader ProcessReader(pid_t pid) {
  return [pid](RemoteAddr addr, std::span<uint8_t> out) {
    iovec local{out.data(), out.size()};
    iovec remote{reinterpret_cast<void*>(addr.value), out.size()};  // NOLINT
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n != static_cast<ssize_t>(out.size())) {
      const int err = errno;
      return absl::ErrnoToStatus(err, "process_vm_readv");
    }
    return absl::OkStatus();
  };
}

TEST(SymbolsProcessTest, ResolvesRunTimeAddresses) {
  auto child = kwatch::testing::Spawned::Start({LayoutsPath(), "--wait"});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->WaitForStdout("done\n").ok()) << (*child)->out();
  const auto addrs = ParseAddrs((*child)->out());
  ASSERT_EQ(addrs.size(), 9u) << (*child)->out();

  auto symbols = Symbols::ForProcess((*child)->pid());
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  const MemoryReader read = ProcessReader((*child)->pid());
  auto resolve = [&](const std::string& text) -> absl::StatusOr<ResolvedExpr> {
    auto e = ParseExpr(text);
    if (!e.ok()) {
      return e.status();
    }
    return (*symbols)->Resolve(*e, read);
  };

  for (const char* name : {"g_stats", "g_stats.hits", "g_cache", "g_cache.lines[2].data[1]",
                           "g_cache2.nlines", "g_lines[2].owner", "calls", "s_file_static"}) {
    auto r = resolve(name);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_EQ(r->addr.value, addrs.at(name)) << name;
    EXPECT_EQ(r->module, LayoutsPath()) << name;
  }

  // '->' reads the real pointer: cache == &g_cache, g_cache.next == &g_cache2.
  auto arrow = resolve("cache->lines[2].data[1]");
  ASSERT_TRUE(arrow.ok()) << arrow.status();
  EXPECT_EQ(arrow->addr.value, addrs.at("g_cache.lines[2].data[1]"));
  EXPECT_EQ(arrow->display, "cache->lines[2].data[1]");
  auto chain = resolve("cache->next->nlines");
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->addr.value, addrs.at("g_cache2.nlines"));
  auto null = resolve("g_cache2.next->nlines");
  ASSERT_FALSE(null.ok());
  EXPECT_EQ(null.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(null.status().message()), StartsWith("'g_cache2.next' is NULL"));

  // The file's link-time addresses differ from the run-time ones by the load bias.
  auto file = Symbols::ForFile(LayoutsPath());
  ASSERT_TRUE(file.ok()) << file.status();
  auto e = ParseExpr("g_stats");
  ASSERT_TRUE(e.ok());
  auto link = (*file)->Resolve(*e, NoReader());
  ASSERT_TRUE(link.ok()) << link.status();
  const uint64_t bias = addrs.at("g_stats") - link->addr.value;
  EXPECT_EQ(bias % 4096, 0u);
  EXPECT_NE(bias, 0u);

  // Code: function and line of a run-time address.
  const RemoteAddr store{addrs.at("StoreHits")};
  auto fn = (*symbols)->FunctionAt(store);
  ASSERT_TRUE(fn.has_value());
  EXPECT_EQ(fn->name, "StoreHits");
  EXPECT_EQ(fn->start, store);
  auto lines = (*symbols)->AddressesOfLine("layouts.c", MarkerLine());
  ASSERT_TRUE(lines.ok()) << lines.status();
  for (RemoteAddr a : *lines) {
    EXPECT_GE(a, store);
    EXPECT_LT(a - store, fn->size);
  }
  // Shared libraries are modules too: libc's `environ` is data.
  auto environ_var = resolve("environ");
  EXPECT_TRUE(environ_var.ok()) << environ_var.status();

  // The symbols outlive the process.
  child->reset();
  auto after = resolve("g_stats.hits");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->addr.value, addrs.at("g_stats.hits"));
  EXPECT_TRUE((*symbols)->FunctionAt(store).has_value());
  EXPECT_TRUE((*symbols)->LineAt(store).has_value());
  std::vector<uint8_t> code(fn->size);
  EXPECT_TRUE((*symbols)->ReadCode(store, std::span<uint8_t>(code)).ok());
}

// tests/targets/opaque: main.c holds `struct handle* g_handle` with `struct handle` only
// declared; handle.c defines it as {int id; long counter; char name[16];}.
TEST(SymbolsOpaqueTest, APointerToATypeDefinedInAnotherUnitIsFollowed) {
  auto symbols = Symbols::ForFile(kwatch::testing::TargetPath("opaque"));
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  auto resolve = [&](const std::string& text, const MemoryReader& read) {
    auto e = ParseExpr(text);
    EXPECT_TRUE(e.ok()) << e.status();
    return (*symbols)->Resolve(*e, read);
  };
  auto ptr = resolve("g_handle", NoReader());
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  EXPECT_EQ(ptr->type_name, "struct handle *");
  const uint64_t target = 0x7f0000002000;

  auto counter = resolve("g_handle->counter", PointerAt(ptr->addr.value, target));
  ASSERT_TRUE(counter.ok()) << counter.status();
  EXPECT_EQ(counter->addr.value, target + 8);
  EXPECT_EQ(counter->length, 8u);
  EXPECT_EQ(counter->type_name, "long");

  auto whole = resolve("*g_handle", PointerAt(ptr->addr.value, target));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->type_name, "struct handle");
  EXPECT_EQ(whole->length, 32u);
  std::vector<std::string> paths;
  ASSERT_TRUE(whole->layout.has_value());
  for (const auto& f : whole->layout->fields) {
    paths.push_back(f.path);
  }
  EXPECT_THAT(paths, ::testing::IsSupersetOf({".id", ".counter", ".name"}));

  auto missing = resolve("g_handle->count", PointerAt(ptr->addr.value, target));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("struct handle has no member 'count'; did you mean 'counter'?"));
}

// Both units of tests/targets/opaque define `static volatile long bumps`, and both have a
// function static `calls` (main.c's tick, handle.c's handle_count).
TEST(SymbolsOpaqueTest, StaticsOfOneNameAreNamedByFileOrFunction) {
  auto symbols = Symbols::ForFile(kwatch::testing::TargetPath("opaque"));
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  auto resolve = [&](const std::string& text) {
    auto e = ParseExpr(text);
    EXPECT_TRUE(e.ok()) << e.status();
    return (*symbols)->Resolve(*e, NoReader());
  };
  auto ambiguous = resolve("bumps");
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_EQ(ambiguous.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string dir = std::string(KWATCH_SOURCE_DIR) + "/tests/targets/opaque/";
  EXPECT_EQ(ambiguous.status().message(),
            absl::StrCat("'bumps' is ambiguous: 2 statics of that name in opaque: '", dir,
                         "handle.c'::bumps, '", dir, "main.c'::bumps; write one of them"));

  auto in_handle = resolve("'handle.c'::bumps");
  ASSERT_TRUE(in_handle.ok()) << in_handle.status();
  auto in_main = resolve("'opaque/main.c'::bumps");
  ASSERT_TRUE(in_main.ok()) << in_main.status();
  EXPECT_NE(in_handle->addr, in_main->addr);
  EXPECT_EQ(in_handle->display, "'handle.c'::bumps");
  EXPECT_EQ(in_handle->type_name, "volatile long");
  EXPECT_EQ(in_handle->length, 8u);

  auto wrong_file = resolve("'thread.c'::bumps");
  ASSERT_FALSE(wrong_file.ok());
  EXPECT_EQ(wrong_file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(wrong_file.status().message()),
              StartsWith("no variable 'bumps' in source file 'thread.c'; 'bumps' is defined in "));
  // A tail must end at a '/': 'ain.c' is not main.c.
  EXPECT_FALSE(resolve("'ain.c'::bumps").ok());

  auto calls = resolve("calls");
  ASSERT_FALSE(calls.ok());
  EXPECT_THAT(std::string(calls.status().message()),
              HasSubstr("handle.c'::handle_count::calls, '"));
  EXPECT_THAT(std::string(calls.status().message()), HasSubstr("main.c'::tick::calls"));
  auto tick_calls = resolve("tick::calls");
  ASSERT_TRUE(tick_calls.ok()) << tick_calls.status();
  auto count_calls = resolve("'handle.c'::handle_count::calls");
  ASSERT_TRUE(count_calls.ok()) << count_calls.status();
  EXPECT_NE(tick_calls->addr, count_calls->addr);
}

// ---------------------------------------------------------------------------------------
// tests/targets/casts: casts of addresses to the target's types, and the statics GCC renames.

// Copies of casts.c's types (the ABI fixes their layout).
struct Point {
  int x;
  int y;
};
struct Record {
  long id;
  Point arr[4];
  unsigned flags;
  char name[8];
};

struct CastsTarget {
  static std::string Path() { return kwatch::testing::TargetPath("casts"); }
};
class SymbolsCastTest : public SymbolsOf<CastsTarget> {
 protected:
  static constexpr uint64_t kRecord = 0x7f0000001000;
};

TEST_F(SymbolsCastTest, AMemberThroughACastOfAnAddress) {
  auto r = Resolve("((struct record *)0x7f0000001000)->arr[2].x");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->addr.value, kRecord + offsetof(Record, arr) + 2 * sizeof(Point));
  EXPECT_EQ(r->length, sizeof(int));
  EXPECT_EQ(r->type_name, "int");
  EXPECT_EQ(r->display, "((struct record *)0x7f0000001000)->arr[2].x");
  EXPECT_EQ(r->module, "");

  // A typedef, a pointer typedef, and the type's name without 'struct' (C++ style).
  auto typedef_cast = Resolve("((record_t *)0x7f0000001000)->flags");
  ASSERT_TRUE(typedef_cast.ok()) << typedef_cast.status();
  EXPECT_EQ(typedef_cast->addr.value, kRecord + offsetof(Record, flags));
  EXPECT_EQ(typedef_cast->type_name, "unsigned int");
  auto pointer_typedef = Resolve("((record_ptr) 0x7f0000001000)->name[3]");
  ASSERT_TRUE(pointer_typedef.ok()) << pointer_typedef.status();
  EXPECT_EQ(pointer_typedef->addr.value, kRecord + offsetof(Record, name) + 3);
  EXPECT_EQ(pointer_typedef->display, "((record_ptr)0x7f0000001000)->name[3]");
  auto no_keyword = Resolve("((record *)0x7f0000001000)->id");
  ASSERT_TRUE(no_keyword.ok()) << no_keyword.status();
  EXPECT_EQ(no_keyword->addr.value, kRecord);
  // The i-th record from the address, as in C.
  auto second = Resolve("((const struct record *)0x7f0000001000)[1].id");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->addr.value, kRecord + sizeof(Record));
  EXPECT_EQ(second->display, "((struct record *)0x7f0000001000)[1].id");
}

// `*(T *)0xADDR`, and `(T *)0xADDR` alone (kwatch watches objects: the T there) give the
// watch the type's length and its fields.
TEST_F(SymbolsCastTest, TheWholeObjectAtAnAddress) {
  for (const char* text : {"*(struct record *)0x7f0000001000", "(struct record *)0x7f0000001000",
                           "(*(struct record *)0x7f0000001000)"}) {
    auto r = Resolve(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status();
    EXPECT_EQ(r->addr.value, kRecord) << text;
    EXPECT_EQ(r->length, sizeof(Record)) << text;
    EXPECT_EQ(r->type_name, "struct record") << text;
    EXPECT_EQ(r->display, "*(struct record *)0x7f0000001000") << text;
    ASSERT_TRUE(r->layout.has_value());
    std::map<std::string, uint64_t> offsets;
    for (const FieldLayout& f : r->layout->fields) {
      offsets[f.path] = f.offset;
    }
    EXPECT_EQ(offsets.at(".id"), offsetof(Record, id));
    EXPECT_EQ(offsets.at(".arr[2].x"), offsetof(Record, arr) + 2 * sizeof(Point));
    EXPECT_EQ(offsets.at(".flags"), offsetof(Record, flags));
  }
  struct Case {
    const char* text;
    const char* type;
    uint64_t length;
  };
  const Case scalars[] = {
      {"(long *)0x1000", "long", 8},
      {"(unsigned long int *)0x1000", "unsigned long", 8},
      {"(int *)0x1000", "int", 4},
      {"(char *)0x1000", "char", 1},
      {"(union slot *)0x1000", "union slot", 8},
      {"(enum color *)0x1000", "enum color", 4},
      {"(struct point *)0x1000", "struct point", 8},
  };
  for (const Case& c : scalars) {
    auto r = Resolve(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status();
    EXPECT_EQ(r->addr.value, 0x1000u) << c.text;
    EXPECT_EQ(r->type_name, c.type) << c.text;
    EXPECT_EQ(r->length, c.length) << c.text;
  }
  auto as_double = Resolve("((union slot *)0x1000)->as_double");
  ASSERT_TRUE(as_double.ok()) << as_double.status();
  EXPECT_EQ(as_double->type_name, "double");
}

// `(struct record **)0xADDR`: the object there is a pointer, followed through the memory.
TEST_F(SymbolsCastTest, PointersToPointers) {
  auto ptr = Resolve("(struct record **)0x2000");
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  EXPECT_EQ(ptr->type_name, "struct record *");
  EXPECT_EQ(ptr->length, 8u);
  EXPECT_EQ(ptr->display, "*(struct record **)0x2000");
  auto next = Resolve("((struct record **)0x2000)[1]");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->addr.value, 0x2008u);
  auto id = Resolve("(*(struct record **)0x2000)->id", PointerAt(0x2000, kRecord + 64));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->addr.value, kRecord + 64);
  EXPECT_EQ(id->display, "(*(struct record **)0x2000)->id");
  auto whole = Resolve("**(struct record **)0x2000", PointerAt(0x2000, kRecord));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->type_name, "struct record");
  EXPECT_EQ(whole->addr.value, kRecord);
  auto null = Resolve("(*(struct record **)0x2000)->id", PointerAt(0x2000, 0));
  ASSERT_FALSE(null.ok());
  EXPECT_EQ(null.status().message(),
            "'*(struct record **)0x2000' is NULL: there is nothing to watch behind it yet");
}

// Each cast mistake is shown with a caret, as the parser's are.
TEST_F(SymbolsCastTest, CastErrorsPointAtTheirColumn) {
  auto unknown = Resolve("((struct recrd *)0x10)->id");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(),
            "no type 'struct recrd' in the debug info of casts (did you mean 'struct record'?) "
            "at column 3\n"
            "  ((struct recrd *)0x10)->id\n"
            "    ^");
  auto wrong_tag = Resolve("((union record *)0x10)->id");
  ASSERT_FALSE(wrong_tag.ok());
  EXPECT_THAT(std::string(wrong_tag.status().message()),
              StartsWith("no type 'union record' in the debug info of casts (did you mean "
                         "'struct record'"));
  auto typo = Resolve("(recod_t *)0x10");
  ASSERT_FALSE(typo.ok());
  EXPECT_THAT(std::string(typo.status().message()), HasSubstr("did you mean 'record_t'"));

  auto arrow = Resolve("((struct record)0x10)->id");
  ASSERT_FALSE(arrow.ok());
  EXPECT_EQ(arrow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arrow.status().message(),
            "'->' needs a pointer, and (struct record)0x10 is struct record: cast to a pointer, "
            "((struct record *)0x10)->id at column 22\n"
            "  ((struct record)0x10)->id\n"
            "                       ^");
  auto not_pointer = Resolve("(struct record)0x10");
  ASSERT_FALSE(not_pointer.ok());
  EXPECT_EQ(not_pointer.status().message(),
            "an address casts to a pointer, and struct record is not one: write (struct record "
            "*)0x10 for the struct record at 0x10 at column 1\n"
            "  (struct record)0x10\n"
            "  ^");
  auto void_cast = Resolve("(void *)0x10");
  ASSERT_FALSE(void_cast.ok());
  EXPECT_THAT(std::string(void_cast.status().message()),
              StartsWith("void has no size or members: cast the address to a pointer to the "
                         "object's type at column 2\n"));

  auto dot = Resolve("((struct record *)0x10).id");
  ASSERT_FALSE(dot.ok());
  EXPECT_EQ(dot.status().message(),
            "'(struct record *)0x10' is a pointer (struct record *): use '((struct record "
            "*)0x10)->id'");
  auto member = Resolve("((struct record *)0x10)->nme");
  ASSERT_FALSE(member.ok());
  EXPECT_THAT(std::string(member.status().message()),
              StartsWith("struct record has no member 'nme'; did you mean 'name'?"));
  auto scalar = Resolve("((int *)0x10)->x");
  ASSERT_FALSE(scalar.ok());
  EXPECT_EQ(scalar.status().message(),
            "'*((int *)0x10)' is int, not a struct or union: it has no member 'x'");
}

// casts.c's setup() and teardown() each have a `static int initialized`: GCC names them
// initialized.0 and initialized.1 in the symbol table (nm, perf, gdb's `info variables`).
TEST_F(SymbolsCastTest, StaticsAsTheSymbolTableNamesThem) {
  auto setup = Resolve("setup::initialized");
  ASSERT_TRUE(setup.ok()) << setup.status();
  auto teardown = Resolve("teardown::initialized");
  ASSERT_TRUE(teardown.ok()) << teardown.status();
  ASSERT_NE(setup->addr, teardown->addr);
  std::map<uint64_t, std::string> by_addr;
  for (const char* name : {"initialized.0", "initialized.1"}) {
    auto r = Resolve(name);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_EQ(r->display, name);
    EXPECT_EQ(r->type_name, "volatile int") << name;  // from the DWARF variable there
    EXPECT_EQ(r->length, 4u) << name;
    by_addr[r->addr.value] = name;
    // The same, in the file's scope and quoted as gdb quotes symbols.
    auto scoped = Resolve(absl::StrCat("'casts.c'::", name));
    ASSERT_TRUE(scoped.ok()) << scoped.status();
    EXPECT_EQ(scoped->addr, r->addr);
    auto quoted = Resolve(absl::StrCat("'", name, "'"));
    ASSERT_TRUE(quoted.ok()) << quoted.status();
    EXPECT_EQ(quoted->addr, r->addr);
  }
  ASSERT_EQ(by_addr.size(), 2u);
  ASSERT_TRUE(by_addr.contains(setup->addr.value));
  ASSERT_TRUE(by_addr.contains(teardown->addr.value));

  // The plain name is ambiguous; the message gives both spellings of each.
  auto plain = Resolve("initialized");
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string file = std::string(KWATCH_SOURCE_DIR) + "/tests/targets/casts.c";
  EXPECT_EQ(plain.status().message(),
            absl::StrCat("'initialized' is ambiguous: 2 statics of that name in casts: '", file,
                         "'::setup::initialized (symbol ", by_addr[setup->addr.value], "), '", file,
                         "'::teardown::initialized (symbol ", by_addr[teardown->addr.value],
                         "); write one of them"));
  auto elsewhere = Resolve("'main.c'::initialized.0");
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_EQ(elsewhere.status().message(),
            absl::StrCat("no variable 'initialized.0' in source file 'main.c'; 'initialized.0' is "
                         "defined in ",
                         file));
  auto missing = Resolve("initialized.7");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("did you mean 'initialized.0'"));
}

// tests/targets/opaque's two units both have a function static `calls`, and GCC numbers
// each unit's from 0: `calls.0` names two objects.
TEST(SymbolsOpaqueTest, ARenamedStaticInTwoUnitsIsNamedByItsFile) {
  auto symbols = Symbols::ForFile(kwatch::testing::TargetPath("opaque"));
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  auto resolve = [&](const std::string& text) {
    auto e = ParseExpr(text);
    EXPECT_TRUE(e.ok()) << e.status();
    return (*symbols)->Resolve(*e, NoReader());
  };
  auto both = resolve("calls.0");
  ASSERT_FALSE(both.ok());
  const std::string dir = std::string(KWATCH_SOURCE_DIR) + "/tests/targets/opaque/";
  EXPECT_EQ(both.status().message(),
            absl::StrCat("'calls.0' is ambiguous: 2 statics of that name in opaque: '", dir,
                         "handle.c'::calls.0, '", dir, "main.c'::calls.0; write one of them"));
  auto in_main = resolve("'main.c'::calls.0");
  ASSERT_TRUE(in_main.ok()) << in_main.status();
  auto tick = resolve("tick::calls");
  ASSERT_TRUE(tick.ok()) << tick.status();
  EXPECT_EQ(in_main->addr, tick->addr);
  EXPECT_EQ(in_main->type_name, "volatile long");
}

// A live process: the record's heap address, as the program prints it, and as a pointer
// variable holds it.
TEST(SymbolsProcessTest, ACastOfAHeapAddress) {
  auto child = kwatch::testing::Spawned::Start({kwatch::testing::TargetPath("casts"), "--wait"});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->WaitForStdout("ready").ok()) << (*child)->out();
  std::istringstream out((*child)->out());
  std::string word;
  std::string record;
  out >> word >> record;
  ASSERT_EQ(word, "record") << (*child)->out();
  auto symbols = Symbols::ForProcess((*child)->pid());
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  const MemoryReader read = ProcessReader((*child)->pid());
  auto resolve = [&](const std::string& text) {
    auto e = ParseExpr(text);
    EXPECT_TRUE(e.ok()) << e.status();
    return (*symbols)->Resolve(*e, read);
  };
  const uint64_t rec = std::stoull(record, nullptr, 16);
  auto cast = resolve(absl::StrCat("((struct record *)", record, ")->arr[2].x"));
  ASSERT_TRUE(cast.ok()) << cast.status();
  EXPECT_EQ(cast->addr.value, rec + offsetof(Record, arr) + 2 * sizeof(Point));
  EXPECT_EQ(cast->display, absl::StrCat("((struct record *)", record, ")->arr[2].x"));
  auto through_variable = resolve("g_heap->arr[2].x");
  ASSERT_TRUE(through_variable.ok()) << through_variable.status();
  EXPECT_EQ(through_variable->addr, cast->addr);
  // The pointer variable's own address, cast: the pointer is read from the process.
  auto heap = resolve("g_heap");
  ASSERT_TRUE(heap.ok()) << heap.status();
  auto through_pointer =
      resolve(absl::StrFormat("(*(record_ptr *)0x%x)->arr[2].x", heap->addr.value));
  ASSERT_TRUE(through_pointer.ok()) << through_pointer.status();
  EXPECT_EQ(through_pointer->addr, cast->addr);
}

// ---------------------------------------------------------------------------------------
// tests/targets/templates: static data members of class templates (C++).

struct TemplatesTarget {
  static std::string Path() { return kwatch::testing::TargetPath("templates"); }
};
class SymbolsTemplateTest : public SymbolsOf<TemplatesTarget> {};

// Each name as gdb spells it resolves to the address of the ELF symbol the compiler mangled
// for it (a route that knows nothing of template names).
TEST_F(SymbolsTemplateTest, StaticMembersOfTemplateInstances) {
  struct Case {
    const char* text;
    const char* mangled;
    uint64_t offset;
    const char* type;
  };
  const Case cases[] = {
      {"Box<int>::value", "_ZN3BoxIiE5valueE", 0, "int"},
      {"ns::Box<long>::value", "_ZN2ns3BoxIlE5valueE", 0, "long"},
      {"ns::Box<long int>::value", "_ZN2ns3BoxIlE5valueE", 0, "long"},
      {"Box<unsigned long>::value", "_ZN3BoxImE5valueE", 0, "unsigned long"},
      {"Box<long unsigned int>::value", "_ZN3BoxImE5valueE", 0, "unsigned long"},
      {"Box<int>::inst", "_ZN3BoxIiE4instE", 0, "Pair"},
      {"Box<int>::inst.second", "_ZN3BoxIiE4instE", 8, "long"},
      {"Arr<int, 2>::data[1]", "_ZN3ArrIiLi2EE4dataE", 4, "int"},
      {"Arr<int,2>::data[1]", "_ZN3ArrIiLi2EE4dataE", 4, "int"},
      {"Box < int > :: value", "_ZN3BoxIiE5valueE", 0, "int"},
  };
  for (const Case& c : cases) {
    auto r = Resolve(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status();
    auto elf = Resolve(c.mangled);
    ASSERT_TRUE(elf.ok()) << c.mangled << ": " << elf.status();
    EXPECT_EQ(r->addr.value, elf->addr.value + c.offset) << c.text;
    EXPECT_EQ(r->type_name, c.type) << c.text;
  }
  EXPECT_EQ(Resolve("Box<int>::inst.second")->display, "Box<int>::inst.second");
  EXPECT_EQ(Resolve("Arr<int,2>::data[1]")->display, "Arr<int, 2>::data[1]");
  // A unique tail names it, as for other qualified C++ names.
  auto tail = Resolve("Box<long>::value");
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->addr, Resolve("ns::Box<long>::value")->addr);

  auto unknown = Resolve("Box<int>::valu");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()),
              StartsWith("no variable 'Box<int>::valu' in templates; did you mean "
                         "'Box<int>::value'"));
  auto no_instance = Resolve("Box<short>::value");
  ASSERT_FALSE(no_instance.ok());
  EXPECT_THAT(std::string(no_instance.status().message()),
              StartsWith("no variable 'Box<short>::value' in templates"));
  auto ambiguous = Resolve("value");
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_EQ(ambiguous.status().message(),
            "'value' is ambiguous: it could be Box<int>::value, Box<unsigned long>::value, "
            "ns::Box<long>::value; give the full name");
}

TEST_F(SymbolsTemplateTest, CastsToCxxTypes) {
  auto pair = Resolve("((Pair *)0x1000)->second");
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->addr.value, 0x1008u);
  EXPECT_EQ(pair->type_name, "long");
  auto node = Resolve("((ns::Node *)0x1000)->next");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->addr.value, 0x1008u);
  EXPECT_EQ(node->type_name, "Node *");  // kwatch names C++ types without their namespace
  auto box = Resolve("(struct Box<unsigned long> *)0x1000");
  ASSERT_TRUE(box.ok()) << box.status();
  EXPECT_EQ(box->type_name, "Box<long unsigned int>");
  EXPECT_EQ(box->length, 1u);  // only static members
  auto unknown = Resolve("((ns::Nod *)0x1000)->next");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()),
              StartsWith("no type 'ns::Nod' in the debug info of templates (did you mean "
                         "'ns::Node'?) at column 3\n"));
}

TEST(SymbolsProcessTest, NoSuchProcess) {
  auto s = Symbols::ForProcess(0x3ffffff0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("/proc/1073741808/maps"));
}

}  // namespace
}  // namespace kwatch::core::symbols
