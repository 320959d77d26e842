// Inputs the fuzz targets of fuzz/ found to crash kwatch, each kept under
// fuzz/regressions/TARGET/ and replayed by fuzz/run.sh; here the fixed behaviour is asserted
// through the same entry points, in the ordinary (unsanitized or ASan) test build.

#include <cstddef>
#include <fstream>
#include <iterator>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/probe/fetch.h"
#include "core/probe/probe_spec.h"
#include "core/probe/probe_target.h"
#include "tests/test_util.h"

namespace kwatch::core {
namespace {

using ::testing::HasSubstr;

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
  const absl::StatusOr<ProbeSpec> spec = ParseProbeSpec(input);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("more than 64 nested dereferences +OFF(...)"));

  const absl::StatusOr<ProbeArgSpec> deepest = ParseProbeArg(Nested(64, "%di") + ":u32");
  ASSERT_TRUE(deepest.ok()) << deepest.status();
  EXPECT_EQ(deepest->kind, ProbeArgSpec::Kind::kRegister);
  EXPECT_EQ(deepest->reg, "di");
  EXPECT_EQ(deepest->derefs.size(), 64U);

  const absl::StatusOr<ProbeArgSpec> too_deep = ParseProbeArg(Nested(65, "%di"));
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
  auto target = ProbeTarget::Open(kwatch::testing::TargetPath("probe_args"));
  ASSERT_TRUE(target.ok()) << target.status();
  const absl::StatusOr<ProbeSpec> spec = ParseProbeSpec(input);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto points = (*target)->Resolve(spec->point);
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 1U);
  const auto args = CompileArgs(**target, points->front(), spec->args);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(args.status().message(),
              HasSubstr("index 9223372036854775807 of 'p' is too large: its elements are 48 "
                        "bytes"));

  // struct item is 48 bytes: INT64_MAX / 48 = 192153584101141162 still fits.
  const auto fits = CompileArgStrings(**target, points->front(), {"p[192153584101141162].id"});
  ASSERT_TRUE(fits.ok()) << fits.status();
  ASSERT_EQ(fits->size(), 1U);
  const auto too_big = CompileArgStrings(**target, points->front(), {"p[192153584101141163].id"});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kwatch::core
