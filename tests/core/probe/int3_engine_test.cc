#include "core/probe/int3_engine.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"

namespace kwatch::core::probe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A launched tests/targets/probe_engine under an Int3Engine.
class Int3EngineTest : public ::testing::Test {
 protected:
  void TearDown() override {
    engine_.reset();
    if (proc_ != nullptr && proc_->alive()) {
      (void)proc_->Kill();
    }
    if (!out_.empty()) {
      std::remove(out_.c_str());
    }
  }

  // Starts probe_engine with `args` (its stdout going to a file), stopped at its entry point
  // with the engine installed.
  void Launch(const std::vector<std::string>& args) {
    static int serial = 0;
    out_ = absl::StrCat(::testing::TempDir(), "/int3_engine_test.", getpid(), ".", ++serial);
    std::vector<std::string> argv = {kwatch::testing::TargetPath("probe_engine")};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--out", out_});
    auto p = ptrace::Process::Launch(argv);
    ASSERT_TRUE(p.ok()) << p.status();
    proc_ = std::move(*p);
    ASSERT_TRUE(proc_->RunToEntry().ok());
    LoadSymbols();
    engine_ = std::make_unique<Int3Engine>(*proc_);
    // Held stopped until Go(): probes registered meanwhile see every call.
    ASSERT_TRUE(engine_->StopWorld().ok());
  }

  void Go() { ASSERT_TRUE(engine_->ResumeWorld().ok()); }

  void LoadSymbols() {
    auto s = symbols::Symbols::ForProcess(proc_->pid());
    ASSERT_TRUE(s.ok()) << s.status();
    syms_ = std::move(*s);
  }

  RemoteAddr Fn(const std::string& name) {
    auto f = syms_->FindFunction(name);
    EXPECT_TRUE(f.has_value()) << name;
    return f.has_value() ? f->start : RemoteAddr{};
  }

  ProbeId Probe(const std::string& name, ProbeHandlers h = {}, ProbeOptions opts = {}) {
    auto id = engine_->Register(Fn(name), std::move(h), opts);
    EXPECT_TRUE(id.ok()) << name << ": " << id.status();
    return id.ok() ? *id : 0;
  }

  ProbeId ReturnProbe(const std::string& name, ProbeHandlers h, ReturnProbeOptions opts = {}) {
    auto id = engine_->RegisterReturn(Fn(name), std::move(h), opts);
    EXPECT_TRUE(id.ok()) << name << ": " << id.status();
    return id.ok() ? *id : 0;
  }

  ProbeStats Stats(ProbeId id) {
    auto s = engine_->Stats(id);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : ProbeStats{};
  }

  // Handles the target's events once (blocking for the first).
  void PollOnce() {
    auto events = proc_->Poll(/*block=*/true);
    ASSERT_TRUE(events.ok()) << events.status();
    for (const ptrace::ProcessEvent& e : *events) {
      if (e.kind == ptrace::ProcessEvent::Kind::kExec) {
        ++execs_;
        engine_->OnExec();
        if (on_exec_) {
          ASSERT_TRUE(engine_->StopWorld().ok());
          on_exec_();
          ASSERT_TRUE(engine_->ResumeWorld().ok());
        } else {
          ASSERT_TRUE(proc_->Resume(e.tid).ok());
        }
      } else if (e.kind == ptrace::ProcessEvent::Kind::kThreadExited) {
        engine_->OnThreadExit(e.tid);
      }
    }
  }

  void RunToExit() {
    while (proc_->alive()) {
      PollOnce();
      if (HasFatalFailure()) {
        return;
      }
    }
  }

  // Polls until `done` holds (false after 30 s).
  bool RunUntil(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done()) {
      if (!proc_->alive() || std::chrono::steady_clock::now() > deadline) {
        return false;
      }
      PollOnce();
    }
    return true;
  }

  // The output of the same run without kwatch.
  static std::string Unprobed(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kwatch::testing::TargetPath("probe_engine")};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = kwatch::testing::Run(argv);
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r->exit_code, 0);
    return r->out;
  }

  std::string Output() const { return ReadFile(out_); }

  void ExpectExit0() {
    ASSERT_TRUE(proc_->exit_info().has_value());
    EXPECT_FALSE(proc_->exit_info()->signaled) << "signal " << proc_->exit_info()->signal;
    EXPECT_EQ(proc_->exit_info()->code, 0);
  }

  std::unique_ptr<ptrace::Process> proc_;
  std::unique_ptr<symbols::Symbols> syms_;
  std::unique_ptr<Int3Engine> engine_;
  std::string out_;
  int execs_ = 0;
  std::function<void()> on_exec_;
};

