#include "core/probe/fetch.h"

#include <signal.h>
#include <sys/ptrace.h>
#include <sys/user.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/probe/probe_target.h"
#include "core/ptrace/process.h"
#include "tests/test_util.h"

namespace kwatch::core::probe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint8_t kInt3 = 0xcc;

std::string FixturePath() {
  return kwatch::testing::TargetPath("probe_args");
}

// The line of tests/targets/probe_args.c whose text contains `marker`.
int FixtureLine(const std::string& marker) {
  std::ifstream in(std::string(KWATCH_SOURCE_DIR) + "/tests/targets/probe_args.c");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find(marker) != std::string::npos) {
      return n;
    }
  }
  ADD_FAILURE() << "no line with " << marker;
  return 0;
}

// Runs probe_args under ptrace with INT3 probes of its own (a minimal engine for the test:
// the breakpoint byte is restored, the instruction single-stepped, the byte put back).
// Return probes put a breakpoint on the return address read at the function's entry.
// Each hit appends "EVENT ARGS" as EvaluateAll formats them.
class ProbeRun : public ptrace::SignalInterceptor {
 public:
  void SetUp() {
    auto target = ProbeTarget::Open(FixturePath());
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    auto proc = ptrace::Process::Launch({FixturePath()});
    ASSERT_TRUE(proc.ok()) << proc.status();
    proc_ = *std::move(proc);
    ASSERT_TRUE(proc_->RunToEntry().ok());
    auto maps = proc_->Maps();
    ASSERT_TRUE(maps.ok());
    auto bias = target_->LoadBias(*maps);
    ASSERT_TRUE(bias.ok()) << bias.status();
    bias_ = *bias;
    proc_->SetInterceptor(this);
  }

  // Resolves and compiles "POINT ARGS...", then arms a breakpoint at every point.
  void Add(const std::string& spec_text) {
    auto spec = ParseProbeSpec(spec_text);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto points = target_->Resolve(spec->point);
    ASSERT_TRUE(points.ok()) << points.status();
    for (const ResolvedPoint& p : *points) {
      auto args = CompileArgs(*target_, p, spec->args);
      ASSERT_TRUE(args.ok()) << args.status();
      probes_.push_back(Probe{p, *std::move(args)});
      ASSERT_TRUE(Arm(p.vaddr.value + bias_).ok());
    }
  }

  std::vector<std::string> RunToExit() {
    EXPECT_TRUE(proc_->ResumeAll().ok());
    while (proc_->alive()) {
      auto events = proc_->Poll(/*block=*/true);
      EXPECT_TRUE(events.ok()) << events.status();
      if (!events.ok()) {
        break;
      }
    }
    EXPECT_TRUE(error_.ok()) << error_;
    EXPECT_FALSE(proc_->exit_info()->signaled);
    EXPECT_EQ(proc_->exit_info()->code, 0);
    return hits_;
  }

  uint64_t bias() const { return bias_; }
  ProbeTarget& target() { return *target_; }

  bool Claims(pid_t /*tid*/, const siginfo_t& si) override {
    return si.si_signo == SIGTRAP && si.si_code == SI_KERNEL;
  }

  absl::Status Handle(pid_t tid, const siginfo_t& /*si*/) override {
    absl::Status s = HandleTrap(tid);
    if (!s.ok() && error_.ok()) {
      error_ = s;
    }
    return s;
  }

 private:
  struct Probe {
    ResolvedPoint point;
    std::vector<CompiledArg> args;
  };

  absl::Status Arm(uint64_t addr) {
    if (saved_.contains(addr)) {
      return absl::OkStatus();
    }
    uint8_t orig = 0;
    KW_RETURN_IF_ERROR(proc_->ReadMemory(RemoteAddr{addr}, std::span<uint8_t>(&orig, 1)));
    saved_[addr] = orig;
    return proc_->WriteMemory(RemoteAddr{addr}, std::span<const uint8_t>(&kInt3, 1));
  }

  std::string Hit(const Probe& probe, pid_t tid, const user_regs_struct& regs, bool at_return) {
    user_fpregs_struct fp{};
    ::ptrace(PTRACE_GETFPREGS, tid, nullptr, &fp);
    FetchContext ctx;
    ctx.regs = &regs;
    ctx.load_bias = bias_;
    ctx.read = [this](RemoteAddr a, std::span<uint8_t> out) { return proc_->ReadMemory(a, out); };
    ctx.at_return = at_return;
    ctx.fpregs = &fp;
    ctx.tid = tid;
    return absl::StrCat(probe.point.event, " ", EvaluateAll(probe.args, ctx));
  }

