#include "drmgr/debug_regs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kwatch::drmgr {
namespace {

using ::testing::HasSubstr;

TEST(CheckHardwareRange, AcceptsAlignedPowersOfTwo) {
  for (uint64_t len : {1, 2, 4, 8}) {
    EXPECT_TRUE(CheckHardwareRange(core::RemoteAddr{0x1000}, len, DrKind::kWrite).ok()) << len;
    EXPECT_TRUE(CheckHardwareRange(core::RemoteAddr{0x1000 + len}, len, DrKind::kReadWrite).ok());
  }
}

TEST(CheckHardwareRange, RefusesUnalignedAndSaysWhichPiecesWouldWork) {
  const absl::Status s = CheckHardwareRange(core::RemoteAddr{0x100e}, 8, DrKind::kWrite);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not aligned to 8 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("0x100e:2, 0x1010:4, 0x1014:2"));
}

TEST(CheckHardwareRange, RefusesOtherLengths) {
  const absl::Status s = CheckHardwareRange(core::RemoteAddr{0x1000}, 24, DrKind::kWrite);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("x86 watches 1, 2, 4 or 8 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("0x1000:8, 0x1008:8, 0x1010:8"));
  EXPECT_FALSE(CheckHardwareRange(core::RemoteAddr{0x1000}, 3, DrKind::kWrite).ok());
  EXPECT_FALSE(CheckHardwareRange(core::RemoteAddr{0x1000}, 0, DrKind::kWrite).ok());
}

TEST(CheckHardwareRange, ExecuteCoversOneInstructionStart) {
  EXPECT_TRUE(CheckHardwareRange(core::RemoteAddr{0x1003}, 1, DrKind::kExec).ok());
  EXPECT_FALSE(CheckHardwareRange(core::RemoteAddr{0x1000}, 8, DrKind::kExec).ok());
}

TEST(EncodeLen, MatchesTheSdm) {
  EXPECT_EQ(EncodeLen(1), DrLen::k1);
  EXPECT_EQ(EncodeLen(2), DrLen::k2);
  EXPECT_EQ(EncodeLen(4), DrLen::k4);
  EXPECT_EQ(EncodeLen(8), DrLen::k8);
  EXPECT_EQ(static_cast<int>(DrLen::k8), 2);
  EXPECT_EQ(static_cast<int>(DrLen::k4), 3);
  EXPECT_EQ(static_cast<int>(DrKind::kReadWrite), 3);
}

}  // namespace
}  // namespace kwatch::drmgr