TEST_F(Int3EngineTest, CountsHitsAndSeesArgumentsAtThePreHandler) {
  const std::string expected = Unprobed({"basic"});
  Launch({"basic"});
  std::vector<uint64_t> args;
  bool rip_ok = true;
  const RemoteAddr work = Fn("work");
  const ProbeId id = Probe("work", {.pre = [&](const ProbeContext& ctx) {
                             args.push_back(ctx.regs.rdi);
                             rip_ok &= ctx.regs.rip == work.value && ctx.addr == work &&
                                       ctx.tid == proc_->pid() && !ctx.is_return;
                           }});
  Go();
  RunToExit();
  ExpectExit0();
  ASSERT_EQ(args.size(), 1000u);
  for (uint64_t i = 0; i < args.size(); ++i) {
    ASSERT_EQ(args[i], i);
  }
  EXPECT_TRUE(rip_ok);
  const ProbeStats s = Stats(id);
  EXPECT_EQ(s.hits, 1000u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(Output(), expected);
  // work starts with `lea 0x1(%rdi,%rdi,2),%rax`: emulated, one stop per hit.
  EXPECT_EQ(engine_->counters().traps, 1000u);
  EXPECT_EQ(engine_->counters().emulated, 1000u);
  EXPECT_EQ(engine_->counters().out_of_line, 0u);
}

TEST_F(Int3EngineTest, ReturnProbeValuesThroughRecursion) {
  Launch({"basic"});
  std::vector<uint64_t> values;
  std::vector<uint64_t> entries;
  bool where_ok = true;
  const RemoteAddr fact = Fn("fact");
  const ProbeId ret = ReturnProbe(
      "fact", {.pre =
                   [&](const ProbeContext& ctx) {
                     values.push_back(ctx.regs.rax);
                     where_ok &= ctx.is_return && ctx.function == fact && ctx.addr == fact &&
                                 ctx.regs.rip == ctx.return_address.value;
                   },
               .entry = [&](const ProbeContext& ctx) { entries.push_back(ctx.regs.rdi); }});
  Go();
  RunToExit();
  ExpectExit0();
  // fact(10) recurses down to fact(1); the innermost returns first.
  EXPECT_THAT(entries, ElementsAre(10, 9, 8, 7, 6, 5, 4, 3, 2, 1));
  EXPECT_THAT(values, ElementsAre(1, 2, 6, 24, 120, 720, 5040, 40320, 362880, 3628800));
  EXPECT_TRUE(where_ok);
  const ProbeStats s = Stats(ret);
  EXPECT_EQ(s.hits, 10u);
  EXPECT_EQ(s.nmissed, 0u);
  EXPECT_EQ(s.abandoned, 0u);
  EXPECT_THAT(Output(), HasSubstr("fact(10) 3628800\n"));
  EXPECT_EQ(engine_->counters().returns, 10u);
}

TEST_F(Int3EngineTest, MaxActiveBoundsInstancesAndCountsNmissed) {
  Launch({"basic"});
  std::vector<uint64_t> values;
  const ProbeId ret =
      ReturnProbe("fact", {.pre = [&](const ProbeContext& ctx) { values.push_back(ctx.regs.rax); }},
                  {.maxactive = 3});
  Go();
  RunToExit();
  ExpectExit0();
  // The three outermost calls hold the instances; the seven inner ones are missed.
  EXPECT_THAT(values, ElementsAre(40320, 362880, 3628800));
  const ProbeStats s = Stats(ret);
  EXPECT_EQ(s.hits, 3u);
  EXPECT_EQ(s.nmissed, 7u);
}

TEST_F(Int3EngineTest, LongjmpAbandonsInstancesWithoutConfusingReturns) {
  const std::string expected = Unprobed({"basic"});
  Launch({"basic"});
  std::vector<uint64_t> values;
  const ProbeId ret = ReturnProbe(
      "maybe_jump", {.pre = [&](const ProbeContext& ctx) { values.push_back(ctx.regs.rax); }});
  const ProbeId entry = Probe("maybe_jump");
  Go();
  RunToExit();
  ExpectExit0();
  // Even i return i + 1, odd i longjmp out; a last call returns 101.
  EXPECT_THAT(values, ElementsAre(1, 3, 5, 7, 9, 101));
  const ProbeStats s = Stats(ret);
  EXPECT_EQ(s.hits, 6u);
  EXPECT_EQ(s.abandoned, 5u);
  EXPECT_EQ(Stats(entry).hits, 11u);
  EXPECT_EQ(Output(), expected);
}

// A debugger's step from a probed address (gdb's `stepi` over a kwatch probe's INT3): StepOver
// runs the hit and the displaced instruction, emulated (work's lea) or out of line with its
// post handler (rip_inc's RIP-relative add), and leaves the thread right after it; elsewhere it
// does nothing. The program then runs on, every probe counting.
TEST_F(Int3EngineTest, StepOverRunsTheHitAndTheInstructionForADebuggersStep) {
  const std::string expected = Unprobed({"basic"});
  Launch({"basic"});
  const RemoteAddr work = Fn("work");
  const RemoteAddr rip_inc = Fn("rip_inc");
  auto counter = syms_->Resolve(*symbols::ParseExpr("rip_counter"), nullptr);
  ASSERT_TRUE(counter.ok()) << counter.status();
  const auto read_counter = [&] {
    int32_t v = 0;
    EXPECT_TRUE(
        proc_->ReadMemory(counter->addr, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&v), 4))
            .ok());
    return v;
  };
  std::vector<uint64_t> work_args;
  int posts = 0;
  const ProbeId w =
      Probe("work", {.pre = [&](const ProbeContext& c) { work_args.push_back(c.regs.rdi); }});
  const ProbeId r = Probe("rip_inc", {.post = [&](const ProbeContext&) { ++posts; }});
  const pid_t tid = proc_->pid();
  auto saved = proc_->GetRegs(tid);
  ASSERT_TRUE(saved.ok());
  // Nowhere near a probe (the entry point): nothing to do.
  auto over = engine_->StepOver(tid);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_FALSE(*over);
  // At work (lea 0x1(%rdi,%rdi,2),%rax: 5 bytes, emulated) with rdi = 7.
  user_regs_struct at = *saved;
  at.rip = work.value;
  at.rdi = 7;
  ASSERT_TRUE(proc_->SetRegs(tid, at).ok());
  over = engine_->StepOver(tid);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_TRUE(*over);
  auto after = proc_->GetRegs(tid);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->rip, work.value + 5);
  EXPECT_EQ(after->rax, 22u);
  EXPECT_THAT(work_args, ElementsAre(7u));
  // At rip_inc (addl $1,rip_counter(%rip): 7 bytes, out of line, with a post handler).
  const int32_t before = read_counter();
  at = *saved;
  at.rip = rip_inc.value;
  ASSERT_TRUE(proc_->SetRegs(tid, at).ok());
  over = engine_->StepOver(tid);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_TRUE(*over);
  after = proc_->GetRegs(tid);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->rip, rip_inc.value + 7);
  EXPECT_EQ(read_counter(), before + 1);  // the copy ran once, on the real counter
  EXPECT_EQ(posts, 1);
  // Back where it was; the program runs on, undisturbed (its counter is reset first).
  const int32_t zero = 0;
  ASSERT_TRUE(proc_
                  ->WriteMemory(counter->addr, std::span<const uint8_t>(
                                                   reinterpret_cast<const uint8_t*>(&zero), 4))
                  .ok());
  ASSERT_TRUE(proc_->SetRegs(tid, *saved).ok());
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Stats(w).hits, 1001u);
  EXPECT_EQ(Stats(r).hits, 501u);
  EXPECT_EQ(posts, 501);
  EXPECT_EQ(Output(), expected);
}