  absl::Status HandleTrap(pid_t tid) {
    KW_ASSIGN_OR_RETURN(user_regs_struct regs, proc_->GetRegs(tid));
    const uint64_t addr = regs.rip - 1;
    if (!saved_.contains(addr)) {
      return absl::InternalError(absl::StrFormat("unexpected trap at 0x%x", addr));
    }
    regs.rip = addr;  // the probed instruction has not run
    bool keep = false;
    for (const Probe& p : probes_) {
      if (p.point.vaddr.value + bias_ != addr) {
        continue;
      }
      keep = true;
      if (!p.point.is_return) {
        hits_.push_back(Hit(p, tid, regs, false));
        continue;
      }
      // Entry of a return probe: catch the return address.
      uint64_t ret = 0;
      KW_RETURN_IF_ERROR(proc_->ReadMemory(
          RemoteAddr{regs.rsp}, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&ret), 8)));
      ++pending_returns_[ret].second;
      pending_returns_[ret].first = &p;
      KW_RETURN_IF_ERROR(Arm(ret));
    }
    if (const auto it = pending_returns_.find(addr); it != pending_returns_.end()) {
      hits_.push_back(Hit(*it->second.first, tid, regs, true));
      if (--it->second.second == 0) {
        pending_returns_.erase(it);
      } else {
        keep = true;
      }
    }
    // Step over the original instruction, then re-arm (or drop a finished return site).
    const uint8_t orig = saved_[addr];
    KW_RETURN_IF_ERROR(proc_->WriteMemory(RemoteAddr{addr}, std::span<const uint8_t>(&orig, 1)));
    KW_RETURN_IF_ERROR(proc_->SetRegs(tid, regs));
    KW_ASSIGN_OR_RETURN(const int sig, proc_->SingleStep(tid));
    if (sig == 0) {
      return absl::OkStatus();  // exited
    }
    if (keep) {
      return proc_->WriteMemory(RemoteAddr{addr}, std::span<const uint8_t>(&kInt3, 1));
    }
    saved_.erase(addr);
    return absl::OkStatus();
  }

  std::unique_ptr<ProbeTarget> target_;
  std::unique_ptr<ptrace::Process> proc_;
  uint64_t bias_ = 0;
  std::vector<Probe> probes_;
  std::map<uint64_t, uint8_t> saved_;
  std::map<uint64_t, std::pair<const Probe*, int>> pending_returns_;
  std::vector<std::string> hits_;
  absl::Status error_;
};

class FetchRun : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(run_.SetUp()); }
  ProbeRun run_;
};

TEST_F(FetchRun, IntegerParametersAtEntry) {
  ASSERT_NO_FATAL_FAILURE(run_.Add("add_ints a b %di:s32 %esi"));
  EXPECT_THAT(
      run_.RunToExit(),
      ElementsAre("add_ints a=0 b=0 arg3=0 arg4=0x0", "add_ints a=1 b=10 arg3=1 arg4=0xa",
                  "add_ints a=2 b=20 arg3=2 arg4=0x14", "add_ints a=3 b=30 arg3=3 arg4=0x1e",
                  "add_ints a=4 b=40 arg3=4 arg4=0x28"));
}

TEST_F(FetchRun, StructPointerMembersStringsAndBitfields) {
  ASSERT_NO_FATAL_FAILURE(
      run_.Add("sum_item p->id p->len +8(%di):u32 p->label:string p->values[2] p->flags "
               "p->kind p->hot nid=p->next->id lbl=+0(+16(%di)):string"));
  EXPECT_THAT(
      run_.RunToExit(),
      ElementsAre("sum_item p->id=101 p->len=3 arg3=3 p->label_string=\"first\" p->values[2]=3 "
                  "p->flags=-2 p->kind=5 p->hot=1 nid=202 lbl=\"first\"",
                  "sum_item p->id=202 p->len=7 arg3=7 p->label_string=\"second\" "
                  "p->values[2]=30 p->flags=5 p->kind=2 p->hot=0 nid=(fault) lbl=\"second\"",
                  "sum_item p->id=303 p->len=9 arg3=9 p->label_string=\"local\" p->values[2]=7 "
                  "p->flags=0 p->kind=0 p->hot=0 nid=(fault) lbl=\"local\""));
}

