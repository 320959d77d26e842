#include "core/symbols/unwind.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/user.h>

#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/base/status_macros.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::core::symbols {
namespace {

using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A stopped thread's registers and its stack as the Unwinder returned it.
struct Capture {
  pid_t tid = 0;
  user_regs_struct regs{};
  std::vector<RemoteAddr> frames;
};

// Unwinds the thread that stopped: at the fixture's INT3 (trap mode, claimed so that the
// target goes on without the signal) or at the entry of its pause() call (pause mode).
class Catcher : public ptrace::SignalInterceptor {
 public:
  Catcher(ptrace::Process& proc, Unwinder& unwinder) : proc_(proc), unwinder_(unwinder) {}

  bool Claims(pid_t /*tid*/, const siginfo_t& si) override {
    return si.si_signo == SIGTRAP && si.si_code == SI_KERNEL;
  }
  absl::Status Handle(pid_t tid, const siginfo_t& /*si*/) override { return Take(tid); }
  absl::StatusOr<bool> HandleInPlace(pid_t tid, const siginfo_t& /*si*/) override {
    KW_RETURN_IF_ERROR(Take(tid));
    return true;
  }
  absl::Status OnSyscallStop(pid_t tid, const ptrace::SyscallStop& stop, bool /*world*/) override {
    if (stop.entry && stop.nr == SYS_pause) {
      return Take(tid);
    }
    return absl::OkStatus();
  }

  std::vector<Capture> captures;

 private:
  absl::Status Take(pid_t tid) {
    Capture c;
    c.tid = tid;
    KW_ASSIGN_OR_RETURN(c.regs, proc_.GetRegs(tid));
    KW_ASSIGN_OR_RETURN(c.frames, unwinder_.Unwind(tid, c.regs));
    captures.push_back(std::move(c));
    return absl::OkStatus();
  }

  ptrace::Process& proc_;
  Unwinder& unwinder_;
};

class UnwindTest : public ::testing::Test {
 protected:
  // Launches unwind_levels MODE up to its entry point (libraries mapped).
  void Start(const std::string& mode) {
    auto p = ptrace::Process::Launch({kwatch::testing::TargetPath("unwind_levels"), mode});
    ASSERT_TRUE(p.ok()) << p.status();
    proc_ = *std::move(p);
    ASSERT_TRUE(proc_->RunToEntry().ok());
    auto s = Symbols::ForProcess(proc_->pid());
    ASSERT_TRUE(s.ok()) << s.status();
    symbols_ = *std::move(s);
    symbolizer_ = std::make_unique<Symbolizer>(*symbols_);
    const ptrace::Process* proc = proc_.get();
    std::vector<Read>* reads = &reads_;
    auto u =
        Unwinder::ForProcess(proc_->pid(), [proc, reads](RemoteAddr addr, std::span<uint8_t> out) {
          reads->push_back({addr.value, out.size()});
          return proc->ReadMemory(addr, out);
        });
    ASSERT_TRUE(u.ok()) << u.status();
    unwinder_ = *std::move(u);
    catcher_ = std::make_unique<Catcher>(*proc_, *unwinder_);
    proc_->SetInterceptor(catcher_.get());
  }

  void TearDown() override {
    if (proc_ != nullptr) {
      proc_->SetInterceptor(nullptr);
      if (proc_->alive()) {
        EXPECT_TRUE(proc_->Kill().ok());
      }
    }
  }

  // Function names of the frames: frame 0 at its address, callers at return address - 1.
  std::vector<std::string> Names(const std::vector<RemoteAddr>& frames) {
    std::vector<std::string> names;
    for (size_t i = 0; i < frames.size(); ++i) {
      names.push_back(symbolizer_->Locate(i == 0 ? frames[i] : frames[i] - 1).function);
    }
    return names;
  }
  std::string Module(RemoteAddr addr) { return symbolizer_->Locate(addr).module; }

  // A call the Unwinder made to its MemoryReader.
  struct Read {
    uint64_t addr = 0;
    size_t len = 0;
  };