TEST_F(Int3EngineTest, EmulatesCallsAndConditionalJumps) {
  const std::string expected = Unprobed({"basic"});
  Launch({"basic"});
  const RemoteAddr jcc = Fn("jcc_site");
  const RemoteAddr callee = Fn("callee");
  uint64_t taken = 0;
  uint64_t not_taken = 0;
  uint64_t call_ok = 0;
  const ProbeId call =
      Probe("call_site",
            {.post = [&](const ProbeContext& ctx) { call_ok += ctx.regs.rip == callee.value; }});
  const ProbeId branch = Probe("jcc_site", {.post = [&](const ProbeContext& ctx) {
                                 // jl 1f (2 bytes) falls through to mov $2,%eax.
                                 if (ctx.regs.rip == jcc.value + 2) {
                                   ++not_taken;
                                 } else {
                                   ++taken;
                                 }
                               }});
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Stats(call).hits, 300u);
  EXPECT_EQ(call_ok, 300u);
  EXPECT_EQ(Stats(branch).hits, 20u);
  EXPECT_EQ(taken, 10u);
  EXPECT_EQ(not_taken, 10u);
  EXPECT_EQ(engine_->counters().emulated, 320u);
  EXPECT_EQ(engine_->counters().post_traps, 0u);  // emulated: post handlers cost no stop
  EXPECT_EQ(Output(), expected);
}

