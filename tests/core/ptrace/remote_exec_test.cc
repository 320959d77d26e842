// Code run inside a stopped thread (core/ptrace/remote_exec.h, and remote_call.h's RemoteCall
// with the registers compared byte for byte), on tests/targets/remote_exec:
// the results of its functions and system calls, the thread's registers before and after
// (exactly), and the target's own report of what the calls did.

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
#include "core/ptrace/remote_call.h"
#include "core/ptrace/thread_regs.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::core::ptrace {
namespace {

using ::testing::HasSubstr;

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
    auto target = ::kwatch::testing::Spawned::Start({::kwatch::testing::TargetPath("remote_exec")});
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    ASSERT_TRUE(target_->WaitForStdout("ready").ok());
    auto proc = Process::Attach(target_->pid());
    ASSERT_TRUE(proc.ok()) << proc.status();
    proc_ = *std::move(proc);
    auto symbols = symbols::Symbols::ForProcess(target_->pid());
    ASSERT_TRUE(symbols.ok()) << symbols.status();
    symbols_ = *std::move(symbols);
  }

  RemoteAddr Function(const std::string& name) {
    const std::optional<symbols::FunctionSymbol> f = symbols_->FindFunction(name);
    EXPECT_TRUE(f.has_value()) << name;
    return f.has_value() ? f->start : RemoteAddr{0};
  }

  // RemoteCall with a return trap mapped once (the mapping stays: the registers compared are
  // the thread's, not the address space).
  absl::StatusOr<uint64_t> Call(pid_t tid, RemoteAddr function, std::span<const uint64_t> args,
                                absl::Duration timeout = absl::Seconds(5)) {
    if (trap_.value == 0) {
      auto trap = MapRemoteTrap(*proc_, tid, 4096);
      if (!trap.ok()) {
        return trap.status();
      }
      trap_ = *trap;
    }
    RemoteCallOptions opts;
    opts.return_trap = trap_;
    opts.timeout = timeout;
    auto r = RemoteCall(*proc_, tid, function, args, opts);
    if (!r.ok()) {
      return r.status();
    }
    return r->value;
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

  RemoteAddr trap_{};
  std::unique_ptr<::kwatch::testing::Spawned> target_;
  std::unique_ptr<Process> proc_;
  std::unique_ptr<symbols::Symbols> symbols_;
};

TEST_F(RemoteExecTest, ReturnsTheFunctionsResultAndRestoresTheThreadExactly) {
  ASSERT_TRUE(proc_->StopAll().ok());
  const pid_t tid = proc_->pid();
  const Snapshot before = Take(tid);

  const uint64_t args[6] = {1, 2, 3, 4, 5, 6};
  auto sum = Call(tid, Function("remote_add6"), args);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 1u + 2 * 2 + 3 * 3 + 4 * 4 + 5 * 5 + 6 * 6);
  ExpectSame(before, Take(tid), "after remote_add6");

  const uint64_t ten[1] = {10};
  auto vectors = Call(tid, Function("remote_vectors"), ten);
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  EXPECT_EQ(*vectors, 61u);  // (10 * 1.5 + 0.25) * 4, computed in xmm registers
  ExpectSame(before, Take(tid), "after remote_vectors");

  auto alignment = Call(tid, Function("remote_frame_alignment"), {});
  ASSERT_TRUE(alignment.ok()) << alignment.status();
  EXPECT_EQ(*alignment, 0u);

  const uint64_t other[6] = {10, 1, 0, 0, 0, 1};
  auto again = Call(tid, Function("remote_add6"), other);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 18u);
  ExpectSame(before, Take(tid), "after the second remote_add6");

  // The program itself counted two calls and kept the last result; its pause() went on.
  EXPECT_EQ(Finish(), absl::StrFormat("ready %d\ncalls 2 last 18\n", target_->pid()));
}

TEST_F(RemoteExecTest, AFaultingFunctionLeavesTheThreadAsItWas) {
  ASSERT_TRUE(proc_->StopAll().ok());
  const pid_t tid = proc_->pid();
  const Snapshot before = Take(tid);
  const RemoteAddr load = Function("remote_load");
  const uint64_t null[1] = {0};
  auto r = Call(tid, load, null);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("SIGSEGV"));
  ExpectSame(before, Take(tid), "after the fault");
  EXPECT_EQ(Finish(), absl::StrFormat("ready %d\ncalls 0 last 0\n", target_->pid()));
}

TEST_F(RemoteExecTest, AFunctionThatNeverReturnsIsInterruptedAtTheDeadline) {
  ASSERT_TRUE(proc_->StopAll().ok());
  const pid_t tid = proc_->pid();
  const Snapshot before = Take(tid);
  auto r = Call(tid, Function("remote_forever"), {}, absl::Milliseconds(200));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("did not return within 200ms"));
  ExpectSame(before, Take(tid), "after the interrupted call");
  const uint64_t args[6] = {0, 0, 0, 0, 0, 7};
  auto after = Call(tid, Function("remote_add6"), args);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, 42u);
  EXPECT_EQ(Finish(), absl::StrFormat("ready %d\ncalls 1 last 42\n", target_->pid()));
}

TEST_F(RemoteExecTest, RefusesThreadsItCannotUse) {
  const uint64_t seven[7] = {};
  const RemoteAddr add6 = Function("remote_add6");
  auto running = Call(proc_->pid(), add6, {});
  EXPECT_FALSE(running.ok());  // the thread runs: no trap can be mapped nor a call made
  ASSERT_TRUE(proc_->StopAll().ok());
  EXPECT_EQ(Call(proc_->pid(), add6, seven).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Finish(), absl::StrFormat("ready %d\ncalls 0 last 0\n", target_->pid()));
}

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
}  // namespace kwatch::core::ptrace
