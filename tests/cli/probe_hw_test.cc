// `kwatch probe --hw`: probes as execute breakpoints in the debug registers, the code never
// patched (cli/probe_hw.cc), on tests/targets/hw_probe_target.c.
//
// Hardware debug traps are not delivered on every machine (some VMs accept the breakpoints and
// never trap): what kwatch places is checked everywhere (the code bytes of the live target, the
// registers of every thread as the kernel counts them through `kwatch slots`, the refusals),
// hit counts only where traps arrive (KW_REQUIRE_DEBUG_TRAPS, last in each test). The hit path
// itself runs everywhere on traps the target forges (TRAP_PERF with the perf data of the
// probe's breakpoint, which the test as the tracer reads from HwProbes in-process).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "cli/probe_output.h"
#include "cli/probe_run.h"
#include "core/base/clock.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "core/ptrace/trap_origin.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"
#include "watch/probe/hw_probes.h"
#include "watch/probe/probe_set.h"
#include "watch/stop_backend.h"
#include "watch/trap_breakpoints.h"

namespace kwatch::cli {
namespace {

using ::kwatch::core::MonotonicNs;
using ::kwatch::testing::HoldBreakpointSlot;
using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::TargetPath;
using ::kwatch::watch::probe::EvaluateHwHit;
using ::kwatch::watch::probe::HwProbes;
using ::testing::HasSubstr;
using json = nlohmann::json;
namespace fs = std::filesystem;

// sum over i < n of hw_tick(i) = 3i + 100.
long TickSum(long n) {
  return 3 * n * (n - 1) / 2 + 100 * n;
}

int SourceLine(const std::string& needle) {
  std::ifstream in(std::string(KWATCH_SOURCE_DIR) + "/tests/targets/hw_probe_target.c");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find(needle) != std::string::npos) {
      return n;
    }
  }
  ADD_FAILURE() << "no line with " << needle;
  return -1;
}

RunResult Kwatch(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {KwatchPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = kwatch::testing::Run(argv);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RunResult{};
}

// A private, empty run directory in KWATCH_RUN_DIR (where sessions publish their slots), and a
// GOFILE path for hw_probe_target.
class ProbeHwTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = absl::StrCat(::testing::TempDir(), "/kwatch-probe-hw-XXXXXX");
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ::setenv("KWATCH_RUN_DIR", dir_.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): one thread
    gofile_ = dir_ + "/go";
  }
  void TearDown() override {
    ::unsetenv("KWATCH_RUN_DIR");  // NOLINT(concurrency-mt-unsafe): one thread
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void Go() { std::ofstream(gofile_) << "go\n"; }

  std::string dir_;
  std::string gofile_;
};

// kwatch's JSON lines apart from the target's own lines.
struct Output {
  std::vector<json> hits;
  json summary;
  std::vector<std::string> target;
};

Output Split(const std::string& out) {
  Output o;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (line.front() != '{') {
      o.target.emplace_back(line);
      continue;
    }
    json j = json::parse(std::string(line));
    if (j["type"] == "hit") {
      o.hits.push_back(std::move(j));
    } else {
      o.summary = std::move(j);
    }
  }
  return o;
}

// The absolute address kwatch's placement line gives probe `n` ("probe #n ...: debug register
// DRr, execute breakpoint at 0x... in every thread"), and the register.
struct Placed {
  int dr = -1;
  uint64_t addr = 0;
};
Placed PlacementOf(const std::string& err, int n) {
  std::smatch m;
  const std::regex re(absl::StrCat("kwatch:   probe #", n,
                                   R"( [^\n]*: debug register DR([0-3]), execute breakpoint at )"
                                   R"(0x([0-9a-f]+) in every thread)"));
  Placed p;
  if (std::regex_search(err, m, re)) {
    p.dr = std::stoi(m[1]);
    p.addr = std::stoull(m[2], nullptr, 16);
  }
  return p;
}

pid_t ArmedPid(const std::string& err) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex("armed .* on pid ([0-9]+)"))) {
    return 0;
  }
  return std::stoi(m[1]);
}