TEST_F(Int3EngineTest, RunsRipRelativeInstructionsOutOfLine) {
  const std::string expected = Unprobed({"basic"});
  Launch({"basic"});
  const RemoteAddr rip_inc = Fn("rip_inc");
  auto counter = syms_->Resolve(*symbols::ParseExpr("rip_counter"), nullptr);
  ASSERT_TRUE(counter.ok()) << counter.status();
  std::vector<int32_t> seen;
  const ProbeId id =
      Probe("rip_inc", {.post = [&](const ProbeContext& ctx) {
              int32_t v = 0;
              EXPECT_TRUE(ctx.process
                              .ReadMemory(counter->addr,
                                          std::span<uint8_t>(reinterpret_cast<uint8_t*>(&v), 4))
                              .ok());
              EXPECT_EQ(ctx.regs.rip, rip_inc.value + 7);
              seen.push_back(v);
            }});
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Stats(id).hits, 500u);
  ASSERT_EQ(seen.size(), 500u);
  for (size_t i = 0; i < seen.size(); ++i) {
    ASSERT_EQ(seen[i], static_cast<int32_t>(i + 1));  // the copy incremented the real counter
  }
  EXPECT_EQ(engine_->counters().out_of_line, 500u);
  EXPECT_EQ(engine_->counters().post_traps, 500u);
  EXPECT_EQ(Output(), expected);
  // The area lies within reach of the code.
  ASSERT_FALSE(engine_->xol().areas().empty());
  const uint64_t area = engine_->xol().areas()[0].start.value;
  EXPECT_LT(area > rip_inc.value ? area - rip_inc.value : rip_inc.value - area, 1ULL << 30);
}

TEST_F(Int3EngineTest, OutOfLineWithoutPostHandlerStopsOnce) {
  const std::string expected = Unprobed({"basic"});
  Launch({"basic"});
  const ProbeId id = Probe("rip_inc");
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Stats(id).hits, 500u);
  EXPECT_EQ(engine_->counters().traps, 500u);
  EXPECT_EQ(engine_->counters().out_of_line, 500u);
  EXPECT_EQ(engine_->counters().post_traps, 0u);
  EXPECT_EQ(Output(), expected);
}

TEST_F(Int3EngineTest, SyscallRunsOutOfLine) {
  const std::string expected = Unprobed({"basic"});
  Launch({"basic"});
  std::vector<uint64_t> results;
  const ProbeId id = Probe(
      "syscall_site", {.pre =
                           [&](const ProbeContext& ctx) {
                             EXPECT_EQ(ctx.regs.rax, 39u);  // getpid
                           },
                       .post = [&](const ProbeContext& ctx) { results.push_back(ctx.regs.rax); }});
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Stats(id).hits, 10u);
  EXPECT_EQ(results, std::vector<uint64_t>(10, static_cast<uint64_t>(proc_->pid())));
  EXPECT_EQ(Output(), expected);
}