TEST_F(FetchRun, StringsRegistersAndComm) {
  ASSERT_NO_FATAL_FAILURE(
      run_.Add("name_len name:string limit s=+0(%di):string +0(%si):string $comm p=name"));
  const std::vector<std::string> hits = run_.RunToExit();
  ASSERT_EQ(hits.size(), 1u);
  // %si is 64 (limit): reading memory at address 64 faults.
  EXPECT_EQ(hits[0],
            "name_len name_string=\"hello probe\" limit=64 s=\"hello probe\" arg4=(fault) "
            "arg5=\"probe_args\" p=" +
                hits[0].substr(hits[0].find("p=0x") + 2));
  EXPECT_THAT(hits[0], HasSubstr(" p=0x"));
}

TEST_F(FetchRun, DoublesFromXmmRegisters) {
  ASSERT_NO_FATAL_FAILURE(run_.Add("scale x factor"));
  EXPECT_THAT(run_.RunToExit(), ElementsAre("scale x=1.5 factor=2", "scale x=-0.25 factor=8"));
}

TEST_F(FetchRun, RecursionAndReturnValues) {
  ASSERT_NO_FATAL_FAILURE(run_.Add("fact n"));
  ASSERT_NO_FATAL_FAILURE(run_.Add("fact%return $retval r=%ax:u8"));
  EXPECT_THAT(
      run_.RunToExit(),
      ElementsAre("fact n=5", "fact n=4", "fact n=3", "fact n=2", "fact n=1",
                  "fact__return arg1=1 r=1", "fact__return arg1=2 r=2", "fact__return arg1=6 r=6",
                  "fact__return arg1=24 r=24", "fact__return arg1=120 r=120"));
}

TEST_F(FetchRun, StackSlotsAndFrameBaseVariables) {
  ASSERT_NO_FATAL_FAILURE(run_.Add("many_args g h $stack1 $stack2 a f ra=$stack0 sp=$stack"));
  const std::vector<std::string> hits = run_.RunToExit();
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_THAT(hits[0],
              ::testing::StartsWith("many_args g=70 h=80 arg3=0x46 arg4=0x50 a=1 f=6 ra="));
  // $stack0 is the return address: inside main.
  const size_t ra_at = hits[0].find("ra=0x") + 5;
  const uint64_t ra =
      std::stoull(hits[0].substr(ra_at, hits[0].find(' ', ra_at) - ra_at), nullptr, 16);
  auto main_point = run_.target().Resolve(*ParseProbePoint("main"));
  ASSERT_TRUE(main_point.ok());
  const uint64_t main_start = (*main_point)[0].function_start.value + run_.bias();
  EXPECT_GT(ra, main_start);
  EXPECT_LT(ra, main_start + 0x200);
}

TEST_F(FetchRun, LocalStructOnTheStack) {
  const int line = FixtureLine("PROBE: local_item call");
  ASSERT_NO_FATAL_FAILURE(run_.Add(absl::StrCat(
      "probe_args.c:", line, " local.id local.len local.label:string local.values[3] id")));
  EXPECT_THAT(run_.RunToExit(),
              ElementsAre(absl::StrCat("local_item_L", line,
                                       " local.id=303 local.len=9 "
                                       "local.label_string=\"local\" local.values[3]=8 id=303")));
}

TEST_F(FetchRun, MidBodyLineSeesLoopVariables) {
  const int line = FixtureLine("PROBE: loop body");
  ASSERT_NO_FATAL_FAILURE(run_.Add(absl::StrCat("probe_args.c:", line, " i acc n")));
  const std::string ev = absl::StrCat("loop_lines_L", line);
  EXPECT_THAT(run_.RunToExit(), ElementsAre(ev + " i=0 acc=0 n=4", ev + " i=1 acc=0 n=4",
                                            ev + " i=2 acc=3 n=4", ev + " i=3 acc=9 n=4"));
}

TEST_F(FetchRun, GlobalsBySymbolAndByDwarf) {
  ASSERT_NO_FATAL_FAILURE(
      run_.Add("loop_lines @g_items:s64 @g_items+8:u32 g_items[1].id g_items[0].next->label:string "
               "g_total"));
  const std::vector<std::string> hits = run_.RunToExit();
  ASSERT_EQ(hits.size(), 1u);
  // g_total: tick() was not called yet.
  EXPECT_EQ(hits[0],
            "loop_lines arg1=101 arg2=3 g_items[1].id=202 "
            "g_items[0].next->label_string=\"second\" g_total=0");
}

