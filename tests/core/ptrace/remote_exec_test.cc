// Code run inside a stopped thread (core/ptrace/remote_exec.h), on tests/targets/remote_call:
// the system calls' effects, the thread's registers before and after (exactly), and the
// target's own report.

#include "core/ptrace/remote_exec.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/user.h>

#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "core/ptrace/thread_regs.h"
#include "tests/test_util.h"

namespace kwatch::core {
namespace {

// The registers a call must leave as it found them.
struct Snapshot {
  user_regs_struct regs{};
  ExtendedRegs ext;
};

Snapshot Take(pid_t tid) {
  Snapshot s;
  auto regs = ReadGeneralRegs(tid);
  EXPECT_TRUE(regs.ok()) << regs.status();
  if (regs.ok()) {
    s.regs = *regs;
  }
  auto ext = ReadExtendedRegs(tid);
  EXPECT_TRUE(ext.ok()) << ext.status();
  if (ext.ok()) {
    s.ext = *std::move(ext);
  }
  return s;
}

void ExpectSame(const Snapshot& before, const Snapshot& after, const std::string& what) {
  EXPECT_EQ(0, std::memcmp(&before.regs, &after.regs, sizeof(user_regs_struct)))
      << what << ": general registers differ (rip 0x" << std::hex << before.regs.rip << " / 0x"
      << after.regs.rip << ", rsp 0x" << before.regs.rsp << " / 0x" << after.regs.rsp << ")";
  EXPECT_EQ(before.ext.note, after.ext.note) << what;
  EXPECT_EQ(before.ext.bytes, after.ext.bytes) << what << ": extended registers differ";
}

class RemoteExecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto target = ::kwatch::testing::Spawned::Start({::kwatch::testing::TargetPath("remote_call")});
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    ASSERT_TRUE(target_->WaitForStdout("ready").ok());
    auto proc = Process::Attach(target_->pid());
    ASSERT_TRUE(proc.ok()) << proc.status();
    proc_ = *std::move(proc);
  }

  // Lets the target go, asks it for its report and returns its stdout.
  std::string Finish() {
    EXPECT_TRUE(proc_->Detach().ok());
    proc_.reset();
    ::kill(target_->pid(), SIGUSR1);
    auto r = target_->Finish();
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r.ok() ? r->exit_code : -1, 0);
    return r.ok() ? r->out : "";
  }

  std::unique_ptr<::kwatch::testing::Spawned> target_;
  std::unique_ptr<Process> proc_;
};

TEST_F(RemoteExecTest, MapsProtectsAndUnmapsMemory) {
  ASSERT_TRUE(proc_->StopAll().ok());
  const pid_t tid = proc_->pid();
  const Snapshot before = Take(tid);
  auto addr = RemoteMmap(*proc_, tid, RemoteMapping{0, 8192, PROT_READ | PROT_WRITE, 0});
  ASSERT_TRUE(addr.ok()) << addr.status();
  const auto mapping = [&]() -> std::optional<MapEntry> {
    auto maps = proc_->Maps();
    EXPECT_TRUE(maps.ok()) << maps.status();
    return maps.ok() ? FindMapping(*maps, *addr) : std::nullopt;
  };
  ASSERT_TRUE(mapping().has_value());
  // The kernel may merge the new mapping with an anonymous neighbour of the same protection.
  EXPECT_LE(mapping()->start.value, addr->value);
  EXPECT_GE(mapping()->end.value, addr->value + 8192);
  EXPECT_TRUE(mapping()->read && mapping()->write && !mapping()->exec);
  const uint8_t bytes[4] = {1, 2, 3, 4};
  ASSERT_TRUE(proc_->WriteMemory(*addr, bytes).ok());
  ASSERT_TRUE(RemoteMprotect(*proc_, tid, *addr, 8192, PROT_READ).ok());
  EXPECT_TRUE(mapping()->read && !mapping()->write);
  EXPECT_EQ(RemoteMunmap(*proc_, tid, RemoteAddr{addr->value + 1}, 4096).message(),
            absl::StrFormat("munmap(0x%x, 4096) in pid %d: Invalid argument", addr->value + 1,
                            proc_->pid()));
  ASSERT_TRUE(RemoteMunmap(*proc_, tid, *addr, 8192).ok());
  EXPECT_FALSE(mapping().has_value());
  ExpectSame(before, Take(tid), "after mmap, mprotect and munmap");
  EXPECT_EQ(Finish(), absl::StrFormat("ready %d\ncalls 0 last 0\n", target_->pid()));
}

TEST_F(RemoteExecTest, DebugRegistersAsPtraceShowsThem) {
  ASSERT_TRUE(proc_->StopAll().ok());
  auto dr7 = ReadDebugReg(proc_->pid(), 7);
  ASSERT_TRUE(dr7.ok()) << dr7.status();
  EXPECT_EQ(*dr7, 0u);  // nothing armed in this thread
  EXPECT_EQ(ReadDebugReg(proc_->pid(), 5).status().message(),
            "debug register 5 does not exist (0-3, 6 and 7 do)");
  EXPECT_EQ(Finish(), absl::StrFormat("ready %d\ncalls 0 last 0\n", target_->pid()));
}

}  // namespace
}  // namespace kwatch::core