TEST_F(Int3EngineTest, ExecutionCanBeForced) {
  const std::string expected = Unprobed({"basic"});
  Launch({"basic"});
  // emul_fn's mov %rdi,%rax out of line; bench_xol's push %rbp is not called in basic mode,
  // call_site's call cannot run out of line.
  const ProbeId mov = Probe("emul_fn", {}, {.execution = ProbeExecution::kOutOfLine});
  auto call = engine_->Register(Fn("call_site"), {}, {.execution = ProbeExecution::kOutOfLine});
  EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(call.status().message()), HasSubstr("cannot run out of line"));
  auto syscall = engine_->Register(Fn("syscall_site"), {}, {.execution = ProbeExecution::kEmulate});
  EXPECT_EQ(syscall.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(syscall.status().message()), HasSubstr("cannot emulate"));
  // A second probe at emul_fn asking for emulation conflicts with the first.
  auto again = engine_->Register(Fn("emul_fn"), {}, {.execution = ProbeExecution::kEmulate});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Stats(mov).hits, 400u);
  EXPECT_EQ(engine_->counters().out_of_line, 400u);
  EXPECT_EQ(Output(), expected);
}

TEST_F(Int3EngineTest, EmulatedPushMatchesOutOfLine) {
  const std::string expected = Unprobed({"bench", "xol", "1000", "1"});
  Launch({"bench", "xol", "1000", "1"});
  const ProbeId id = Probe("bench_xol", {}, {.execution = ProbeExecution::kEmulate});
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Stats(id).hits, 1000u);
  EXPECT_EQ(engine_->counters().emulated, 1000u);
  EXPECT_EQ(Output(), expected);
}

TEST_F(Int3EngineTest, AggregateProbesShareOneBreakpointInRegistrationOrder) {
  Launch({"basic"});
  std::string order;
  const ProbeId a = Probe("work", {.pre = [&](const ProbeContext&) { order += 'a'; }});
  const ProbeId b = Probe("work", {.pre = [&](const ProbeContext&) { order += 'b'; },
                                   .post = [&](const ProbeContext&) { order += 'B'; }});
  const ProbeId c = Probe("work", {.pre = [&](const ProbeContext&) { order += 'c'; }});
  EXPECT_EQ(engine_->Patches().size(), 1u);
  Go();
  RunToExit();
  ExpectExit0();
  ASSERT_EQ(order.size(), 4000u);
  for (size_t i = 0; i < order.size(); i += 4) {
    ASSERT_EQ(order.substr(i, 4), "abcB");
  }
  EXPECT_EQ(Stats(a).hits, 1000u);
  EXPECT_EQ(Stats(b).hits, 1000u);
  EXPECT_EQ(Stats(c).hits, 1000u);
  EXPECT_EQ(engine_->counters().traps, 1000u);
}

TEST_F(Int3EngineTest, DisableEnableAndMaxHits) {
  Launch({"basic"});
  ProbeId b = 0;
  uint64_t a_hits = 0;
  const ProbeId a =
      Probe("work", {.pre = [&](const ProbeContext&) {
              ++a_hits;
              if (a_hits == 100) {
                EXPECT_TRUE(engine_->Disable(b).ok());
              } else if (a_hits == 200) {
                EXPECT_TRUE(engine_->Enable(b).ok());
              }
              // (Un)registering from a handler is refused.
              if (a_hits == 1) {
                EXPECT_EQ(engine_->Unregister(b).code(), absl::StatusCode::kFailedPrecondition);
              }
            }});
  uint64_t b_runs = 0;
  b = Probe("work", {.pre = [&](const ProbeContext&) { ++b_runs; }});
  uint64_t c_runs = 0;
  const ProbeId c = Probe("work", {.pre = [&](const ProbeContext&) { ++c_runs; }}, {.maxhits = 10});
  const ProbeId d = Probe("work", {}, {.enabled = false});
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Stats(a).hits, 1000u);
  // b: calls 1..99 and 200..1000 (a runs first at each hit).
  EXPECT_EQ(Stats(b).hits, 900u);
  EXPECT_EQ(Stats(b).misses, 100u);
  EXPECT_EQ(b_runs, 900u);
  EXPECT_EQ(Stats(c).hits, 10u);
  EXPECT_EQ(Stats(c).misses, 990u);
  EXPECT_EQ(c_runs, 10u);
  EXPECT_FALSE(Stats(c).enabled);
  EXPECT_EQ(Stats(d).hits, 0u);
  EXPECT_EQ(Stats(d).misses, 1000u);
}