TEST_F(FetchRun, ProgramCounterIsTheProbedAddress) {
  ASSERT_NO_FATAL_FAILURE(run_.Add("tick pc=%ip v"));
  auto tick = run_.target().Resolve(*ParseProbePoint("tick"));
  ASSERT_TRUE(tick.ok());
  const std::string pc = absl::StrFormat("0x%x", (*tick)[0].vaddr.value + run_.bias());
  EXPECT_THAT(run_.RunToExit(), ElementsAre("tick pc=" + pc + " v=0", "tick pc=" + pc + " v=1",
                                            "tick pc=" + pc + " v=2", "tick pc=" + pc + " v=3"));
}

// ---------------------------------------------------------------------------------------
// Compile-time errors (no process needed).

class FetchCompile : public ::testing::Test {
 protected:
  void SetUp() override {
    auto target = ProbeTarget::Open(FixturePath());
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
  }

  ResolvedPoint At(const std::string& point) {
    auto p = ParseProbePoint(point);
    EXPECT_TRUE(p.ok()) << p.status();
    auto r = target_->Resolve(*p);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)[0] : ResolvedPoint{};
  }

  absl::Status Error(const std::string& point, const std::string& arg) {
    auto args = CompileArgStrings(*target_, At(point), {arg});
    EXPECT_FALSE(args.ok()) << point << " " << arg;
    return args.status();
  }

  std::unique_ptr<ProbeTarget> target_;
};

TEST_F(FetchCompile, DefaultNamesAndTypes) {
  auto args = CompileArgStrings(
      *target_, At("sum_item"),
      {"p", "p->len", "p->flags", "p->label", "%di", "%edi", "p->id:x32", "n=$stack", "@g_total"});
  ASSERT_TRUE(args.ok()) << args.status();
  std::vector<std::string> shown;
  for (const CompiledArg& a : *args) {
    shown.push_back(absl::StrCat(a.name, ":", a.type.Name()));
  }
  EXPECT_THAT(shown, ElementsAre("p:x64", "p->len:u32", "p->flags:s16", "p->label:x64", "arg5:x64",
                                 "arg6:x32", "p->id_x32:x32", "n:x64", "arg9:x64"));
}

TEST_F(FetchCompile, RetvalOnlyInReturnProbes) {
  const absl::Status s = Error("fact", "$retval");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "$retval is only available in a return probe: probe 'fact%return' instead of 'fact'");
  auto ok = CompileArgStrings(*target_, At("fact%return"), {"$retval"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0].type.Name(), "s32");  // fact returns int
  const absl::Status var = Error("fact%return", "n");
  EXPECT_EQ(var.message(),
            "'n' is a variable: a return probe (fact%return) sees only $retval, registers, memory "
            "and the stack");
}

TEST_F(FetchCompile, UnknownVariableListsAvailableOnes) {
  const absl::Status s = Error("sum_item", "totl");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(s.message()),
            "no variable 'totl' at sum_item; did you mean 'total'? (available: i, p, total)");
  EXPECT_EQ(std::string(Error("sum_item", "zz").message()),
            "no variable 'zz' at sum_item (available: i, p, total)");
  EXPECT_EQ(Error("sum_item", "p->lenn").message(),
            "struct item has no member 'lenn'; did you mean 'len'? Members: id, len, flags, kind, "
            "hot, label, next, values");
  EXPECT_EQ(Error("sum_item", "p.len").message(), "'p' is a pointer (struct item *): use 'p->len'");
  EXPECT_EQ(Error("sum_item", "p->values").message(),
            "'p->values' is int[4]: pick an element ('p->values[0]')");
  EXPECT_EQ(Error("sum_item", "p->values[4]").message(),
            "index 4 is out of bounds for 'p->values' (int[4])");
}

