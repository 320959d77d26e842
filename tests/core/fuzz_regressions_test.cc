// Inputs the fuzz targets of fuzz/ found to crash kwatch, each kept under
// fuzz/regressions/TARGET/ and replayed by fuzz/run.sh; here the fixed behaviour is asserted
// through the same entry points, in the ordinary (unsanitized or ASan) test build.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/probe/fetch.h"
#include "core/probe/probe_spec.h"
#include "core/probe/probe_target.h"
#include "core/store/trace_reader.h"
#include "tests/test_util.h"

namespace kwatch::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::string Nested(size_t depth, const std::string& inner) {
  std::string s;
  for (size_t i = 0; i < depth; ++i) {
    s += "+0(";
  }
  s += inner;
  s.append(depth, ')');
  return s;
}

std::string ReadRegression(const std::string& name) {
  std::ifstream in(std::string(KWATCH_SOURCE_DIR) + "/fuzz/regressions/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// fuzz/regressions/probe_spec/stack-overflow-nested-deref: 20000 nested +0(...) wrappers
// (80 KB, one shell word) made ParseFetch recurse until the stack overflowed: kwatch probe
// died with SIGSEGV. Now at most 64 levels parse; deeper ones are InvalidArgument.
TEST(FuzzRegressions, ProbeSpecDeeplyNestedDereferenceIsAnError) {
  const std::string input = ReadRegression("probe_spec/stack-overflow-nested-deref");
  ASSERT_EQ(input.size(), 9 + 20000 * 4 + 3);
  const absl::StatusOr<probe::ProbeSpec> spec = probe::ParseProbeSpec(input);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("more than 64 nested dereferences +OFF(...)"));

  const absl::StatusOr<probe::ProbeArgSpec> deepest =
      probe::ParseProbeArg(Nested(64, "%di") + ":u32");
  ASSERT_TRUE(deepest.ok()) << deepest.status();
  EXPECT_EQ(deepest->kind, probe::ProbeArgSpec::Kind::kRegister);
  EXPECT_EQ(deepest->reg, "di");
  EXPECT_EQ(deepest->derefs.size(), 64U);

  const absl::StatusOr<probe::ProbeArgSpec> too_deep = probe::ParseProbeArg(Nested(65, "%di"));
  ASSERT_FALSE(too_deep.ok());
  EXPECT_EQ(too_deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_deep.status().message(), HasSubstr("more than 64 nested dereferences"));
}

// fuzz/regressions/probe_spec/ubsan-index-times-element-size: an index times the element
// size overflowed int64_t while compiling the argument (UBSan: signed integer overflow in
// CompileArgs). Now such an index is InvalidArgument; the largest that fits still compiles.
TEST(FuzzRegressions, ProbeArgIndexTooLargeForItsElementsIsAnError) {
  const std::string input = ReadRegression("probe_spec/ubsan-index-times-element-size");
  EXPECT_EQ(input, "sum_item p[9223372036854775807].id");
  auto target = probe::ProbeTarget::Open(kwatch::testing::TargetPath("probe_args"));
  ASSERT_TRUE(target.ok()) << target.status();
  const absl::StatusOr<probe::ProbeSpec> spec = probe::ParseProbeSpec(input);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto points = (*target)->Resolve(spec->point);
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 1U);
  const auto args = probe::CompileArgs(**target, points->front(), spec->args);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(args.status().message(),
              HasSubstr("index 9223372036854775807 of 'p' is too large: its elements are 48 "
                        "bytes"));

  // struct item is 48 bytes: INT64_MAX / 48 = 192153584101141162 still fits.
  const auto fits =
      probe::CompileArgStrings(**target, points->front(), {"p[192153584101141162].id"});
  ASSERT_TRUE(fits.ok()) << fits.status();
  ASSERT_EQ(fits->size(), 1U);
  const auto too_big =
      probe::CompileArgStrings(**target, points->front(), {"p[192153584101141163].id"});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
}

