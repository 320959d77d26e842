#include "core/base/printable.h"

#include <string>

#include <gtest/gtest.h>

namespace kwatch::core {
namespace {

TEST(PrintableTest, OrdinaryNamesAreUnchanged) {
  for (const std::string s :
       {"", "g_stats.lines[3].tag", "Box<int>::value", "'thread.c'::initialized",
        "/usr/src/zstd/lib/compress/zstd_compress.c", "a\\b", "swapper/0", "Größe", "名前",
        "emoji \xf0\x9f\x98\x80", "tick i r->len:u32"}) {
    EXPECT_TRUE(IsPrintable(s)) << s;
    EXPECT_EQ(Printable(s), s);
  }
}

TEST(PrintableTest, TerminalControlsAreShownEscaped) {
  // A title-setting OSC sequence, a colour, a cursor move, a bell, a clear screen.
  EXPECT_EQ(Printable("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
  EXPECT_EQ(Printable("hits\x1b[31mRED\x1b[0m"), "hits\\x1b[31mRED\\x1b[0m");
  EXPECT_EQ(Printable("a\rb\nc\td"), "a\\x0db\\x0ac\\x09d");
  EXPECT_EQ(Printable(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(Printable("del\x7f"), "del\\x7f");
  EXPECT_FALSE(IsPrintable("\x1b[2J"));
}

TEST(PrintableTest, C1ControlsAndBidiOverridesAreShownAsCodePoints) {
  // U+009B is CSI for terminals that obey C1 controls; U+202E reverses what follows.
  EXPECT_EQ(Printable("x\xc2\x9b"
                      "31m"),
            "x\\u009b31m");
  EXPECT_EQ(Printable("access\xe2\x80\xaelevel"), "access\\u202elevel");
  EXPECT_EQ(Printable("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");
  EXPECT_EQ(Printable("line\xe2\x80\xa8next"), "line\\u2028next");
}

TEST(PrintableTest, BytesThatAreNotUtf8AreShownAsBytes) {
  EXPECT_EQ(Printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(Printable("cut \xe5\x90"), "cut \\xe5\\x90");            // cut short
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(Printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(Printable("\x80x"), "\\x80x");                           // stray continuation
  EXPECT_EQ(Printable("ok \xc3\xa9 \xc3"), "ok \xc3\xa9 \\xc3");
}

TEST(PrintableTest, OutputIsAlwaysPrintable) {
  // Every single byte and every pair of bytes: the escaped text is printable itself.
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; b += 7) {
      const std::string s = {static_cast<char>(a), static_cast<char>(b)};
      const std::string p = Printable(s);
      EXPECT_TRUE(IsPrintable(p)) << a << " " << b;
    }
  }
}

}  // namespace
}  // namespace kwatch::core
