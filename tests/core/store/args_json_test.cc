#include "core/store/args_json.h"

#include <string>

#include <gtest/gtest.h>

namespace kwatch::core::store {
namespace {

TEST(ArgsJsonTest, EncodesInOrderWithEscapes) {
  const ProbeArgs args = {{"len", "42"}, {"s", "a\"b\\c\n\t\x01"}, {"", ""}};
  EXPECT_EQ(EncodeArgsJson(args), R"({"len":"42","s":"a\"b\\c\n\t\u0001","":""})");
  EXPECT_EQ(EncodeArgsJson({}), "{}");
}

TEST(ArgsJsonTest, RoundTripsAnyBytes) {
  std::string all;
  for (int c = 0; c < 256; ++c) {
    all.push_back(static_cast<char>(c));
  }
  const ProbeArgs args = {{"all", all}, {"utf8", "caf\xc3\xa9"}, {"bad", "\xff\xfe"}, {"dup", "1"},
                          {"dup", "2"}, {"quote\"name", "\\"},   {"empty", ""}};
  auto back = DecodeArgsJson(EncodeArgsJson(args));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, args);
}

TEST(ArgsJsonTest, DecodesStandardJsonEscapesAndSpace) {
  auto back = DecodeArgsJson(" { \"a\" : \"\\u00e9\\ud83d\\ude00\\/\\b\\f\\r\" , \"b\":\"x\" } ");
  ASSERT_TRUE(back.ok()) << back.status();
  const ProbeArgs want = {{"a", "\xc3\xa9\xf0\x9f\x98\x80/\b\f\r"}, {"b", "x"}};
  EXPECT_EQ(*back, want);
}

TEST(ArgsJsonTest, RejectsWhatIsNotAFlatObjectOfStrings) {
  for (const char* bad :
       {"", "[]", "{", "{\"a\":1}", "{\"a\":\"b\"", "{\"a\":\"b\"} x", "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\q\"}", "{\"a\" \"b\"}", "{,}", "{\"a\":\"b\",}", "{\"a\":\"b\\"}) {
    auto r = DecodeArgsJson(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace kwatch::core::store