TEST_F(Int3EngineTest, RefusesUnsafeAddressesSayingWhy) {
  Launch({"basic"});
  auto int3 = engine_->Register(Fn("has_int3"), {});
  ASSERT_FALSE(int3.ok());
  EXPECT_THAT(std::string(int3.status().message()), HasSubstr("breakpoint already"));
  // Inside an instruction (when the function is known).
  const RemoteAddr rip_inc = Fn("rip_inc");
  auto mid = engine_->Register(rip_inc + 2, {}, {.function_start = rip_inc, .function_size = 8});
  ASSERT_FALSE(mid.ok());
  EXPECT_THAT(std::string(mid.status().message()), HasSubstr("not on an instruction boundary"));
  // Data is not code.
  auto counter = syms_->Resolve(*symbols::ParseExpr("rip_counter"), nullptr);
  ASSERT_TRUE(counter.ok());
  auto data = engine_->Register(counter->addr, {});
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("not in executable code"));
  // Overlapping an instruction already probed.
  Probe("rip_inc");
  auto overlap = engine_->Register(rip_inc + 3, {});
  ASSERT_FALSE(overlap.ok());
  EXPECT_THAT(std::string(overlap.status().message()), HasSubstr("inside the instruction"));
  // kwatch's own area.
  ASSERT_FALSE(engine_->xol().areas().empty());
  auto xol = engine_->Register(engine_->xol().areas()[0].start + 64, {});
  ASSERT_FALSE(xol.ok());
  EXPECT_THAT(std::string(xol.status().message()), HasSubstr("trampoline area"));
  // Nothing was patched by the refusals.
  uint8_t byte = 0;
  ASSERT_TRUE(proc_->ReadMemory(Fn("has_int3"), std::span<uint8_t>(&byte, 1)).ok());
  EXPECT_EQ(byte, 0xcc);  // the program's own
  EXPECT_EQ(engine_->Patches().size(), 1u);
  Go();
  RunToExit();
  ExpectExit0();
}

TEST_F(Int3EngineTest, FourThreadsHitCountsExact) {
  const std::string expected = Unprobed({"threads", "4", "100000"});
  Launch({"threads", "4", "100000"});
  std::map<pid_t, uint64_t> per_thread;
  const ProbeId id = Probe("hot", {.pre = [&](const ProbeContext& ctx) { ++per_thread[ctx.tid]; }});
  const auto start = std::chrono::steady_clock::now();
  Go();
  RunToExit();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectExit0();
  EXPECT_EQ(Stats(id).hits, 400000u);
  ASSERT_EQ(per_thread.size(), 4u);
  for (const auto& [tid, n] : per_thread) {
    EXPECT_EQ(n, 100000u) << tid;
  }
  EXPECT_EQ(Output(), expected);
  std::printf("4 threads x 100000 hits: %.2f s, %.2f us/hit\n", seconds, seconds * 1e6 / 400000);
}

TEST_F(Int3EngineTest, ForkedChildSurvivesAndIsNotCounted) {
  Launch({"fork"});
  const ProbeId work = Probe("work");
  std::vector<uint64_t> spawned;
  const ProbeId spawn = ReturnProbe(
      "spawn", {.pre = [&](const ProbeContext& ctx) { spawned.push_back(ctx.regs.rax); }});
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(proc_->forks(), 1u);
  // The child ran work() 10 times with the original code and returned from spawn() through
  // its real return address.
  EXPECT_THAT(Output(), HasSubstr("child exited 0 signaled 0\n"));
  EXPECT_THAT(Output(), HasSubstr("work sum 14950\n"));
  EXPECT_EQ(Stats(work).hits, 100u);
  EXPECT_EQ(Stats(spawn).hits, 1u);
  ASSERT_EQ(spawned.size(), 1u);
  EXPECT_GT(spawned[0], 0u);  // the parent's return: the child's pid
}

TEST_F(Int3EngineTest, ChildForkedFromAnOutOfLineSyscallLeavesTheCopy) {
  Launch({"rawfork"});
  std::vector<int64_t> results;
  const ProbeId id = Probe("raw_fork_syscall", {.post = [&](const ProbeContext& ctx) {
                             results.push_back(static_cast<int64_t>(ctx.regs.rax));
                           }});
  const ProbeId getpid_probe = Probe("syscall_site");
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_THAT(Output(), HasSubstr("raw child exited 0 signaled 0\n"));
  EXPECT_EQ(Stats(id).hits, 1u);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_GT(results[0], 0);
  EXPECT_EQ(Stats(getpid_probe).hits, 0u);  // only the child called it, unprobed
}

