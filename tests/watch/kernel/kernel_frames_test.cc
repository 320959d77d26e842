// watch/kernel/kernel_frames.h: a kernel event's callchain named for people.
#include "watch/kernel/kernel_frames.h"

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/kernel/kernel_symbols.h"
#include "core/symbols/symbols.h"

// A function of this program for the user frames (C linkage: its symbol is its name).
extern "C" __attribute__((noinline, used)) int KwFramesMarker(int x) {
  return x * 3 + 1;
}

namespace kwatch::watch::kernel {
namespace {

TEST(KernelFramesTest, KernelThenUserFrames) {
  auto ksyms = core::kernel::KernelSymbolResolver::Create({});
  ASSERT_TRUE(ksyms.ok()) << ksyms.status();
  const core::kernel::KernelSymbol* schedule = (*ksyms)->kallsyms().Find("schedule");
  ASSERT_NE(schedule, nullptr);
  auto usyms = core::symbols::Symbols::ForProcess(getpid());
  ASSERT_TRUE(usyms.ok()) << usyms.status();
  const auto marker = reinterpret_cast<uintptr_t>(&KwFramesMarker);
  auto line = (*usyms)->LineAt(core::RemoteAddr{marker + 1});
  ASSERT_TRUE(line.has_value());

  PerfCallchain chain;
  chain.kernel = {schedule->addr + 0x10};
  chain.user = {marker + 1, 0x10};  // the second is in no function
  const std::vector<KernelFrame> frames = KernelFrames(**ksyms, usyms->get(), chain);
  ASSERT_EQ(frames.size(), 3U);
  EXPECT_EQ(frames[0].ip, schedule->addr + 0x10);
  EXPECT_FALSE(frames[0].user);
  EXPECT_EQ(frames[0].site, "schedule+0x10");
  EXPECT_EQ(frames[1].ip, marker + 1);
  EXPECT_TRUE(frames[1].user);
  EXPECT_EQ(frames[1].site,
            absl::StrCat("KwFramesMarker+0x1 (kernel_frames_test.cc:", line->line, ")"));
  EXPECT_EQ(frames[2].site, "0x10");
  EXPECT_TRUE(frames[2].user);

  // Without the process's symbols (kernel watches: anyone's task), user frames are addresses.
  const std::vector<KernelFrame> bare = KernelFrames(**ksyms, nullptr, chain);
  ASSERT_EQ(bare.size(), 3U);
  EXPECT_EQ(bare[0].site, "schedule+0x10");
  EXPECT_EQ(bare[1].site, absl::StrFormat("0x%x", marker + 1));
  EXPECT_EQ(KernelFrames(**ksyms, nullptr, PerfCallchain{}).size(), 0U);
}

}  // namespace
}  // namespace kwatch::watch::kernel
