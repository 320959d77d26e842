#include "watch/gdb/packet.h"

#include <csignal>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "watch/gdb/amd64_regs.h"
#include "watch/gdb/signals.h"

namespace kwatch::watch::gdb {
namespace {

using ::testing::HasSubstr;

std::vector<Frame> Decode(const std::vector<std::string>& chunks) {
  PacketDecoder d;
  std::vector<Frame> out;
  for (const std::string& c : chunks) {
    d.Feed(c, out);
  }
  return out;
}

TEST(GdbPacket, EncodeAddsTheChecksum) {
  EXPECT_EQ(EncodePacket("OK"), "$OK#9a");
  EXPECT_EQ(EncodePacket(""), "$#00");
  EXPECT_EQ(EncodePacket("qSupported"), "$qSupported#37");
}

TEST(GdbPacket, EncodeEscapesWhatFramingUsesAndDecodesBack) {
  const std::string payload = std::string("a$b#c}d*e") + '\x03' + std::string(1, '\0');
  const std::string wire = EncodePacket(payload);
  EXPECT_EQ(wire.substr(0, 14),
            "$a}\x04"
            "b}\x03"
            "c}]d}\x0a"
            "e");
  const std::vector<Frame> f = Decode({wire});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, Frame::Kind::kPacket);
  EXPECT_EQ(f[0].payload, payload);
}

TEST(GdbPacket, DecoderSplitsAcksInterruptsAndPacketsAcrossFeeds) {
  const std::vector<Frame> f = Decode({"+$g#6", "7-\x03$m10,4#", "2e", "junk+"});
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[0].kind, Frame::Kind::kAck);
  EXPECT_EQ(f[1].kind, Frame::Kind::kPacket);
  EXPECT_EQ(f[1].payload, "g");
  EXPECT_EQ(f[2].kind, Frame::Kind::kNack);
  EXPECT_EQ(f[3].kind, Frame::Kind::kInterrupt);
  EXPECT_EQ(f[4].kind, Frame::Kind::kPacket);
  EXPECT_EQ(f[4].payload, "m10,4");
  EXPECT_EQ(f[5].kind, Frame::Kind::kAck);
}

TEST(GdbPacket, DecoderFlagsABadChecksum) {
  const std::vector<Frame> f = Decode({"$g#68", "$OK#9A"});
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].kind, Frame::Kind::kBadChecksum);
  EXPECT_EQ(f[1].kind, Frame::Kind::kPacket);  // upper-case digits are fine
  EXPECT_EQ(f[1].payload, "OK");
}

TEST(GdbPacket, DecoderExpandsRunLength) {
  // '0* ' is "0000" (' ' is 32: 3 more), "x*!" is "x" and 4 more.
  std::string raw = "0* x*!";
  unsigned sum = 0;
  for (const char c : raw) {
    sum += static_cast<unsigned char>(c);
  }
  char cs[3];
  std::snprintf(cs, sizeof(cs), "%02x", sum & 0xff);
  const std::vector<Frame> f = Decode({"$" + raw + "#" + cs});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, Frame::Kind::kPacket);
  EXPECT_EQ(f[0].payload, "0000xxxxx");
}

TEST(GdbPacket, MalformedPacketsAreFlaggedNotDecoded) {
  EXPECT_FALSE(UnescapePayload("*#").ok());      // nothing to repeat
  EXPECT_FALSE(UnescapePayload("ab}").ok());     // escape at the end
  EXPECT_FALSE(UnescapePayload("a*\x01").ok());  // count out of range
  EXPECT_TRUE(UnescapePayload("a}]").ok());
  const std::vector<Frame> f = Decode({"$*a#8b", "$ab#zz", "$abc$OK#9a"});
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].kind, Frame::Kind::kMalformed);  // '*' with nothing before it
  EXPECT_EQ(f[1].kind, Frame::Kind::kMalformed);  // checksum digits not hex
  EXPECT_EQ(f[2].kind, Frame::Kind::kMalformed);  // cut short by a new '$'
  EXPECT_EQ(f[3].kind, Frame::Kind::kPacket);
  EXPECT_EQ(f[3].payload, "OK");
}

TEST(GdbPacket, OversizedPacketIsMalformed) {
  PacketDecoder d(8);
  std::vector<Frame> f;
  d.Feed("$0123456789#00$OK#9a", f);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].kind, Frame::Kind::kMalformed);
  EXPECT_EQ(f[1].payload, "OK");
}