// `len` bytes at `addr` in the file that `pid` maps there (from /proc/PID/maps).
std::vector<uint8_t> FileBytes(pid_t pid, uint64_t addr, size_t len) {
  auto maps = core::ptrace::ReadMaps(pid);
  EXPECT_TRUE(maps.ok()) << maps.status();
  std::vector<uint8_t> out(len);
  const auto m = core::ptrace::FindMapping(*maps, core::RemoteAddr{addr});
  EXPECT_TRUE(m.has_value() && !m->path.empty()) << "0x" << std::hex << addr;
  if (!m.has_value()) {
    return out;
  }
  std::ifstream in(m->path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(addr - m->start.value + m->offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(len));
  EXPECT_TRUE(in.good()) << m->path;
  return out;
}

std::vector<uint8_t> MemBytes(pid_t pid, uint64_t addr, size_t len) {
  std::vector<uint8_t> out(len);
  core::UniqueFd fd(::open(absl::StrCat("/proc/", pid, "/mem").c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_TRUE(fd) << std::strerror(errno);
  EXPECT_EQ(::pread(fd.get(), out.data(), len, static_cast<off_t>(addr)), static_cast<ssize_t>(len))
      << std::strerror(errno);
  return out;
}

// `kwatch slots -p PID --json` for the one process. A kernel watch of a test running in
// parallel takes a slot of every thread for a moment: ask again while a thread shows more
// registers held outside kwatch than `max_external`.
json SlotsOf(pid_t pid, int max_external) {
  json p;
  for (int attempt = 0; attempt < 50; ++attempt) {
    const RunResult r = Kwatch({"slots", "-p", absl::StrCat(pid), "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out, nullptr, false);
    if (j.is_discarded() || j["processes"].size() != 1) {
      ADD_FAILURE() << r.out;
      return p;
    }
    p = j["processes"][0];
    bool busy = false;
    for (const json& t : p["threads"]) {
      busy |= t["external"].get<int>() > max_external;
    }
    if (!busy) {
      return p;
    }
    ::usleep(100 * 1000);
  }
  return p;
}

// DR0-DR3 and DR7 of every thread of `pid`, read by seizing it (after kwatch detached).
std::map<pid_t, std::vector<uint64_t>> DebugRegisters(pid_t pid) {
  std::map<pid_t, std::vector<uint64_t>> out;
  for (const auto& e : fs::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    pid_t tid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &tid)) {
      continue;
    }
    if (::ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0 ||
        ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
      ADD_FAILURE() << "seize " << tid << ": " << std::strerror(errno);
      continue;
    }
    int status = 0;
    EXPECT_EQ(::waitpid(tid, &status, __WALL), tid);
    for (int n : {0, 1, 2, 3, 7}) {
      errno = 0;
      const long v = ::ptrace(
          PTRACE_PEEKUSER, tid,
          reinterpret_cast<void*>(offsetof(struct user, u_debugreg) + n * sizeof(long)), nullptr);
      EXPECT_EQ(errno, 0) << std::strerror(errno);
      out[tid].push_back(static_cast<uint64_t>(v));
    }
    EXPECT_EQ(::ptrace(PTRACE_DETACH, tid, nullptr, nullptr), 0) << std::strerror(errno);
  }
  return out;
}

TEST_F(ProbeHwTest, CodeIsUntouchedAndEveryThreadHoldsTheRegisters) {
  // Three threads started after the probes were armed, two probed functions.
  auto k = Spawned::Start({KwatchPath(), "probe", "--hw", "--json", "-q", "hw_tick i r->len",
                           "hw_done sum", "--", TargetPath("hw_probe_target"), "threads", "3",
                           "1000", gofile_});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStdout("ready").ok()) << (*k)->err();
  const std::string err = (*k)->err();
  const pid_t pid = ArmedPid(err);
  ASSERT_GT(pid, 0) << err;
  const Placed tick = PlacementOf(err, 1);
  const Placed done = PlacementOf(err, 2);
  EXPECT_EQ(tick.dr, 0) << err;
  EXPECT_EQ(done.dr, 1) << err;
  EXPECT_THAT(err, HasSubstr("hw backend: execute breakpoints in debug registers through ptrace, "
                             "the code is not modified"));

  // The code: every byte of both functions as in the file while the session is live.
  for (const Placed& p : {tick, done}) {
    ASSERT_NE(p.addr, 0u) << err;
    const std::vector<uint8_t> file = FileBytes(pid, p.addr, 16);
    EXPECT_EQ(MemBytes(pid, p.addr, 16), file) << std::hex << p.addr;
    EXPECT_NE(file[0], 0xCC);
  }

  // The registers as the kernel counts them: each of the 4 threads carries both execute
  // breakpoints (2 slots used: 2 free, none held outside kwatch), and kwatch's published
  // decision names the probes.
  const json p = SlotsOf(pid, 0);
  ASSERT_EQ(p["threads"].size(), 4u) << p.dump();
  ASSERT_EQ(p["sessions"].size(), 1u) << p.dump();
  EXPECT_EQ(p["sessions"][0]["kwatch_pid"], (*k)->pid());
  for (const json& t : p["threads"]) {
    EXPECT_EQ(t["kwatch"], 2) << t.dump();
    EXPECT_EQ(t["free"], 2) << t.dump();
    EXPECT_EQ(t["external"], 0) << t.dump();
    const json& s0 = t["slots"][0];
    const json& s1 = t["slots"][1];
    EXPECT_EQ(s0["state"], "armed") << s0.dump();
    EXPECT_EQ(s0["kind"], "exec");
    EXPECT_EQ(s0["len"], 1);
    EXPECT_EQ(std::stoull(s0["addr"].get<std::string>(), nullptr, 16), tick.addr);
    EXPECT_EQ(s0["labels"], json::array({"probe #1 hw_tick (hw_tick)"})) << s0.dump();
    EXPECT_EQ(s1["kind"], "exec");
    EXPECT_EQ(std::stoull(s1["addr"].get<std::string>(), nullptr, 16), done.addr);
    EXPECT_EQ(s1["labels"], json::array({"probe #2 hw_done (hw_done)"})) << s1.dump();
    EXPECT_EQ(t["slots"][2]["state"], "free");
    EXPECT_EQ(t["slots"][3]["state"], "free");
  }

  Go();
  auto r = (*k)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->err;
  const Output o = Split(r->out);
  // The program's own output is that of an unprobed run.
  EXPECT_EQ(o.target, std::vector<std::string>(
                          {"ready", absl::StrCat("sum=", 3 * TickSum(1000), " traps=0")}));
  const json& s = o.summary;
  EXPECT_EQ(s["backend"], "hw");
  EXPECT_EQ(s["stop_reason"], "target exited");
  EXPECT_EQ(s["exit_code"], 0);
  EXPECT_EQ(s["external_slots"], 0);
  EXPECT_EQ(s["stray_traps"], 0);
  ASSERT_EQ(s["probes"].size(), 2u);
  EXPECT_EQ(s["probes"][0]["debug_register"], 0);
  EXPECT_EQ(s["probes"][1]["debug_register"], 1);
  EXPECT_THAT(s["notes"][0].get<std::string>(),
              HasSubstr("hw: probe #1 hw_tick (hw_tick): debug register DR0"));
  // The publication went with the session.
  EXPECT_FALSE(fs::exists(absl::StrCat(dir_, "/kwatch-", (*k)->pid(), ".json")));
  KW_REQUIRE_DEBUG_TRAPS();
  EXPECT_EQ(s["hits"], 3001);
  EXPECT_EQ(s["probes"][0]["hits"], 3000);
  EXPECT_EQ(s["probes"][0]["args"][0]["distinct"], 1000);
  EXPECT_EQ(s["probes"][1]["hits"], 1);
}

TEST_F(ProbeHwTest, HitsAndOutputOfARunEqualTheInt3Path) {
  const RunResult plain =
      kwatch::testing::Run({TargetPath("hw_probe_target"), "run", "50"}).value();
  ASSERT_EQ(plain.exit_code, 0);
  const RunResult r = Kwatch({"probe", "--hw", "--json", "hw_tick i r->len r->name:string",
                              "hw_done sum", "--", TargetPath("hw_probe_target"), "run", "50"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Output o = Split(r.out);
  EXPECT_EQ(absl::StrCat(absl::StrJoin(o.target, "\n"), "\n"), plain.out);
  EXPECT_EQ(plain.out, absl::StrCat("sum=", TickSum(50), " traps=0\n"));
  EXPECT_EQ(o.summary["backend"], "hw");
  KW_REQUIRE_DEBUG_TRAPS();
  // Where traps arrive: the same hits, fields and values as the INT3 engine gives.
  const RunResult i = Kwatch({"probe", "--json", "hw_tick i r->len r->name:string", "hw_done sum",
                              "--", TargetPath("hw_probe_target"), "run", "50"});
  ASSERT_EQ(i.exit_code, 0) << i.err;
  const Output io = Split(i.out);
  ASSERT_EQ(o.hits.size(), 51u);
  ASSERT_EQ(io.hits.size(), 51u);
  for (size_t n = 0; n < o.hits.size(); ++n) {
    for (const char* f : {"event", "function", "offset", "file", "line", "args", "is_return"}) {
      EXPECT_EQ(o.hits[n][f], io.hits[n][f]) << n << " " << f;
    }
  }
  EXPECT_EQ(o.hits[50]["args"]["sum"], TickSum(50));
}

TEST_F(ProbeHwTest, AFifthAddressIsRefusedNamingTheProbesThatGotRegisters) {
  const RunResult r = Kwatch({"probe", "--hw", "hw_tick", "hw_done", "main", "kw_forge_call",
                              "tick2=worker", "--", TargetPath("hw_probe_target"), "run", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");  // refused before the program was started
  EXPECT_EQ(r.err,
            "kwatch: error: probe #5 tick2 (worker): no debug register free (DR0-DR3 held by "
            "probes #1-#4); placed: DR0 #1 hw_tick, DR1 #2 hw_done, DR2 #3 main, DR3 #4 "
            "kw_forge_call. --hw needs one debug register per probed address and x86 has 4 per "
            "thread: drop --hw to use INT3 breakpoints, or probe fewer addresses\n");
  // Probes at one address share a register: five probes, four addresses.
  const RunResult s =
      Kwatch({"probe", "--hw", "-q", "hw_tick i", "again=hw_tick r->len", "hw_done", "main",
              "kw_forge_call", "--", TargetPath("hw_probe_target"), "run", "3"});
  EXPECT_EQ(s.exit_code, 0) << s.err;
  EXPECT_THAT(s.err, HasSubstr("probe #1 hw_tick (hw_tick): debug register DR0"));
  EXPECT_THAT(s.err, HasSubstr("(shared with probe #2: same address)"));
  EXPECT_THAT(s.err, HasSubstr("probe #2 again (hw_tick): debug register DR0"));
  EXPECT_THAT(s.err, HasSubstr("probe #3 hw_done (hw_done): debug register DR1"));
  EXPECT_THAT(s.err, HasSubstr("probe #5 kw_forge_call (kw_forge_call): debug register DR3"));
  EXPECT_THAT(s.out, HasSubstr(absl::StrCat("sum=", TickSum(3), " traps=0\n")));
}

TEST_F(ProbeHwTest, RegistersHeldByAnotherToolAreLearnedAndTheRestRefused) {
  auto t = Spawned::Start({TargetPath("hw_probe_target"), "threads", "1", "10", gofile_});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->WaitForStdout("ready").ok());
  const pid_t pid = (*t)->pid();
  // Another tool holds two registers of the main thread.
  static uint64_t a, b;
  core::UniqueFd held[2] = {HoldBreakpointSlot(pid, reinterpret_cast<uint64_t>(&a)),
                            HoldBreakpointSlot(pid, reinterpret_cast<uint64_t>(&b))};
  ASSERT_TRUE(held[0] && held[1]);
  const RunResult r =
      Kwatch({"probe", "--hw", "-p", absl::StrCat(pid), "hw_tick", "hw_done", "main"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(std::regex_search(
      r.err,
      std::regex(absl::StrCat(
          R"(kwatch: error: probe #3 main \(main\): no debug register free \(DR[0-3], DR[0-3] held )"
          R"(by probes #1, #2, 2 held outside kwatch \(another tool or a debugger: `kwatch slots )"
          R"(-p )",
          pid,
          R"(` shows them\)\); placed: DR[0-3] #1 hw_tick, DR[0-3] #2 hw_done\. --hw needs )"))))
      << r.err;
  EXPECT_EQ(r.out, "");
  // Nothing was left behind: no register counted for kwatch (the main thread's two are the
  // other tool's), every thread's DR0-DR3 and DR7 are 0, and the program goes on.
  const json slots = SlotsOf(pid, 2);
  ASSERT_EQ(slots["threads"].size(), 2u) << slots.dump();
  for (const json& th : slots["threads"]) {
    const bool main_thread = th["tid"] == pid;
    EXPECT_EQ(th["kwatch"], 0) << th.dump();
    EXPECT_EQ(th["external"], main_thread ? 2 : 0) << th.dump();
    EXPECT_EQ(th["free"], main_thread ? 2 : 4) << th.dump();
  }
  const auto regs = DebugRegisters(pid);
  EXPECT_EQ(regs.size(), 2u);
  for (const auto& [tid, v] : regs) {
    EXPECT_EQ(v, std::vector<uint64_t>(5, 0)) << "thread " << tid;
  }
  Go();
  auto tr = (*t)->Finish();
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(tr->exit_code, 0);
  EXPECT_EQ(tr->out, absl::StrCat("ready\nsum=", TickSum(10), " traps=0\n"));
}

TEST_F(ProbeHwTest, InterruptClearsEveryThreadsRegistersAndDetaches) {
  auto t = Spawned::Start({TargetPath("hw_probe_target"), "threads", "2", "10", gofile_});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->WaitForStdout("ready").ok());
  const pid_t pid = (*t)->pid();
  auto k = Spawned::Start(
      {KwatchPath(), "probe", "--hw", "-p", absl::StrCat(pid), "hw_tick i", "hw_done sum"});
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE((*k)->WaitForStderr("armed").ok()) << (*k)->err();
  ASSERT_TRUE((*k)->WaitForStderr("probe #2").ok()) << (*k)->err();
  ASSERT_EQ(::kill((*k)->pid(), SIGINT), 0);
  auto kr = (*k)->Finish();
  ASSERT_TRUE(kr.ok());
  EXPECT_EQ(kr->exit_code, 0) << kr->err;
  EXPECT_THAT(kr->err, HasSubstr(absl::StrCat("kwatch: debug registers cleared, detached; target ",
                                              pid, " keeps running")));
  EXPECT_THAT(kr->out, HasSubstr("hw backend (interrupted by INT)"));
  // Every thread's registers are free again (the breakpoints closed with the session), and
  // ptrace's DR0-DR3 and DR7 are 0.
  const json slots = SlotsOf(pid, 0);
  ASSERT_EQ(slots["threads"].size(), 3u) << slots.dump();
  for (const json& th : slots["threads"]) {
    EXPECT_EQ(th["free"], 4) << th.dump();
  }
  const auto regs = DebugRegisters(pid);
  EXPECT_EQ(regs.size(), 3u);
  for (const auto& [tid, r] : regs) {
    EXPECT_EQ(r, std::vector<uint64_t>(5, 0)) << "thread " << tid;
  }
  Go();
  auto tr = (*t)->Finish();
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(tr->exit_code, 0);
  EXPECT_EQ(tr->out, absl::StrCat("ready\nsum=", 2 * TickSum(10), " traps=0\n"));
}

TEST_F(ProbeHwTest, ReturnProbesUprobeBackendForksAndMidInstructionAreRefused) {
  const std::string target = TargetPath("hw_probe_target");
  RunResult r = Kwatch({"probe", "--hw", "hw_tick%return $retval", "--", target, "run", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "kwatch: error: probe #1 hw_tick__return (hw_tick%return): --hw cannot place return "
            "probes: a return is caught at the caller's return address, a different place for "
            "each call, which the INT3 engine swaps for a trampoline on the stack at entry; drop "
            "--hw for %return probes (or probe the function's ret instruction, e.g. FUNC+OFF, "
            "with --hw)\n");
  r = Kwatch({"probe", "--hw", "--backend", "uprobe", "hw_tick", "--", target, "run", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "kwatch: error: --hw and --backend uprobe exclude each other: the uprobe PMU is the "
            "kernel's own INT3 breakpoint in the file's code, while --hw places execute "
            "breakpoints in the debug registers of the threads kwatch traces (ptrace); drop one "
            "of them\n");
  r = Kwatch({"probe", "--hw", "-f", "hw_tick", "--", target, "run", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("kwatch: error: --hw does not follow forks yet"));
  // Not an instruction boundary: the same refusal as for INT3 probes.
  r = Kwatch({"probe", "--hw", "hw_tick+0x1", "--", target, "run", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("hw_tick+0x1 is inside '"));
  EXPECT_THAT(r.err, HasSubstr("probe an instruction boundary"));
  EXPECT_EQ(r.out, "");
  // --help says what --hw does.
  r = Kwatch({"probe", "--help"});
  EXPECT_THAT(r.out, HasSubstr("--hw"));
  EXPECT_THAT(r.out, HasSubstr("the program's code is never modified"));
}

// ---- the hit path, in-process: the test is the tracer and names the forged trap's breakpoint ----

// A launched hw_probe_target (forge or burst mode) with --hw probes from `specs`.
class Forged {
 public:
  Forged(const std::vector<std::string>& specs, const std::vector<std::string>& args) {
    const std::string path = TargetPath("hw_probe_target");
    auto set = watch::probe::ResolveProbes(path, specs);
    EXPECT_TRUE(set.ok()) << set.status();
    if (!set.ok()) {
      return;
    }
    set_ = *std::move(set);
    std::vector<std::string> argv = {path};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = core::ptrace::Process::Launch(argv);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) {
      return;
    }
    proc = *std::move(p);
    EXPECT_TRUE(proc->RunToEntry().ok());
    auto maps = proc->Maps();
    auto bias = set_.target->LoadBias(*maps);
    EXPECT_TRUE(bias.ok()) << bias.status();
    load_bias = bias.value_or(0);
    auto syms = core::symbols::Symbols::ForProcess(proc->pid());
    EXPECT_TRUE(syms.ok()) << syms.status();
    symbols_ = *std::move(syms);
    symbolizer_ = std::make_unique<core::symbols::Symbolizer>(*symbols_);
  }
  ~Forged() {
    hw.reset();
    if (proc != nullptr && proc->alive()) {
      (void)proc->Kill();
    }
  }
  Forged(const Forged&) = delete;
  Forged& operator=(const Forged&) = delete;
  bool ok() const { return proc != nullptr && symbolizer_ != nullptr; }

  void Arm(HwProbes::HitFn on_hit) {
    hw = std::make_unique<HwProbes>(*proc, *symbolizer_, set_.probes, load_bias, std::move(on_hit));
    const absl::Status s = hw->Arm();  // resumes the target
    ASSERT_TRUE(s.ok()) << s;
  }
  uint64_t Address(const std::string& sym) const {
    return set_.target->SymbolAddress(sym).value_or(core::RemoteAddr{}).value + load_bias;
  }
  uint64_t Read(const std::string& sym) const {
    uint64_t v = 0;
    EXPECT_TRUE(proc->ReadMemory(core::RemoteAddr{Address(sym)},
                                 std::span<uint8_t>(reinterpret_cast<uint8_t*>(&v), 8))
                    .ok());
    return v;
  }
  void Go(uint64_t step) const {
    ASSERT_TRUE(proc->WriteMemory(core::RemoteAddr{Address("g_go")},
                                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&step),
                                                           sizeof(step)))
                    .ok());
  }
  // Runs the target to its next SIGUSR1 milestone.
  void WaitMilestone() const {
    for (;;) {
      auto ev = proc->Poll(true);
      ASSERT_TRUE(ev.ok()) << ev.status();
      for (const core::ptrace::ProcessEvent& e : *ev) {
        ASSERT_NE(e.kind, core::ptrace::ProcessEvent::Kind::kExited) << "target ended early";
        if (e.kind == core::ptrace::ProcessEvent::Kind::kSignal && e.signal == SIGUSR1) {
          return;
        }
      }
    }
  }
  // The perf data of kwatch's breakpoint in debug register `dr` of the main thread.
  uint64_t SigDataOf(int dr) const {
    for (const watch::TrapBreakpoints::Event& e : hw->backend()->breakpoints().Events()) {
      if (e.tid == proc->pid() && e.reg == dr) {
        return e.sig_data;
      }
    }
    ADD_FAILURE() << "no breakpoint in DR" << dr;
    return 0;
  }
  // The forged traps carry `data` (g_sig_data in the target).
  void SetSigData(uint64_t data) const {
    ASSERT_TRUE(proc->WriteMemory(core::RemoteAddr{Address("g_sig_data")},
                                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&data),
                                                           sizeof(data)))
                    .ok());
  }
  void RunToExit() const {
    while (proc->alive()) {
      auto ev = proc->Poll(true);
      ASSERT_TRUE(ev.ok()) << ev.status();
    }
  }
  const std::vector<ProbeDef>& probes() const { return set_.probes; }

  std::unique_ptr<core::ptrace::Process> proc;
  std::unique_ptr<HwProbes> hw;
  uint64_t load_bias = 0;

 private:
  ProbeSet set_;
  std::unique_ptr<core::symbols::Symbols> symbols_;
  std::unique_ptr<core::symbols::Symbolizer> symbolizer_;
};

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) {
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

TEST(ProbeHwForged, ExecuteTrapGivesTheHitLineAndArgumentsExactly) {
  Forged f({"hw_tick i r->len r->name:string rsi=%si"}, {"forge", "4"});
  ASSERT_TRUE(f.ok());
  core::UniqueFd text(::memfd_create("hw-text", MFD_CLOEXEC));
  core::UniqueFd jsonl(::memfd_create("hw-json", MFD_CLOEXEC));
  PrinterOptions to;
  to.start_ns = 0;
  ProbeTextPrinter text_sink(text.get(), to);
  ProbeJsonPrinter json_sink(jsonl.get(), to);
  struct Seen {
    pid_t tid;
    uint64_t rip, rdi, rsi, eflags, ip;
  };
  std::vector<Seen> seen;
  const core::symbols::MemoryReader read = [&f](core::RemoteAddr a, std::span<uint8_t> out) {
    return f.proc->ReadMemory(a, out);
  };
  f.Arm([&](const HwProbes::Hit& h) {
    seen.push_back({h.tid, h.regs->rip, h.regs->rdi, h.regs->rsi, h.regs->eflags, h.ip.value});
    const ProbeHit hit = EvaluateHwHit(h, f.proc->pid(), f.load_bias, read);
    text_sink.Add(hit);
    json_sink.Add(hit);
  });
  const int dr = f.hw->RegisterOf(1);
  ASSERT_EQ(dr, 0);
  const uint64_t tick = f.Address("hw_tick");
  const uint64_t rec = f.Address("g_rec");
  // Calls 0-2 trap with the data of the probe's breakpoint; call 3 with kwatch's data of a
  // breakpoint it no longer has (a late trap no probe explains: dropped, and not passed to the
  // program either).
  const uint64_t data = f.SigDataOf(dr);
  EXPECT_TRUE(core::ptrace::IsKwatchSigData(data));
  for (uint64_t k = 1; k <= 4; ++k) {
    f.WaitMilestone();
    f.SetSigData(k <= 3 ? data : data ^ (uint64_t{1} << 12));
    f.Go(k);
  }
  f.WaitMilestone();
  EXPECT_EQ(f.Read("g_traps"), 0u);
  EXPECT_EQ(static_cast<long>(f.Read("g_sink")), TickSum(4));
  f.Go(5);
  f.RunToExit();
  EXPECT_FALSE(f.proc->exit_info()->signaled);
  EXPECT_EQ(f.proc->exit_info()->code, 0);
  EXPECT_EQ(f.hw->stray_traps(), 1u);

  ASSERT_EQ(seen.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].tid, f.proc->pid());
    EXPECT_EQ(seen[i].ip, tick);
    EXPECT_EQ(seen[i].rip, tick);  // stopped before the probed instruction
    EXPECT_EQ(seen[i].rdi, i);
    EXPECT_EQ(seen[i].rsi, rec);
    EXPECT_NE(seen[i].eflags & 0x10000, 0u) << "RF, as the kernel sets it for an execute trap";
  }
  text_sink.Flush();
  json_sink.Flush();
  const int line = SourceLine("return 3 * i + r->len;");
  const std::vector<std::string> lines =
      absl::StrSplit(ReadAll(text.get()), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const std::string re = absl::StrCat(
        R"(^[0-9]+\.[0-9]{6} +)", f.proc->pid(), R"( +hw_tick +hw_tick \(hw_probe_target\.c:)",
        line, R"(\) +i=)", i, R"( r->len=100 r->name_string="hw" rsi=0x)", absl::Hex(rec), "$");
    EXPECT_TRUE(std::regex_match(lines[i], std::regex(re))) << lines[i] << "\n" << re;
  }
  const std::vector<std::string> objs =
      absl::StrSplit(ReadAll(jsonl.get()), '\n', absl::SkipEmpty());
  ASSERT_EQ(objs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const json j = json::parse(objs[i]);
    EXPECT_EQ(j["type"], "hit");
    EXPECT_EQ(j["pid"], f.proc->pid());
    EXPECT_EQ(j["tid"], f.proc->pid());
    EXPECT_EQ(j["probe"], 1);
    EXPECT_EQ(j["event"], "hw_tick");
    EXPECT_EQ(std::stoull(j["ip"].get<std::string>(), nullptr, 16), tick);
    EXPECT_EQ(j["function"], "hw_tick");
    EXPECT_EQ(j["offset"], 0);
    EXPECT_EQ(j["line"], line);
    EXPECT_EQ(j["file"].get<std::string>().ends_with("hw_probe_target.c"), true) << j.dump();
    EXPECT_EQ(j["is_return"], false);
    EXPECT_EQ(j["args"], json({{"i", i},
                               {"r->len", 100},
                               {"r->name_string", "hw"},
                               {"rsi", absl::StrCat("0x", absl::Hex(rec))}}))
        << j.dump();
  }
}

// Traps back to back: each one is one hit, none reaches the program. Prints the cost per forged
// hit, next to the same traps passed on to the program's own SIGTRAP handler by a tracer that
// claims nothing.
TEST(ProbeHwForged, BurstOfTrapsIsOneHitEachAndCostIsPrinted) {
  constexpr int kTraps = 2000;
  double hw_us = 0;
  {
    Forged f({"hw_tick i"}, {"burst", absl::StrCat(kTraps)});
    ASSERT_TRUE(f.ok());
    std::vector<long> is;
    is.reserve(kTraps);
    int dr = -1;
    uint64_t handler_ns = 0;
    const core::symbols::MemoryReader read = [&f](core::RemoteAddr a, std::span<uint8_t> out) {
      return f.proc->ReadMemory(a, out);
    };
    f.Arm([&](const HwProbes::Hit& h) {
      const ProbeHit hit = EvaluateHwHit(h, f.proc->pid(), f.load_bias, read);
      handler_ns += MonotonicNs() - h.time_ns;
      long v = -1;
      (void)absl::SimpleAtoi(hit.args[0].second, &v);
      is.push_back(v);
    });
    dr = f.hw->RegisterOf(1);
    ASSERT_GE(dr, 0);
    f.WaitMilestone();
    f.SetSigData(f.SigDataOf(dr));
    const uint64_t t0 = MonotonicNs();
    f.Go(1);
    f.WaitMilestone();
    hw_us = static_cast<double>(MonotonicNs() - t0) / 1e3 / kTraps;
    EXPECT_EQ(f.Read("g_traps"), 0u);
    EXPECT_EQ(static_cast<long>(f.Read("g_sink")), TickSum(kTraps));
    f.Go(2);
    f.RunToExit();
    EXPECT_EQ(f.proc->exit_info()->code, 0);
    ASSERT_EQ(is.size(), static_cast<size_t>(kTraps));
    for (int i = 0; i < kTraps; ++i) {
      ASSERT_EQ(is[static_cast<size_t>(i)], i);
    }
    std::printf(
        "[ cost ] forged hw probe hit, tracer and target round trip: %.2f us; in kwatch "
        "after the registers were read (symbolize, evaluate): %.2f us\n",
        hw_us, static_cast<double>(handler_ns) / 1e3 / kTraps);
  }
  {
    Forged f({"hw_tick i"}, {"burst", absl::StrCat(kTraps)});
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.proc->ResumeAll().ok());
    f.WaitMilestone();
    const uint64_t t0 = MonotonicNs();
    f.Go(1);
    f.WaitMilestone();
    const double plain_us = static_cast<double>(MonotonicNs() - t0) / 1e3 / kTraps;
    EXPECT_EQ(f.Read("g_traps"), static_cast<uint64_t>(kTraps));  // passed on, one by one
    f.Go(2);
    f.RunToExit();
    std::printf("[ cost ] the same trap passed on to the program's handler (no probes): %.2f us\n",
                plain_us);
  }
}

// Arming cost: N probes (N = 1..4) on a one-thread process, through the stop applier (stop
// the world, open one sigtrap breakpoint per probe in every thread, resume). Printed, and each
// probe's register checked.
TEST(ProbeHwForged, ArmingCostPerProbeCountIsPrinted) {
  const std::vector<std::string> all = {"hw_tick", "hw_done", "main", "kw_forge_call"};
  for (size_t n = 1; n <= 4; ++n) {
    Forged f(std::vector<std::string>(all.begin(), all.begin() + static_cast<long>(n)),
             {"burst", "1"});
    ASSERT_TRUE(f.ok());
    const uint64_t t0 = MonotonicNs();
    f.Arm([](const HwProbes::Hit&) {});
    const double ms = static_cast<double>(MonotonicNs() - t0) / 1e6;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(f.hw->RegisterOf(static_cast<uint32_t>(i + 1)), static_cast<int>(i));
    }
    std::printf("[ cost ] arming %zu hw probe%s on 1 thread: %.3f ms\n", n, n == 1 ? "" : "s", ms);
  }
}

}  // namespace
}  // namespace kwatch::cli