  std::vector<Read> reads_;
  std::unique_ptr<ptrace::Process> proc_;
  std::unique_ptr<Symbols> symbols_;
  std::unique_ptr<Symbolizer> symbolizer_;
  std::unique_ptr<Unwinder> unwinder_;
  std::unique_ptr<Catcher> catcher_;
};

TEST_F(UnwindTest, TrapInLevel3UnwindsToMain) {
  Start("trap");
  ASSERT_TRUE(proc_->ResumeAll().ok());
  while (proc_->alive()) {
    auto events = proc_->Poll(/*block=*/true);
    ASSERT_TRUE(events.ok()) << events.status();
  }
  ASSERT_TRUE(proc_->exit_info().has_value());
  EXPECT_EQ(proc_->exit_info()->ShellStatus(), 0);  // the trap was absorbed, all levels returned
  ASSERT_EQ(catcher_->captures.size(), 1u);
  const Capture& c = catcher_->captures[0];
  EXPECT_EQ(c.tid, proc_->pid());
  ASSERT_FALSE(c.frames.empty());
  EXPECT_EQ(c.frames[0].value, c.regs.rip);
  const std::vector<std::string> names = Names(c.frames);
  // level3 traps before it sets up a frame (shrink-wrapped, no push of %rbp): only the CFI
  // knows where its return address is. After main: glibc's start code (two frames in
  // libc.so.6: __libc_start_call_main and __libc_start_main, named only where libc6-dbg is
  // installed), then _start, where the CFI ends the stack.
  EXPECT_THAT(names, ElementsAre("level3", "level2", "level1", "main", _, _, "_start"));
  EXPECT_THAT(Module(c.frames[4] - 1), HasSubstr("libc.so.6"));
  EXPECT_THAT(Module(c.frames[5] - 1), HasSubstr("libc.so.6"));
  // The stack came from whole-page reads, each page read once: the first is the page of the
  // stack pointer, the others follow it upwards. The seven frames use well under 4 KiB, but
  // where they straddle a page boundary (the stack top is randomized within its page) that
  // is two pages.
  EXPECT_EQ(unwinder_->memory_reads(), reads_.size());
  ASSERT_FALSE(reads_.empty());
  EXPECT_LE(reads_.size(), 2u);
  constexpr uint64_t kPage = 4096;
  for (size_t i = 0; i < reads_.size(); ++i) {
    EXPECT_EQ(reads_[i].len, kPage) << "read " << i;
    EXPECT_EQ(reads_[i].addr, (c.regs.rsp & ~(kPage - 1)) + i * kPage) << "read " << i;
  }
  // The return addresses are the instructions right after each call.
  for (size_t i = 1; i < 4; ++i) {
    const CodeLocation& loc = symbolizer_->Locate(c.frames[i]);
    EXPECT_EQ(loc.function, names[i]);
    EXPECT_GT(loc.offset, 0u);
  }
}

TEST_F(UnwindTest, ThreadStoppedInsideLibcUnwindsBackToMain) {
  Start("pause");
  proc_->SetSyscallStops(true);
  ASSERT_TRUE(proc_->ResumeAll().ok());
  while (catcher_->captures.empty() && proc_->alive()) {
    auto events = proc_->Poll(/*block=*/true);
    ASSERT_TRUE(events.ok()) << events.status();
  }
  ASSERT_EQ(catcher_->captures.size(), 1u);
  const Capture& c = catcher_->captures[0];
  const std::vector<std::string> names = Names(c.frames);
  // Frame 0 is in libc's pause() (an exported symbol), right after its syscall instruction;
  // it unwinds through libc's .eh_frame back into the program.
  EXPECT_THAT(names, ElementsAre("pause", "level3", "level2", "level1", "main", _, _, "_start"));
  EXPECT_THAT(Module(c.frames[0]), HasSubstr("libc.so.6"));
  EXPECT_THAT(Module(c.frames[5] - 1), HasSubstr("libc.so.6"));
  EXPECT_THAT(Module(c.frames[6] - 1), HasSubstr("libc.so.6"));
  EXPECT_EQ(c.frames[0].value, c.regs.rip);
}

TEST_F(UnwindTest, MaxFramesAndAnUnreadableStack) {
  Start("pause");
  proc_->SetSyscallStops(true);
  ASSERT_TRUE(proc_->ResumeAll().ok());
  while (catcher_->captures.empty() && proc_->alive()) {
    ASSERT_TRUE(proc_->Poll(/*block=*/true).ok());
  }
  ASSERT_EQ(catcher_->captures.size(), 1u);
  const Capture& c = catcher_->captures[0];
  // The thread now sleeps inside pause(), its stack unchanged: unwind it again from the
  // registers of its syscall-entry stop.
  auto two = unwinder_->Unwind(c.tid, c.regs, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_THAT(Names(*two), ElementsAre("pause", "level3"));
  auto none = unwinder_->Unwind(c.tid, c.regs, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // Same again, repeatedly: the result does not depend on earlier unwinds.
  for (int i = 0; i < 3; ++i) {
    auto again = unwinder_->Unwind(c.tid, c.regs);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, c.frames);
  }
  // A stack pointer into unmapped memory: frame 0 alone.
  user_regs_struct bad = c.regs;
  bad.rsp = 0x10;
  bad.rbp = 0x10;
  auto one = unwinder_->Unwind(c.tid, bad);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(*one, ElementsAre(RemoteAddr{c.regs.rip}));
  // After Refresh the modules are reported again and the unwind is the same.
  ASSERT_TRUE(unwinder_->Refresh().ok());
  auto fresh = unwinder_->Unwind(c.tid, c.regs);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(*fresh, c.frames);
}

TEST(UnwinderErrors, NoSuchProcess) {
  auto u = Unwinder::ForProcess(0x3fffffff,
                                [](RemoteAddr, std::span<uint8_t>) { return absl::OkStatus(); });
  ASSERT_FALSE(u.ok());
  EXPECT_THAT(u.status().message(), HasSubstr("/proc/1073741823/maps"));
}

}  // namespace
}  // namespace kwatch::core::symbols