TEST_F(FetchCompile, OptimizedOutAndEntryValues) {
  // At the closing brace of loop_lines, `i` is out of scope and `n` only survives as its
  // value on entry (its register was reused).
  const ResolvedPoint at = At("loop_lines:8");
  EXPECT_EQ(at.line, FixtureLine("PROBE: loop body") + 3);
  auto n = CompileArgStrings(*target_, at, {"n"});
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(n.status().message(),
            absl::StrCat("parameter 'n' is only known at ", at.Where(),
                         " as its value on entry to the function (DW_OP_entry_value), which "
                         "kwatch cannot recover there; probe the function's entry instead"));
  auto acc = CompileArgStrings(*target_, at, {"acc"});
  ASSERT_FALSE(acc.ok());
  EXPECT_EQ(acc.status().message(),
            absl::StrCat("variable 'acc' is optimized out at ", at.Where()));
  auto i = CompileArgStrings(*target_, at, {"i"});
  ASSERT_FALSE(i.ok());
  EXPECT_THAT(std::string(i.status().message()), HasSubstr("no variable 'i' at "));
}

TEST_F(FetchCompile, StringNeedsMemory) {
  EXPECT_EQ(Error("name_len", "%di:string").message(),
            "'%di': ':string' reads memory: write '+0(%di):string' to read the string it points "
            "to");
  EXPECT_EQ(Error("name_len", "limit:string").message(),
            "'limit' is int: ':string' needs a char pointer or array");
  EXPECT_EQ(Error("name_len", "@nosuch").message(),
            absl::StrCat("'@nosuch': no symbol 'nosuch' in ", FixturePath()));
}

TEST_F(FetchCompile, ParamsAndVarsExpand) {
  auto params = CompileArgStrings(*target_, At("many_args"), {"$params"});
  ASSERT_TRUE(params.ok()) << params.status();
  std::vector<std::string> names;
  for (const CompiledArg& a : *params) {
    names.push_back(a.name);
  }
  EXPECT_THAT(names, ElementsAre("a", "b", "c", "d", "e", "f", "g", "h"));
  auto vars = CompileArgStrings(*target_, At("sum_item"), {"$vars"});
  ASSERT_TRUE(vars.ok()) << vars.status();
  names.clear();
  for (const CompiledArg& a : *vars) {
    names.push_back(a.name);
  }
  EXPECT_THAT(names, ElementsAre("i", "p", "total"));
}

// The objects a watch per call takes (`kwatch --write 'p->len' --in sum_item`): compiled to
// their address, with their type's size, name and layout; their address at a hit.
TEST_F(FetchCompile, ObjectsCompileToTheirAddressAndType) {
  const ResolvedPoint at = At("sum_item");
  auto len = CompileObject(*target_, at, "p->len");
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(len->length, 4u);
  EXPECT_EQ(len->type_name, "unsigned int");
  auto whole = CompileObject(*target_, at, "*p");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->length, 48u);
  EXPECT_EQ(whole->type_name, "struct item");
  std::vector<std::string> paths;
  for (const auto& f : whole->layout.fields) {
    paths.push_back(f.path);
  }
  EXPECT_THAT(paths, ::testing::IsSupersetOf({".id", ".len", ".label", ".values[3]"}));
  auto values = CompileObject(*target_, at, "p->values");  // arrays are objects too
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->length, 16u);

  EXPECT_EQ(CompileObject(*target_, at, "p->hot").status().message(),
            "'p->hot' is a bitfield: it has no address of its own; watch the structure that "
            "holds it");
  EXPECT_EQ(CompileObject(*target_, at, "p->lenn").status().message(),
            "struct item has no member 'lenn'; did you mean 'len'? Members: id, len, flags, kind, "
            "hot, label, next, values");
  EXPECT_THAT(std::string(CompileObject(*target_, at, "p->len:u32").status().message()),
              HasSubstr("a watched object is a variable of the function"));

  // At the entry, p is in %rdi: p->len lies 8 bytes after it; p itself has no address.
  user_regs_struct regs{};
  regs.rdi = 0x10000;
  FetchContext ctx;
  ctx.regs = &regs;
  auto addr = EvaluateObjectAddress(len->place, ctx);
  ASSERT_TRUE(addr.ok()) << addr.status();
  EXPECT_EQ(addr->value, 0x10008u);
  regs.rdi = 0;
  EXPECT_EQ(EvaluateObjectAddress(len->place, ctx).status().message(),
            "'p->len': a pointer on the way is NULL");
  auto p = CompileObject(*target_, at, "p");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(std::string(EvaluateObjectAddress(p->place, ctx).status().message()),
              HasSubstr("'p' is in a register at this point: it has no address to watch"));
}

}  // namespace
}  // namespace kwatch::core::probe