TEST(GdbPacket, HexHelpers) {
  EXPECT_EQ(ToHex(std::string("\x01\xab", 2)), "01ab");
  ASSERT_TRUE(FromHex("01Ab").ok());
  EXPECT_EQ(*FromHex("01Ab"), (std::vector<uint8_t>{0x01, 0xab}));
  EXPECT_FALSE(FromHex("abc").ok());
  EXPECT_FALSE(FromHex("zz").ok());
  EXPECT_EQ(*ParseHexNumber("7fffffffe000"), 0x7fffffffe000u);
  EXPECT_FALSE(ParseHexNumber("").ok());
  EXPECT_FALSE(ParseHexNumber("12345678123456789").ok());  // 17 digits
  EXPECT_FALSE(ParseHexNumber("12g").ok());
  EXPECT_EQ(HexNumber(0), "0");
  EXPECT_EQ(HexNumber(0x1f), "1f");
}

TEST(GdbRegisters, TargetDescriptionNamesWhatGdbNeedsForAmd64Linux) {
  const std::string& xml = Amd64TargetXml();
  EXPECT_THAT(xml, HasSubstr("<architecture>i386:x86-64</architecture>"));
  for (const char* f : {"org.gnu.gdb.i386.core", "org.gnu.gdb.i386.sse", "org.gnu.gdb.i386.linux",
                        "org.gnu.gdb.i386.segments"}) {
    EXPECT_THAT(xml, HasSubstr(f));
  }
  for (const char* r : {"\"rip\"", "\"eflags\"", "\"st7\"", "\"fop\"", "\"xmm15\"", "\"mxcsr\"",
                        "\"orig_rax\"", "\"fs_base\"", "\"gs_base\""}) {
    EXPECT_THAT(xml, HasSubstr(r));
  }
}

TEST(GdbRegisters, GAndPBytesFollowTheDescriptionsOrder) {
  ThreadRegisters r;
  r.gp.rax = 0x1122334455667788;
  r.gp.rip = 0x401000;
  r.gp.eflags = 0x246;
  r.gp.orig_rax = static_cast<unsigned long long>(-1);  // NOLINT(google-runtime-int)
  r.gp.fs_base = 0x7f0000001000;
  r.gp.gs_base = 0;
  std::vector<uint8_t> all = r.All();
  EXPECT_EQ(all.size(), 560u);  // 16*8 + 8 + 4 + 6*4 + 8*10 + 8*4 + 16*16 + 4 + 3*8
  EXPECT_EQ(ToHex(*r.Get(0)), "8877665544332211");
  EXPECT_EQ(ToHex(*r.Get(kRipRegister)), "0010400000000000");
  EXPECT_EQ(ToHex(*r.Get(17)), "46020000");
  EXPECT_EQ(ToHex(*r.Get(57)), "ffffffffffffffff");
  EXPECT_EQ(ToHex(*r.Get(58)), "00100000007f0000");
  EXPECT_EQ(ToHex(*r.Get(34)), "ffff0000");  // ftag: every x87 register empty
  EXPECT_FALSE(r.Get(60).ok());
  EXPECT_FALSE(r.Set(0, std::vector<uint8_t>(4)).ok());  // rax has 8 bytes

  ThreadRegisters back;
  ASSERT_TRUE(back.SetAll(all).ok());
  EXPECT_EQ(back.All(), all);
  EXPECT_EQ(back.gp.rip, 0x401000u);
  all.pop_back();
  EXPECT_FALSE(back.SetAll(all).ok());
}

TEST(GdbSignals, GdbNumbersDifferFromLinuxPastTheFirstFew) {
  EXPECT_EQ(ToGdbSignal(SIGTRAP), 5);
  EXPECT_EQ(ToGdbSignal(SIGUSR1), 30);
  EXPECT_EQ(ToGdbSignal(SIGBUS), 10);
  EXPECT_EQ(ToGdbSignal(SIGCHLD), 20);
  for (int sig = 1; sig <= 64; ++sig) {
    if (sig == SIGSTKFLT) {
      EXPECT_EQ(ToGdbSignal(sig), 143);  // gdb has no SIGSTKFLT
      continue;
    }
    EXPECT_EQ(FromGdbSignal(ToGdbSignal(sig)), sig) << sig;
  }
}

}  // namespace
}  // namespace kwatch::watch::gdb