TEST_F(Int3EngineTest, ExecDropsProbesAndTheNewImageCanBeProbed) {
  Launch({"exec", "5", "7"});
  std::vector<uint64_t> before;
  std::vector<uint64_t> after;
  const ProbeId first =
      Probe("work", {.pre = [&](const ProbeContext& ctx) { before.push_back(ctx.regs.rdi); }});
  ProbeId second = 0;
  on_exec_ = [&] {
    EXPECT_TRUE(engine_->Patches().empty());
    EXPECT_TRUE(engine_->xol().areas().empty());
    LoadSymbols();
    auto id = engine_->Register(
        Fn("work"), {.pre = [&](const ProbeContext& ctx) { after.push_back(ctx.regs.rdi); }});
    EXPECT_TRUE(id.ok()) << id.status();
    second = id.ok() ? *id : 0;
  };
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(execs_, 1);
  EXPECT_THAT(before, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(after, ElementsAre(0, 1, 2, 3, 4, 5, 6));
  EXPECT_EQ(Stats(first).hits, 5u);
  EXPECT_FALSE(Stats(first).registered);
  EXPECT_EQ(Stats(second).hits, 7u);
  // The new image inherited the output file (freopen kept fd 1).
  EXPECT_EQ(Output(), "before exec sum 35\nafter exec sum 70\n");
}

TEST_F(Int3EngineTest, FaultHandlersSeeFaultsOfTheCopy) {
  const std::string expected = Unprobed({"fault"});
  Launch({"fault"});
  std::vector<int> signals;
  int calls = 0;
  const RemoteAddr deref = Fn("deref");
  const ProbeId id = Probe("deref", {.fault = [&](const ProbeContext& ctx, int sig) {
                             signals.push_back(sig);
                             EXPECT_EQ(ctx.regs.rip, deref.value);
                             EXPECT_EQ(ctx.regs.rdi, 0u);
                             return ++calls == 1;  // the first time: retry; then the target's
                           }});
  Go();
  RunToExit();
  ExpectExit0();
  EXPECT_THAT(signals, ElementsAre(SIGSEGV, SIGSEGV));
  EXPECT_EQ(Stats(id).faults, 2u);
  EXPECT_EQ(Stats(id).hits, 3u);
  EXPECT_EQ(Output(), expected);  // the target's own handler caught it
}

// Reads [addr, addr + n) of the running target and of the ELF file.
void ExpectCodeMatchesFile(const ptrace::Process& proc, const symbols::Symbols& syms,
                           RemoteAddr addr, size_t n) {
  std::vector<uint8_t> mem(n);
  std::vector<uint8_t> file(n);
  ASSERT_TRUE(proc.ReadMemory(addr, mem).ok());
  ASSERT_TRUE(syms.ReadCode(addr, file).ok());
  EXPECT_EQ(mem, file) << std::hex << addr.value;
}

TEST_F(Int3EngineTest, RestoreAllPutsBackCodeAndReturnAddresses) {
  Launch({"spin"});
  const ProbeId work = Probe("work");
  const ProbeId emul = Probe("emul_fn");
  const ProbeId rip = Probe("rip_inc", {.post = [](const ProbeContext&) {}});
  const ProbeId blocker_entry = Probe("blocker");
  const ProbeId blocker_ret = ReturnProbe("blocker", {.pre = [](const ProbeContext&) {}});
  Go();
  ASSERT_TRUE(RunUntil([&] { return Stats(work).hits >= 3000 && Stats(blocker_entry).hits == 1; }));
  // Live: the breakpoints and blocker's return address.
  const std::vector<PatchRecord> patches = engine_->Patches();
  int breakpoints = 0;
  int returns = 0;
  for (const PatchRecord& p : patches) {
    std::vector<uint8_t> now(p.patched.size());
    ASSERT_TRUE(proc_->ReadMemory(p.addr, now).ok());
    if (p.kind == PatchRecord::Kind::kBreakpoint) {
      ++breakpoints;
      EXPECT_EQ(now, std::vector<uint8_t>{0xcc});
    } else {
      ++returns;
      EXPECT_EQ(now, p.patched);  // the trampoline, in blocker's frame
      uint64_t real = 0;
      std::memcpy(&real, p.original.data(), 8);
      auto fn = syms_->FunctionAt(RemoteAddr{real});
      ASSERT_TRUE(fn.has_value());
      EXPECT_EQ(fn->name, "BlockerMain");
    }
  }
  EXPECT_EQ(breakpoints, 4);
  EXPECT_EQ(returns, 1);

  ASSERT_TRUE(engine_->RestoreAll().ok());
  EXPECT_TRUE(engine_->Patches().empty());
  ASSERT_TRUE(proc_->StopAll().ok());
  for (const char* fn : {"work", "emul_fn", "rip_inc", "blocker"}) {
    auto f = syms_->FindFunction(fn);
    ASSERT_TRUE(f.has_value());
    ExpectCodeMatchesFile(*proc_, *syms_, f->start, f->size);
  }
  ASSERT_TRUE(proc_->ResumeAll().ok());
  const uint64_t frozen = Stats(work).hits;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (std::chrono::steady_clock::now() < until) {
    auto events = proc_->Poll(/*block=*/false);
    ASSERT_TRUE(events.ok());
    usleep(5000);
  }
  EXPECT_EQ(Stats(work).hits, frozen);
  EXPECT_FALSE(Stats(work).registered);
  ASSERT_EQ(kill(proc_->pid(), SIGUSR1), 0);
  RunToExit();
  ExpectExit0();
  // blocker returned 42 through its real return address; the handler no longer runs.
  EXPECT_EQ(Output(), "spin ok 1 blocker 42\n");
  EXPECT_EQ(Stats(blocker_ret).hits, 0u);
  EXPECT_GT(Stats(emul).hits, 0u);
  EXPECT_GT(Stats(rip).hits, 0u);
}

TEST_F(Int3EngineTest, UnregisterPutsTheByteBack) {
  Launch({"spin"});
  const ProbeId work = Probe("work");
  const ProbeId other = Probe("work");
  Go();
  ASSERT_TRUE(RunUntil([&] { return Stats(work).hits >= 500; }));
  ASSERT_TRUE(engine_->Unregister(work).ok());
  EXPECT_EQ(engine_->Patches().size(), 1u);  // `other` keeps the breakpoint
  ASSERT_TRUE(engine_->Unregister(other).ok());
  EXPECT_TRUE(engine_->Patches().empty());
  ASSERT_TRUE(proc_->StopAll().ok());
  ExpectCodeMatchesFile(*proc_, *syms_, Fn("work"), 8);
  ASSERT_TRUE(proc_->ResumeAll().ok());
  const uint64_t frozen = Stats(other).hits;
  ASSERT_EQ(kill(proc_->pid(), SIGUSR1), 0);
  RunToExit();
  ExpectExit0();
  EXPECT_EQ(Output(), "spin ok 1 blocker 42\n");
  EXPECT_EQ(Stats(other).hits, frozen);
  EXPECT_EQ(Stats(work).hits, Stats(other).hits);
}

TEST(Int3EngineAttach, ProbesAnAttachedProcessAndLeavesItWorking) {
  auto target =
      kwatch::testing::Spawned::Start({kwatch::testing::TargetPath("probe_engine"), "spin"});
  ASSERT_TRUE(target.ok());
  usleep(100000);  // let it start its loop
  uint64_t hits = 0;
  {
    auto proc = ptrace::Process::Attach((*target)->pid());
    ASSERT_TRUE(proc.ok()) << proc.status();
    auto syms = symbols::Symbols::ForProcess((*target)->pid());
    ASSERT_TRUE(syms.ok());
    Int3Engine engine(**proc);
    auto work = engine.Register((*syms)->FindFunction("work")->start, {});
    ASSERT_TRUE(work.ok()) << work.status();
    auto ret = engine.RegisterReturn((*syms)->FindFunction("emul_fn")->start, {});
    ASSERT_TRUE(ret.ok()) << ret.status();
    while (engine.Stats(*work)->hits < 2000) {
      ASSERT_TRUE((*proc)->Poll(/*block=*/true).ok());
    }
    ASSERT_TRUE(engine.RestoreAll().ok());
    hits = engine.Stats(*work)->hits;
    EXPECT_GT(engine.Stats(*ret)->hits, 1000u);
    ASSERT_TRUE((*proc)->Detach().ok());
  }
  EXPECT_GE(hits, 2000u);
  kill((*target)->pid(), SIGUSR1);
  auto r = (*target)->Finish();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(r->out, "spin ok 1 blocker 42\n");
}

}  // namespace
}  // namespace kwatch::core::probe
