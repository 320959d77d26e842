// libkwatch-agent.so in a real process: tests/targets/agent_host.cc loads it, acts as its own
// kwatch, and prints what the agent recorded next to what it computed without probes. Every
// assertion is on exact values the host reports.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "tests/test_util.h"

namespace kwatch::agent {
namespace {

using ::testing::HasSubstr;

// Runs the host with `args`; its key=value lines.
std::map<std::string, std::string> Host(const std::vector<std::string>& args,
                                        std::string* out = nullptr) {
  std::vector<std::string> argv = {kwatch::testing::TargetPath("agent_host")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = kwatch::testing::Run(argv, 120);
  EXPECT_TRUE(r.ok()) << r.status();
  std::map<std::string, std::string> kv;
  if (!r.ok()) {
    return kv;
  }
  EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
  std::istringstream in(r->out);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos && !absl::StrContains(line, ' ')) {
      kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  if (out != nullptr) {
    *out = r->out;
  }
  return kv;
}

TEST(Agent, Int3ProbeCountsExactlyWithRegisterAndMemoryArguments) {
  auto kv = Host({"int3-args", "1000"});
  EXPECT_EQ(kv["records"], "1000");
  EXPECT_EQ(kv["matched"], "1000");     // %di, %si:u32, +0(%dx), +0(+8(%dx)):u32, a string
  EXPECT_EQ(kv["results_ok"], "1000");  // the probed function still computes the same
  EXPECT_EQ(kv["cut_args"], "333");     // every third name is longer than its 32 bytes
  EXPECT_EQ(kv["fault_args"], "0");
  EXPECT_EQ(kv["hits"], "1003");
  EXPECT_EQ(kv["lost"], "0");
  EXPECT_EQ(kv["stray_traps"], "0");
}

TEST(Agent, BadPointersGiveAFaultStatusAndTheProgramGoesOn) {
  auto kv = Host({"int3-args", "10"});
  // 0x10 (refused unread: 3 arguments), an unmapped page (a real fault fixed up: 3), a good
  // struct whose pointers are unmapped (2).
  EXPECT_EQ(kv["bad_records"], "3");
  EXPECT_EQ(kv["bad_faults"], "8");
  EXPECT_EQ(kv["faults"], "8");
}

// ABI v3: reads that end at an unmapped page keep what the thread could read.
TEST(Agent, ReadsEndingAtAnUnmappedPage) {
  auto kv = Host({"fetch-edges"});
  EXPECT_EQ(kv["records"], "2");
  EXPECT_EQ(kv["deref4"], "1818845556");  // "tail" as a little-endian u32
  EXPECT_EQ(kv["deref4_status"], "0");
  EXPECT_EQ(kv["str"], "tail");  // the bytes before the unmapped page
  EXPECT_EQ(kv["str_status"], "1");
  EXPECT_EQ(kv["deref8_status"], "1");
  EXPECT_EQ(kv["stack_status"], "1");  // stopped short at the end of the thread's stack
  EXPECT_EQ(kv["stack_to_end"], "1");
  EXPECT_EQ(kv["stack_short"], "1");
}

TEST(Agent, EveryResumeKindRunsAsTheUnprobedCode) {
  std::string out;
  auto kv = Host({"resume"}, &out);
  const std::vector<std::string> kinds = {
      "jmp",      "jo",      "jno",    "jb",    "jae",          "je",       "jne",
      "jbe",      "ja",      "js",     "jns",   "jp",           "jnp",      "jl",
      "jge",      "jle",     "jg",     "jrcxz", "jecxz",        "loop",     "loope",
      "loopne",   "loop32",  "call",   "ret",   "ret_imm16",    "call_reg", "call_riprel",
      "call_sib", "jmp_reg", "jmp_fs", "xol",   "jump_at_int3", "removing"};
  for (const auto& k : kinds) {
    EXPECT_THAT(out, HasSubstr("resume " + k + " ok ")) << out;
  }
  EXPECT_EQ(kv["cases"], std::to_string(kinds.size()));
  EXPECT_EQ(kv["stray_traps"], "0");
}

TEST(Agent, DisabledProbesAndAStoppingSessionCountMissedAndResume) {
  auto kv = Host({"resume"});
  EXPECT_EQ(kv["disabled_ok"], "1");
  EXPECT_EQ(kv["stopping_ok"], "1");
  EXPECT_EQ(kv["missed"], "20");
  EXPECT_EQ(kv["hits_after"], "10");
}

TEST(Agent, ReturnProbeOnRecursion) {
  auto kv = Host({"ret-fib", "15", "0"});
  EXPECT_EQ(kv["result_ok"], "1");
  EXPECT_EQ(kv["calls"], "1973");
  EXPECT_EQ(kv["returns"], "1973");
  EXPECT_EQ(kv["well_formed"], "1973");
  EXPECT_EQ(kv["returns_match"], "1");  // the multiset of $retval, call by call
  EXPECT_EQ(kv["nmissed"], "0");
  EXPECT_EQ(kv["active"], "0");
  EXPECT_EQ(kv["abandoned"], "0");
}

TEST(Agent, ReturnProbeMaxactiveCountsTheRestInNmissed) {
  auto kv = Host({"ret-fib", "15", "5"});
  EXPECT_EQ(kv["result_ok"], "1");
  EXPECT_EQ(kv["tracked"], "31");  // calls at depth <= 5
  EXPECT_EQ(kv["returns"], "31");
  EXPECT_EQ(kv["returns_match"], "1");
  EXPECT_EQ(kv["nmissed"], kv["expected_nmissed"]);
  EXPECT_EQ(kv["nmissed"], "1942");
  EXPECT_EQ(kv["active"], "0");
}

TEST(Agent, ReturnProbeCallsLeftByLongjmpAreAbandoned) {
  auto kv = Host({"ret-longjmp", "50"});
  EXPECT_EQ(kv["jumped"], "50");
  EXPECT_EQ(kv["results_ok"], "50");
  EXPECT_EQ(kv["returns"], "50");
  EXPECT_EQ(kv["values_ok"], "50");
  EXPECT_EQ(kv["abandoned"], "50");
  EXPECT_EQ(kv["active"], "0");
  EXPECT_EQ(kv["nmissed"], "0");
}

void ExpectOwnTrapHandler(const std::string& when, const std::string& own_int3,
                          const std::string& own_other) {
  auto kv = Host({"own-trap", when, "100"});
  EXPECT_EQ(kv["own_int3"], own_int3) << when;
  EXPECT_EQ(kv["own_other"], own_other) << when;  // raise(SIGTRAP): SI_TKILL
  EXPECT_EQ(kv["probe_hits"], "100") << when;
  EXPECT_EQ(kv["stray_traps"], "101") << when;
  EXPECT_EQ(kv["query_ok"], "1") << when;           // sigaction says the program's handler
  EXPECT_EQ(kv["kernel_is_program"], "0") << when;  // while the agent's stays first
}

TEST(Agent, ProgramsOwnSigtrapHandlerInstalledBeforeTheAgent) {
  ExpectOwnTrapHandler("before", "100", "1");
}

TEST(Agent, ProgramsOwnSigtrapHandlerInstalledAfterTheAgent) {
  ExpectOwnTrapHandler("after", "100", "1");
  ExpectOwnTrapHandler("signal", "101", "0");  // signal(): a one-argument handler
}

// The raw wait status of `agent_host ARGS` run with core dumps on, in a fresh directory.
int DyingStatus(const std::vector<std::string>& args) {
  const std::string dir = ::testing::TempDir() + "/agent_core_XXXXXX";
  std::vector<char> tmpl(dir.begin(), dir.end());
  tmpl.push_back('\0');
  const char* made = mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  const std::string host = kwatch::testing::TargetPath("agent_host");
  const pid_t pid = fork();
  if (pid == 0) {
    if (chdir(made) != 0) {
      _exit(97);
    }
    const rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_CORE, &unlimited);
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    std::vector<char*> argv = {const_cast<char*>(host.c_str())};
    for (const auto& a : args) {
      argv.push_back(const_cast<char*>(a.c_str()));
    }
    argv.push_back(nullptr);
    execv(host.c_str(), argv.data());
    _exit(98);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::filesystem::remove_all(made);
  return status;
}

TEST(Agent, ProgramsOwnInt3WithoutHandlerDiesExactlyAsWithoutTheAgent) {
  const int without = DyingStatus({"die-int3", "--no-agent"});
  const int with = DyingStatus({"die-int3"});
  ASSERT_TRUE(WIFSIGNALED(without));
  EXPECT_EQ(WTERMSIG(without), SIGTRAP);
  EXPECT_EQ(with, without);  // the signal and the core-dump bit
}

TEST(Agent, ProgramsOwnSegfaultDiesExactlyAsWithoutTheAgent) {
  const int without = DyingStatus({"die-segv", "--no-agent"});
  const int with = DyingStatus({"die-segv"});
  ASSERT_TRUE(WIFSIGNALED(without));
  EXPECT_EQ(WTERMSIG(without), SIGSEGV);
  EXPECT_EQ(with, without);
}

TEST(Agent, ProgramsOwnSegvHandlerSeesItsFaultsAndNotTheProbes) {
  auto kv = Host({"segv-handler"});
  EXPECT_EQ(kv["result_ok"], "1");
  EXPECT_EQ(kv["fault_statuses"], "1");
  EXPECT_EQ(kv["handler_calls"], "1");
  EXPECT_EQ(kv["si_addr_ok"], "1");
  EXPECT_EQ(kv["si_code"], "1");  // SEGV_MAPERR
  EXPECT_EQ(kv["recovered"], "1");
}

TEST(Agent, ProgramsAltstackHandlerRecoversFromAStackOverflow) {
  auto kv = Host({"altstack"});
  EXPECT_EQ(kv["recovered"], "1");
  EXPECT_EQ(kv["on_altstack"], "1");
}

TEST(Agent, BlockedSigsegvStillGivesAFaultStatus) {
  auto kv = Host({"sigmask"});
  EXPECT_EQ(kv["view_segv_blocked"], "1");  // what the program asked for, it is told
  EXPECT_EQ(kv["view_usr1_blocked"], "1");
  EXPECT_EQ(kv["kernel_segv_blocked"], "0");  // but the kernel never blocks SIGSEGV
  EXPECT_EQ(kv["kernel_usr1_blocked"], "1");
  EXPECT_EQ(kv["raw_block_kept"], "1");  // a raw rt_sigprocmask is not undone
  EXPECT_EQ(kv["fault_statuses"], "2");
}

TEST(Agent, FullRingCountsLostAndNeverBlocks) {
  auto kv = Host({"ring-full"});
  // 4096-byte ring, 56-byte records: 73 fit; the second batch starts with a pad at the end.
  EXPECT_EQ(kv["record_size"], "56");
  EXPECT_EQ(kv["first"], "73");
  EXPECT_EQ(kv["lost1"], "927");
  EXPECT_EQ(kv["second"], "73");
  EXPECT_EQ(kv["lost"], "954");
  EXPECT_EQ(kv["ring_lost"], "954");
  EXPECT_EQ(kv["hits"], "1100");
  EXPECT_EQ(kv["values_ok"], "1");
}

TEST(Agent, FourThreadsFlatOutAreCountedExactly) {
  auto kv = Host({"threads", "20000"});
  EXPECT_EQ(kv["int3_hits"], "80000");
  EXPECT_EQ(kv["jump_hits"], "80000");
  EXPECT_EQ(kv["records_plus_lost"], "160000");
  EXPECT_EQ(kv["out_of_order"], "0");
  EXPECT_EQ(kv["wrong_tid"], "0");
  EXPECT_EQ(kv["bad_results"], "0");
  EXPECT_EQ(kv["no_thread_slot"], "0");
}

TEST(Agent, JumpProbeWithArgumentsAndAChainedReturnProbe) {
  auto kv = Host({"jump", "1000"});
  EXPECT_EQ(kv["results_ok"], "1000");
  EXPECT_EQ(kv["entries"], "1000");
  EXPECT_EQ(kv["entries_ok"], "1000");  // %di, %si, %xmm0
  EXPECT_EQ(kv["returns"], "1000");
  EXPECT_EQ(kv["returns_ok"], "1000");  // $retval
  EXPECT_EQ(kv["entry_hits"], "1000");
  EXPECT_EQ(kv["return_hits"], "1000");
  EXPECT_EQ(kv["active"], "0");
}

// Per-call watches: each call's object armed in this thread's breakpoint and disarmed at its
// return; exactly its own two writes copied, not another thread's nor those between calls.
TEST(Agent, PerCallWatchArmsEachCallsObjectAndCopiesItsWrites) {
  auto kv = Host({"per-call", "200"});
  EXPECT_EQ(kv["arms"], "202");
  EXPECT_EQ(kv["calls"], "202");  // numbered one by one
  EXPECT_EQ(kv["armed"], "200");
  EXPECT_EQ(kv["null"], "1");
  EXPECT_EQ(kv["unaligned"], "1");
  EXPECT_EQ(kv["fds_opened"], "1");  // opened at the first call, retargeted after
  EXPECT_EQ(kv["ends"], "202");
  EXPECT_EQ(kv["samples"], "400");  // 2 per call, none of the other thread's
  EXPECT_EQ(kv["sample_addr_ok"], "400");
  EXPECT_EQ(kv["active"], "0");
  EXPECT_EQ(kv["missed"], "0");
}

TEST(Agent, WatchdogRestoresEveryPatchedByteWhenTheLifelineCloses) {
  auto kv = Host({"watchdog"});
  EXPECT_EQ(kv["state"], "4");  // kKwStateRestored
  EXPECT_EQ(kv["restored_by_agent"], "4");
  EXPECT_EQ(kv["bytes_ok"], "4");  // 3 INT3s and a 6-byte jump, byte for byte
  EXPECT_EQ(kv["bad_results"], "0");
  EXPECT_EQ(kv["watchdog_was"], "1");
  EXPECT_EQ(kv["watchdog_gone"], "1");
  EXPECT_EQ(kv["calls_after_restore"], "1");
  EXPECT_EQ(kv["lifeline_closed"], "1");  // nothing of kwatch stays in the fd table
}

TEST(Agent, WatchdogNeverClosesAProgramsFileThatReusedTheLifelinesNumber) {
  auto kv = Host({"lifeline-reuse"});
  EXPECT_EQ(kv["state"], "4");
  EXPECT_EQ(kv["program_fd_kept"], "1");
}

TEST(Agent, ForkChildFollowedKeepsItsProbes) {
  std::string out;
  auto kv = Host({"fork", "follow", "10"}, &out);
  EXPECT_THAT(out, HasSubstr("child_code=patched"));
  EXPECT_THAT(out, HasSubstr("child_returned=1"));  // through the return trampoline
  EXPECT_EQ(kv["child_exit"], "0");
  EXPECT_EQ(kv["forks_seen"], "1");
  EXPECT_EQ(kv["parent_hits"], "10");
  EXPECT_EQ(kv["child_hits"], "10");
  EXPECT_EQ(kv["parent_returns"], "1");
  EXPECT_EQ(kv["child_returns"], "1");
  EXPECT_EQ(kv["child_slots"], "1");
  EXPECT_EQ(kv["forks_followed"], "1");
  EXPECT_EQ(kv["process_entries"], "1");  // kwatch learns of the child there
  EXPECT_EQ(kv["entry_is_child"], "1");
  EXPECT_EQ(kv["entry_parent_is_us"], "1");
  EXPECT_EQ(kv["entry_state"], "1");  // kKwProcessFollowed
}

TEST(Agent, ForkChildNotFollowedRestoresItsCode) {
  std::string out;
  auto kv = Host({"fork", "detach", "10"}, &out);
  EXPECT_THAT(out, HasSubstr("child_code=original"));
  EXPECT_THAT(out, HasSubstr("child_returned=1"));
  EXPECT_EQ(kv["child_exit"], "0");
  EXPECT_EQ(kv["forks_seen"], "1");
  EXPECT_EQ(kv["parent_hits"], "10");
  EXPECT_EQ(kv["child_hits"], "0");
  EXPECT_EQ(kv["parent_returns"], "1");
  EXPECT_EQ(kv["child_returns"], "0");
  EXPECT_EQ(kv["parent_code_patched"], "1");
  EXPECT_EQ(kv["forks_followed"], "0");
  EXPECT_EQ(kv["process_entries"], "0");
}

TEST(Agent, InitRefusesWithItsReasonAndStartsAgainAfterARestore) {
  std::string out;
  auto kv = Host({"init"}, &out);
  EXPECT_EQ(kv["bad_magic"], "-22/1");
  EXPECT_EQ(kv["bad_version"], "-71/2");  // -EPROTO
  EXPECT_EQ(kv["bad_ring"], "-22/3");
  EXPECT_EQ(kv["bad_size"], "-22/3");
  EXPECT_EQ(kv["bad_lifeline"], "-9/5");  // -EBADF
  EXPECT_THAT(out, HasSubstr("first=0/0 features=63"));
  EXPECT_EQ(kv["while_live"], "-16/4");  // -EBUSY
  EXPECT_EQ(kv["second"], "0/0");
  EXPECT_EQ(kv["first_hits"], "1");
  EXPECT_EQ(kv["second_hits"], "2");
}

// ---------------------------------------------------------------------------------------
// The library itself.

std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    return out;
  }
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) {
    out.append(buf.data(), n);
  }
  pclose(p);
  return out;
}