// fuzz/regressions/trace_reader/ubsan-rowid-span-over-int64: a recording marked in time
// order whose events and hits have rowids from INT64_MIN to 100 (events) and to INT64_MAX - 1
// (hits). Seeking to a start time bisected rowids with `lo + (hi - lo) / 2`, and hi - lo
// overflowed int64_t (UBSan: signed integer overflow in FirstRowidAtOrAfter).
TEST(FuzzRegressions, TraceReaderSeeksOverRowidsSpanningMoreThanInt64) {
  const std::string path = ::testing::TempDir() + "/kwatch-fuzz-regression.kwdb";
  {
    const std::string bytes = ReadRegression("trace_reader/ubsan-rowid-span-over-int64");
    ASSERT_EQ(bytes.size(), 7168U);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto reader = store::TraceReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();

  std::vector<uint64_t> all_events;
  ASSERT_TRUE((*reader)
                  ->ForEachEvent({},
                                 [&](const AccessEvent& e) {
                                   all_events.push_back(e.time_ns);
                                   return true;
                                 })
                  .ok());
  EXPECT_THAT(all_events, ElementsAre(5, 2000));

  store::EventFilter from;
  from.from_ns = 1000;
  std::vector<uint64_t> events;
  const absl::Status es = (*reader)->ForEachEvent(from, [&](const AccessEvent& e) {
    events.push_back(e.time_ns);
    EXPECT_EQ(e.ip.value, 4097U);
    return true;
  });
  ASSERT_TRUE(es.ok()) << es;
  EXPECT_THAT(events, ElementsAre(2000));

  store::HitFilter hits_from;
  hits_from.from_ns = 1000;
  std::vector<store::HitRecord> hits;
  const absl::Status hs = (*reader)->ForEachHit(hits_from, [&](const store::HitRecord& h) {
    hits.push_back(h);
    return true;
  });
  ASSERT_TRUE(hs.ok()) << hs;
  ASSERT_EQ(hits.size(), 1U);
  EXPECT_EQ(hits[0].time_ns, 2000U);
  EXPECT_EQ(hits[0].ip.value, 4097U);
  EXPECT_THAT(hits[0].args, ElementsAre(Pair("a", "2")));
  reader->reset();
  std::remove(path.c_str());
}

// fuzz/regressions/elf/timeout-listlines-1600106623: fuzz/corpus/elf/tiny (sum_item declared at
// line 4) with its line table mutated so that it ends at line 1600106623. ListLines built one entry
// per line up to there (1.6 billion: `kwatch probe -L sum_item` ran for minutes and gigabytes, the
// fuzz target timed out). Now a span over 100000 lines is FailedPrecondition.
TEST(FuzzRegressions, ListLinesRefusesALineTableSpanningBillionsOfLines) {
  auto target = probe::ProbeTarget::Open(std::string(KWATCH_SOURCE_DIR) +
                                         "/fuzz/regressions/elf/timeout-listlines-1600106623");
  ASSERT_TRUE(target.ok()) << target.status();
  const absl::StatusOr<probe::ProbePoint> point = probe::ParseProbePoint("sum_item");
  ASSERT_TRUE(point.ok()) << point.status();
  const auto listing = (*target)->ListLines(*point);
  ASSERT_FALSE(listing.ok());
  EXPECT_EQ(listing.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(listing.status().message());
  EXPECT_THAT(message, HasSubstr("'sum_item' spans lines 4 to 1600106623 of "));
  EXPECT_THAT(message, HasSubstr("more than 100000 lines to list"));

  // The seed it came from lists sum_item's lines 4 to 8 (tiny_elf.c, built as fuzz/README.md
  // says).
  auto seed = probe::ProbeTarget::Open(std::string(KWATCH_SOURCE_DIR) + "/fuzz/corpus/elf/tiny");
  ASSERT_TRUE(seed.ok()) << seed.status();
  const auto lines = (*seed)->ListLines(*point);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 1U);
  ASSERT_FALSE(lines->front().lines.empty());
  EXPECT_EQ(lines->front().lines.front().line, 4);
  EXPECT_EQ(lines->front().lines.back().line, 8);
}

// fuzz/regressions/elf/stack-overflow-anonymous-member-cycle: fuzz/corpus/elf/tiny with its
// DWARF mutated so that a struct has an anonymous member of its own type. Looking up a member
// name that is not there searched the anonymous member, which is the struct again, until the
// stack overflowed (FindMember in core/dwarf_types.cc). Now the search is bounded.
TEST(FuzzRegressions, MemberLookupThroughAnonymousMemberCycleEnds) {
  auto target =
      probe::ProbeTarget::Open(std::string(KWATCH_SOURCE_DIR) +
                               "/fuzz/regressions/elf/stack-overflow-anonymous-member-cycle");
  ASSERT_TRUE(target.ok()) << target.status();
  auto points = (*target)->Resolve(probe::ParseProbePoint("sum_item").value());
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 1U);

  const auto len = probe::CompileArgStrings(**target, points->front(), {"p->len"});
  ASSERT_TRUE(len.ok()) << len.status();
  for (const char* arg : {"p->nope", "p->next->id"}) {
    const auto compiled = probe::CompileArgStrings(**target, points->front(), {std::string(arg)});
    ASSERT_FALSE(compiled.ok()) << arg;
    EXPECT_EQ(compiled.status().code(), absl::StatusCode::kInvalidArgument) << arg;
    EXPECT_THAT(std::string(compiled.status().message()), HasSubstr("has no member '")) << arg;
  }
}

}  // namespace
}  // namespace kwatch::core