TEST(AgentLibrary, NeedsOnlyLibc) {
  const std::string needed = Capture(std::string("objdump -p ") + KWATCH_AGENT_PATH);
  std::istringstream in(needed);
  std::string line;
  std::vector<std::string> libs;
  while (std::getline(in, line)) {
    if (absl::StrContains(line, "NEEDED")) {
      libs.push_back(line.substr(line.find_last_of(' ') + 1));
    }
  }
  EXPECT_THAT(libs, ::testing::ElementsAre("libc.so.6"));
  const std::string exported = Capture(std::string("nm -D --defined-only ") + KWATCH_AGENT_PATH);
  EXPECT_THAT(exported, HasSubstr(" T kwatch_agent_init"));
  EXPECT_THAT(exported, HasSubstr(" T kwatch_agent_jump_hit"));
  size_t text_symbols = 0;
  std::istringstream syms(exported);
  while (std::getline(syms, line)) {
    text_symbols += absl::StrContains(line, " T ") ? 1 : 0;
  }
  EXPECT_EQ(text_symbols, 2U) << exported;  // everything else hidden
}

// From the hit paths' entry points, every function reached by a direct call or jump: none
// calls libc (a PLT entry), none touches a vector register but the %xmm reads of the live
// registers (movdqu %xmmN to memory), and the jump path makes no system call but a thread's
// first gettid (EnsureSlot) and the fatal exits.
TEST(AgentLibrary, HitPathsCallNoLibcAndUseNoVectorRegisters) {
  const std::string dis =
      Capture(std::string("objdump -d --no-show-raw-insn ") + KWATCH_AGENT_PATH);
  std::map<std::string, std::vector<std::string>> body;
  std::string current;
  std::istringstream in(dis);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > 18 && line.back() == ':' && absl::StrContains(line, " <")) {
      current = line.substr(line.find(" <") + 2);
      current = current.substr(0, current.size() - 2);
      continue;
    }
    if (!current.empty() && absl::StrContains(line, ":\t")) {
      body[current].push_back(line);
    }
  }
  ASSERT_FALSE(body.empty()) << "objdump gave nothing";
  auto reach = [&](const std::vector<std::string>& roots) {
    std::set<std::string> seen;
    std::vector<std::string> todo = roots;
    while (!todo.empty()) {
      const std::string f = todo.back();
      todo.pop_back();
      if (!seen.insert(f).second) {
        continue;
      }
      for (const auto& insn : body[f]) {
        const auto lt = insn.find('<');
        if ((!absl::StrContains(insn, "\tcall") && !absl::StrContains(insn, "\tj")) ||
            lt == std::string::npos) {
          continue;
        }
        std::string target = insn.substr(lt + 1, insn.find('>') - lt - 1);
        target = target.substr(0, target.find('+'));
        if (target != f) {
          todo.push_back(target);
        }
      }
    }
    return seen;
  };
  std::string handler;
  for (const auto& [name, insns] : body) {
    if (absl::StrContains(name, "AgentHandler")) {
      handler = name;
    }
  }
  ASSERT_FALSE(handler.empty());
  const std::set<std::string> paths = reach({"kwatch_agent_jump_hit", "kw_return_hit", handler});
  // The walk reached the interpreter, the rings and the safe routines.
  EXPECT_TRUE(paths.contains("kw_safe_copy") && paths.contains("kw_safe_read8"));
  EXPECT_TRUE(std::any_of(paths.begin(), paths.end(),
                          [](const std::string& f) { return absl::StrContains(f, "RunFetch"); }));
  EXPECT_TRUE(std::any_of(paths.begin(), paths.end(),
                          [](const std::string& f) { return absl::StrContains(f, "RunFilter"); }));
  for (const auto& f : paths) {
    ASSERT_TRUE(body.contains(f)) << f;
    EXPECT_FALSE(absl::StrContains(f, "@plt")) << "a hit path reaches libc: " << f;
    for (const auto& insn : body[f]) {
      EXPECT_FALSE(absl::StrContains(insn, "%st")) << "x87 on a hit path in " << f << ": " << insn;
      const bool vector = absl::StrContains(insn, "%xmm") || absl::StrContains(insn, "%ymm") ||
                          absl::StrContains(insn, "%zmm");
      if (vector) {
        EXPECT_THAT(insn, ::testing::ContainsRegex("movdqu %xmm[0-9]+,\\(")) << f;
      }
    }
  }
  // EnsureSlot and LearnTid: a thread's first hit (gettid); DieOfSignal; ThreadName: $comm's
  // prctl(PR_GET_NAME).
  // Per-call watches: arming and disarming a call's breakpoint (perf_event_open and mmap at a
  // thread's first call, one ioctl each) is what a watched call costs (agent/calls.cc).
  const std::set<std::string> may_syscall = {
      "_ZN6kwatch5agent7CallArmERNS0_7SessionERNS0_11ThreadStateERNS0_7KwProbeERKNS0_6KwRegsEm",
      "_ZN6kwatch5agent9CallEndedERNS0_7SessionERNS0_11ThreadStateERNS0_10KwInstanceEjm",
      // ... and closing the breakpoints of threads that are gone, at a lookup.
      "_ZN6kwatch5agent12_GLOBAL__N_19CloseGoneERNS0_7SessionE",
      "_ZN6kwatch5agent10EnsureSlotERNS0_7SessionERNS0_11ThreadStateE",
      "_ZN6kwatch5agent12_GLOBAL__N_18LearnTidERNS0_11ThreadStateE",
      "_ZN6kwatch5agent11DieOfSignalEi",
      "_ZN6kwatch5agent12_GLOBAL__N_110ThreadNameERSt5arrayIcLm16EE"};
  for (const auto& f : reach({"kwatch_agent_jump_hit", "kw_return_hit"})) {
    for (const auto& insn : body[f]) {
      if (absl::StrContains(insn, "\tsyscall")) {
        // GCC's clones (".constprop.0", ".isra.0") are the function they were made from.
        EXPECT_TRUE(may_syscall.contains(f.substr(0, f.find('.'))))
            << "a system call on the jump path in " << f;
      }
    }
  }
}

}  // namespace
}  // namespace kwatch::agent
