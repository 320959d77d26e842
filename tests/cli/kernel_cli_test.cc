// End-to-end tests of kernel watches: `kwatch --write &jiffies` and friends, run through the
// real binary against this machine's kernel. Kernel symbol files are fixtures made here from
// /proc/kallsyms; this machine's kernel lacks CONFIG_KALLSYMS_ALL (DESIGN.md).
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/unique_fd.h"
#include "core/store/trace_reader.h"
#include "tests/cli/cli_test_util.h"
#include "tests/core/kernel_core_file.h"
#include "tests/test_util.h"
#include "tests/watch/debug_traps.h"

namespace kwatch::clitest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Fixture maps are made as if the kernel had been linked this much lower than it runs.
constexpr uint64_t kFixtureSlide = 0x1e00000;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Release() {
  utsname u{};
  uname(&u);
  return u.release;
}

struct RawSym {
  uint64_t addr;
  char type;
  std::string name;
};

// The kernel image's lines of /proc/kallsyms (modules left out), parsed here.
std::vector<RawSym> RawKallsyms() {
  std::vector<RawSym> out;
  std::istringstream in(ReadFile("/proc/kallsyms"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.find('[') != std::string::npos) {
      continue;
    }
    char name[512] = {};
    char type = 0;
    unsigned long long addr = 0;
    if (std::sscanf(line.c_str(), "%llx %c %511s", &addr, &type, name) == 3) {
      out.push_back(RawSym{addr, type, name});
    }
  }
  return out;
}

bool IsText(char c) {
  return c == 'T' || c == 't' || c == 'W' || c == 'w';
}

uint64_t AddrOf(const std::vector<RawSym>& syms, const std::string& name) {
  for (const RawSym& s : syms) {
    if (s.name == name) {
      return s.addr;
    }
  }
  return 0;
}

// Where the fixtures put `jiffies`: the first word of the kernel's .data, which on x86-64
// begins with init_stack (__start_init_stack). That word is the idle task's stack-end magic,
// written once at boot: a watch on it never fires, whatever the machine.
uint64_t FixtureDataAddr(const std::vector<RawSym>& syms) {
  return AddrOf(syms, "__start_init_stack");
}

// A System.map of this kernel as its build would have written it with a lower link base:
// every text symbol moved down by kFixtureSlide (every other one by `skew` bytes more), plus
// made-up data lines for `jiffies` and `init_task` at FixtureDataAddr.
std::string FixtureMap(const std::vector<RawSym>& syms, uint64_t skew = 0) {
  std::string out;
  size_t i = 0;
  for (const RawSym& s : syms) {
    if (!IsText(s.type)) {
      continue;
    }
    const uint64_t extra = (skew != 0 && (i++ % 2) == 1) ? skew : 0;
    out += absl::StrFormat("%016x %c %s\n", s.addr - kFixtureSlide + extra, s.type, s.name);
  }
  out += absl::StrFormat("%016x D jiffies\n", FixtureDataAddr(syms) - kFixtureSlide);
  out += absl::StrFormat("%016x D init_task\n", FixtureDataAddr(syms) - kFixtureSlide);
  return out;
}

std::string OnlineCpuList() {
  std::string text = ReadFile("/sys/devices/system/cpu/online");
  std::vector<int> cpus;
  std::istringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    int lo = 0;
    int hi = 0;
    if (std::sscanf(part.c_str(), "%d-%d", &lo, &hi) == 2) {
      for (int c = lo; c <= hi; ++c) {
        cpus.push_back(c);
      }
    } else if (std::sscanf(part.c_str(), "%d", &lo) == 1) {
      cpus.push_back(lo);
    }
  }
  return absl::StrJoin(cpus, ",");
}

// What a kernel session that shows events says on this machine, whose kernel is built without
// CONFIG_PROC_KCORE: values are read through BPF.
constexpr char kNoKcoreNote[] =
    "kwatch: values from kernel memory through BPF (bpf_probe_read_kernel; no /proc/kcore "
    "here), read when kwatch drains the events (~V), not at the access\n";
// What a session that shows values says once its breakpoints carry their BPF program.
constexpr char kAccessNote[] =
    "kwatch: values at the access: a BPF program on each breakpoint reads the watched bytes "
    "when it fires (V; ~V only where that read failed and the drain-time read stood in)\n";

size_t CountOf(const std::string& list) {
  return std::count(list.begin(), list.end(), ',') + 1;
}

class KernelCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kwatch-kernel-cli-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    raw_ = RawKallsyms();
    // Kernel sessions publish their registers for `kwatch slots`: in a private run directory.
    std::string run = absl::StrCat(::testing::TempDir(), "/kwatch-kernel-run-XXXXXX");
    ASSERT_NE(::mkdtemp(run.data()), nullptr);
    run_dir_ = run;
    ::setenv("KWATCH_RUN_DIR", run_dir_.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): one thread
  }
  void TearDown() override {
    ::unsetenv("KWATCH_RUN_DIR");  // NOLINT(concurrency-mt-unsafe): one thread
    std::filesystem::remove_all(run_dir_);
    std::filesystem::remove_all(dir_);
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  // A fixture System.map that also names `n` words kw_0, kw_1, ... at the start of the
  // kernel's .data (init_stack's lowest words: written at boot, never after).
  std::string WordsMap(int n) {
    std::string map = FixtureMap(raw_);
    for (int i = 0; i < n; ++i) {
      absl::StrAppendFormat(&map, "%016x D kw_%d\n", WordAddr(i) - kFixtureSlide, i);
    }
    return Write("words.map", map);
  }
  uint64_t WordAddr(int i) const { return FixtureDataAddr(raw_) + 8 * static_cast<uint64_t>(i); }

  std::filesystem::path dir_;
  std::string run_dir_;
  std::vector<RawSym> raw_;
};

TEST_F(KernelCli, AVariableWithoutKallsymsAllSaysWhatWasTried) {
  size_t text = 0;
  size_t data = 0;
  for (const RawSym& s : raw_) {
    text += IsText(s.type) ? 1 : 0;
    data += std::string("dDbBrRvV").find(s.type) != std::string::npos ? 1 : 0;
  }
  const std::string rel = Release();
  const RunResult r = RunKwatch({"--write", "&max_threads"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  std::string tried;
  for (const std::string& m : {absl::StrCat("/boot/System.map-", rel),
                               absl::StrCat("/lib/modules/", rel, "/build/System.map")}) {
    absl::StrAppend(&tried, "  System.map ", m, ": open(", m, "): No such file or directory\n");
  }
  for (const std::string& v :
       {absl::StrCat("/boot/vmlinux-", rel), absl::StrCat("/usr/lib/debug/boot/vmlinux-", rel),
        absl::StrCat("/usr/lib/debug/boot/vmlinux-", rel, ".debug"),
        absl::StrCat("/lib/modules/", rel, "/build/vmlinux"),
        absl::StrCat("/usr/lib/debug/lib/modules/", rel, "/vmlinux"),
        absl::StrCat("/usr/lib/debug/lib/modules/", rel, "/vmlinux.debug")}) {
    absl::StrAppend(&tried, "  vmlinux ", v, ": open(", v, "): No such file or directory\n");
  }
  EXPECT_EQ(r.err,
            absl::StrFormat(
                "kwatch: error: cannot find kernel symbol 'max_threads': this kernel was built "
                "without CONFIG_KALLSYMS_ALL, so /proc/kallsyms lists functions but not "
                "variables, and no System.map or vmlinux of this kernel (%s) was found.\n"
                "Sources tried:\n"
                "  /proc/kallsyms: no symbol 'max_threads'; it lists %d text symbols but no data "
                "symbols (only %d section boundaries): CONFIG_KALLSYMS_ALL is off\n"
                "%s"
                "Give the kernel's System.map with --system-map FILE, or its vmlinux with debug "
                "info with --vmlinux FILE (from the kernel build, or the distribution's debug "
                "package). kwatch never guesses an address.\n"
                "kwatch: note: no target was given (-p PID or a command after `--`), so kwatch "
                "watched the kernel and looked the expression up among kernel symbols\n",
                rel, text, data, tried));
}

// Without data symbols, System.map or vmlinux (this machine's kernel): jiffies is found in the
// code of jiffies_read, read through BPF, and every write is the tick's.
TEST_F(KernelCli, JiffiesIsFoundInTheCodeOfJiffiesReadAndWrittenByTheTick) {
  const RunResult r = RunKwatch({"--write", "&jiffies", "--json", "--duration", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string prefix = "kwatch: jiffies: 8 bytes at 0x";
  const size_t at = r.err.find(prefix);
  ASSERT_NE(at, std::string::npos) << r.err;
  const uint64_t addr = std::stoull(r.err.substr(at + prefix.size()), nullptr, 16);
  EXPECT_THAT(r.err, HasSubstr(absl::StrFormat(
                         "kwatch: jiffies: 8 bytes at 0x%x, unsigned long, from the code of "
                         "jiffies_read (+0x",
                         addr)));
  EXPECT_THAT(r.err, HasSubstr("), read through BPF\n"));
  EXPECT_THAT(r.err, Not(HasSubstr("no type for")));
  KW_REQUIRE_DEBUG_TRAPS();
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_GE(run.events.size(), 2U) << r.err;
  // Values at the access (a BPF program on the breakpoints): each write is a tick's, so each
  // value is above the one before. Only events that came before the programs were attached
  // (the first ones) have the drain-time value.
  uint64_t last = 0;
  size_t at_access = 0;
  for (const json& e : run.events) {
    EXPECT_EQ(e["access"], "w") << e.dump();
    EXPECT_EQ(e["addr"], absl::StrFormat("0x%x", addr)) << e.dump();
    EXPECT_THAT(e["site"].get<std::string>(), StartsWith("tick_do_update_jiffies64+"));
    ASSERT_TRUE(e["value"].is_number_unsigned()) << e.dump();
    if (e["value_at"] == "access") {
      EXPECT_GT(e["value"].get<uint64_t>(), last) << e.dump();
      last = e["value"].get<uint64_t>();
      ++at_access;
    } else {
      EXPECT_EQ(at_access, 0U) << "a drain-time value after values at the access: " << e.dump();
    }
  }
  ASSERT_GE(at_access, 2U);
  // Each write adds the ticks since the previous one (several after an idle stretch, NOHZ):
  // jiffies counts from tick-aligned updates, so a step of N ticks is N ticks of time, give or
  // take one. The tick is the whole run's time over its ticks (HZ is not known here).
  std::vector<std::pair<uint64_t, uint64_t>> steps;  // (value step, ns between the writes)
  const json* prev = nullptr;
  for (const json& e : run.events) {
    if (e["value_at"] != "access") {
      continue;
    }
    if (prev != nullptr) {
      steps.emplace_back(e["value"].get<uint64_t>() - (*prev)["value"].get<uint64_t>(),
                         e["time_ns"].get<uint64_t>() - (*prev)["time_ns"].get<uint64_t>());
    }
    prev = &e;
  }
  uint64_t all_ticks = 0;
  uint64_t all_ns = 0;
  for (const auto& [step, ns] : steps) {
    all_ticks += step;
    all_ns += ns;
  }
  ASSERT_GT(all_ticks, 0U);
  const double tick = static_cast<double>(all_ns) / static_cast<double>(all_ticks);
  // (A virtual CPU the host preempts between a write and its trap delays one sample: a few
  // steps of a loaded machine may miss by more than a tick.)
  size_t off = 0;
  std::string misses;
  for (const auto& [step, ns] : steps) {
    if (std::abs(static_cast<double>(step) * tick - static_cast<double>(ns)) >= tick) {
      ++off;
      absl::StrAppendFormat(&misses, " %d ticks in %d ns;", step, ns);
    }
  }
  EXPECT_LE(off * 20, steps.size()) << "tick " << tick << " ns:" << misses;
  EXPECT_EQ(run.summary["watches"][0]["source"].get<std::string>().rfind(
                "the code of jiffies_read (+0x", 0),
            0U);
}

// --via: a function with several RIP-relative operands lists them; one of them, named by its
// offset, is watched, and its writes come from that function. The writer of jiffies
// (tick_do_update_jiffies64) names the same address jiffies_read loads.
TEST_F(KernelCli, ViaListsTheOperandsOfAFunctionAndAnOffsetPicksOne) {
  const RunResult listed =
      RunKwatch({"--write", "&x", "--via", "tick_do_update_jiffies64", "--duration", "0.1"});
  EXPECT_EQ(listed.exit_code, 1) << listed.err;
  EXPECT_THAT(listed.err, HasSubstr("kwatch: error: tick_do_update_jiffies64 has "));
  EXPECT_THAT(listed.err, HasSubstr("Say which reads x with --via tick_do_update_jiffies64+OFF\n"));
  const RunResult jiffies = RunKwatch({"--write", "&jiffies", "--duration", "0.1"});
  const std::string prefix = "kwatch: jiffies: 8 bytes at 0x";
  const size_t at = jiffies.err.find(prefix);
  ASSERT_NE(at, std::string::npos) << jiffies.err;
  const uint64_t addr = std::stoull(jiffies.err.substr(at + prefix.size()), nullptr, 16);
  EXPECT_THAT(listed.err, HasSubstr(absl::StrFormat("(0x%x)", addr)));
  // A store to another variable: "+0xOFF: mov %REG, DISP(%rip) (0xADDR)".
  std::string off;
  for (absl::string_view op : absl::StrSplit(listed.err, "; ")) {
    const size_t colon = op.find(": mov %");
    if (colon != absl::string_view::npos && op.find("+0x") != absl::string_view::npos &&
        !absl::StrContains(op, absl::StrFormat("(0x%x)", addr))) {
      off = std::string(op.substr(op.find("+0x") + 1, colon - op.find("+0x") - 1));
      break;
    }
  }
  ASSERT_FALSE(off.empty()) << "no store to another variable in: " << listed.err;
  const RunResult r =
      RunKwatch({"--write", "&last", "--via", absl::StrCat("tick_do_update_jiffies64+", off),
                 "--json", "--duration", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("from the code of tick_do_update_jiffies64 (+", off,
                                            ": mov %")));
  KW_REQUIRE_DEBUG_TRAPS();
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_GE(run.events.size(), 1U) << r.err;
  for (const json& e : run.events) {
    EXPECT_THAT(e["site"].get<std::string>(), StartsWith("tick_do_update_jiffies64+"));
  }
}

TEST_F(KernelCli, FixtureSystemMapResolvesAndArms) {
  const std::string map = Write("System.map", FixtureMap(raw_));
  const uint64_t addr = FixtureDataAddr(raw_);
  ASSERT_NE(addr, 0U);
  const std::string cpus = OnlineCpuList();
  const RunResult r = RunKwatch({"--write", "&jiffies", "--system-map", map, "--duration", "0.2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err,
            absl::StrFormat(
                "kwatch: note: no type for 'jiffies' (System.map and kallsyms carry none, and "
                "the kernel's BTF describes only per-CPU variables): watching 8 bytes; give "
                "--len N or --type TYPE\n"
                "kwatch: jiffies: 8 bytes at 0x%x, from System.map %s (KASLR slide +0x1e00000)\n"
                "%s%s"
                "kwatch: armed 1 kernel watch on %d CPUs (one breakpoint per CPU), perf "
                "breakpoint stream mode\n",
                addr, map, kNoKcoreNote, kAccessNote, CountOf(cpus)));
  EXPECT_EQ(r.out, absl::StrFormat(
                       "TIME(s)        CPU  TID     COMM             ACC WATCH                   "
                       " VALUE (~ = at drain)   IP (after the access)\n"
                       "kwatch: 0 events, 0 lost; --duration 0.2s elapsed\n"
                       "watch #1 jiffies: 8 bytes at 0x%x, write, kernel, CPUs %s: 0 events "
                       "(the kernel counted 0)\n",
                       addr, cpus));
}

// --kcore: a kernel core file that does not map the watched address. The watch is read once
// at arming and says so; the events of such a watch show `?` (the VALUE column is there since
// the file opened).
TEST_F(KernelCli, KcoreThatDoesNotMapTheWatchSaysSo) {
  const std::string map = Write("System.map", FixtureMap(raw_));
  const uint64_t addr = FixtureDataAddr(raw_);
  const uint64_t text = AddrOf(raw_, "_text");
  const std::string kcore = Write(
      "kcore", kwatch::testing::KernelCoreImage({{text, kwatch::testing::PatternBytes(4096, 1)}}));
  const std::string cpus = OnlineCpuList();
  const RunResult r = RunKwatch(
      {"--write", "&jiffies", "--system-map", map, "--kcore", kcore, "--duration", "0.2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err,
            absl::StrFormat(
                "kwatch: note: no type for 'jiffies' (System.map and kallsyms carry none, and "
                "the kernel's BTF describes only per-CPU variables): watching 8 bytes; give "
                "--len N or --type TYPE\n"
                "kwatch: jiffies: 8 bytes at 0x%x, from System.map %s (KASLR slide +0x1e00000)\n"
                "kwatch: values from %s, read when kwatch drains the events (~V), not at the "
                "access\n"
                "kwatch: note: watch #1 jiffies shows no value: %s maps no kernel address 0x%x "
                "(in none of its 1 PT_LOAD segments)\n"
                "%s"
                "kwatch: armed 1 kernel watch on %d CPUs (one breakpoint per CPU), perf "
                "breakpoint stream mode\n",
                addr, map, kcore, kcore, addr, kAccessNote, CountOf(cpus)));
  EXPECT_EQ(r.out, absl::StrFormat(
                       "TIME(s)        CPU  TID     COMM             ACC WATCH                   "
                       " VALUE (~ = at drain)   IP (after the access)\n"
                       "kwatch: 0 events, 0 lost; --duration 0.2s elapsed\n"
                       "watch #1 jiffies: 8 bytes at 0x%x, write, kernel, CPUs %s: 0 events "
                       "(the kernel counted 0)\n",
                       addr, cpus));
}

// --kcore names a file to read: one that is not a kernel core file stops kwatch (exit 1) with
// the reader's error; --kcore is for kernel watches only.
TEST_F(KernelCli, KcoreThatIsNoCoreFileIsAnError) {
  const std::string map = Write("System.map", FixtureMap(raw_));
  const std::string garbage = Write("garbage", std::string(4096, 'x'));
  const RunResult r = RunKwatch({"--write", "&jiffies", "--len", "8", "--system-map", map,
                                 "--kcore", garbage, "--duration", "0.2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, ::testing::EndsWith(absl::StrFormat(
                         "kwatch: error: --kcore %s: %s: not an ELF file\n", garbage, garbage)));
  const std::string missing = (dir_ / "none").string();
  const RunResult gone = RunKwatch({"--write", "&jiffies", "--len", "8", "--system-map", map,
                                    "--kcore", missing, "--duration", "0.2"});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_THAT(gone.err, ::testing::EndsWith(absl::StrFormat(
                            "kwatch: error: --kcore %s: open(%s): No such file or directory\n",
                            missing, missing)));
  const RunResult proc = RunKwatch({"--write", "g", "--kcore", garbage, "--", "/bin/true"});
  EXPECT_EQ(proc.exit_code, 2);
  EXPECT_EQ(proc.err,
            "kwatch: error: --system-map, --vmlinux, --type, --via, --values-at-drain and --kcore "
            "are for kernel watches (no -p and no command)\n");
}

TEST_F(KernelCli, MemberExpressionWithBtfType) {
  const std::string map = Write("System.map", FixtureMap(raw_));
  const uint64_t addr = FixtureDataAddr(raw_);
  // pahole reads the same BTF independently: the offset of task_struct.prio.
  FILE* p = popen("pahole -F btf task_struct 2>/dev/null | grep -E '\\sprio;'", "r");
  ASSERT_NE(p, nullptr);
  unsigned long off = 0;
  unsigned long size = 0;
  char line[256] = {};
  ASSERT_NE(fgets(line, sizeof(line), p), nullptr);
  pclose(p);
  ASSERT_EQ(std::sscanf(std::strstr(line, "/*"), "/* %lu %lu */", &off, &size), 2) << line;
  const RunResult r = RunKwatch({"--write", "init_task.prio", "--type", "struct task_struct",
                                 "--system-map", map, "--duration", "0.2", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(absl::StrFormat(
                         "kwatch: init_task.prio: %d bytes at 0x%x, int, from System.map %s "
                         "(KASLR slide +0x1e00000)\n",
                         size, addr + off, map)));
  EXPECT_THAT(r.out, StartsWith(absl::StrFormat(
                         "{\"type\":\"watch\",\"id\":0,\"expr\":\"init_task.prio\",\"display\":"
                         "\"init_task.prio\",\"addr\":\"0x%x\",\"len\":4,\"kind\":\"write\","
                         "\"type_name\":\"int\",\"backend\":\"perf\"}\n"
                         "{\"type\":\"summary\",\"events\":0,\"lost\":0,\"stop_reason\":"
                         "\"--duration 0.2s elapsed\",\"watches\":[{\"id\":0,\"expr\":"
                         "\"init_task.prio\",\"addr\":\"0x%x\",\"len\":4,\"kind\":\"write\","
                         "\"type\":\"int\",",
                         addr + off, addr + off)));

  // Without a type, a member path cannot be resolved: say how to give one.
  const RunResult untyped = RunKwatch({"--write", "init_task.prio", "--system-map", map});
  EXPECT_EQ(untyped.exit_code, 1);
  EXPECT_EQ(untyped.err,
            "kwatch: error: no type for kernel symbol 'init_task': the kernel's BTF describes "
            "only per-CPU variables, and System.map and kallsyms carry no types; name its type "
            "with --type, e.g. `kwatch --rw 'init_task.prio' --type 'struct task_struct'`\n");
}

// A vmlinux made from this kernel's own first 64 KiB of text symbols (at their offsets from
// _text, linked kFixtureSlide lower), its /proc/version as linux_banner, and C variables with
// DWARF types. The chain reads its symbols (libelf), checks the banner and the slide, and
// takes the member's type from its DWARF (libdw). The variables land in the first pages
// after _text at run time: kernel text, never written, so the session sees 0 events.
TEST_F(KernelCli, FixtureVmlinuxGivesAddressesAndDwarfTypes) {
  const uint64_t text = AddrOf(raw_, "_text");
  std::map<std::string, int> count;
  for (const RawSym& s : raw_) {
    ++count[s.name];
  }
  std::vector<RawSym> picked;
  for (const RawSym& s : raw_) {
    const bool plain = s.name.find_first_not_of(
                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") ==
                       std::string::npos;
    if ((s.type == 'T' || s.type == 't') && s.addr >= text && s.addr < text + 0x10000 &&
        count[s.name] == 1 && plain && !std::isdigit(static_cast<unsigned char>(s.name[0]))) {
      picked.push_back(s);
    }
  }
  std::sort(picked.begin(), picked.end(),
            [](const RawSym& a, const RawSym& b) { return a.addr < b.addr; });
  ASSERT_GE(picked.size(), 16U);
  std::string asm_text = "  .section .text,\"ax\",@progbits\n";
  for (const RawSym& s : picked) {
    if (s.type == 'T') {
      absl::StrAppend(&asm_text, "  .globl ", s.name, "\n");
    }
    absl::StrAppend(&asm_text, absl::StrFormat("  .org 0x%x\n%s:\n", s.addr - text, s.name));
  }
  std::string banner;
  for (char c : ReadFile("/proc/version")) {
    if (c == '\n') {
      banner += "\\n";
    } else {
      if (c == '"' || c == '\\') {
        banner += '\\';
      }
      banner += c;
    }
  }
  absl::StrAppend(&asm_text, "  .byte 0\n  .section .rodata,\"a\"\n  .globl linux_banner\n",
                  "linux_banner:\n  .asciz \"", banner, "\"\n",
                  "  .section .note.GNU-stack,\"\",@progbits\n");
  const std::string s_file = Write("text.S", asm_text);
  const std::string c_file = Write("data.c",
                                   "struct kw_task { long state; int prio; unsigned int flags; };\n"
                                   "struct kw_task init_task;\n"
                                   "volatile unsigned long jiffies;\n");
  const std::string vmlinux = (dir_ / "vmlinux").string();
  auto cc = kwatch::testing::Run({"/usr/bin/gcc", "-g", "-nostdlib", "-static", "-no-pie",
                                  absl::StrFormat("-Wl,-Ttext=0x%x", text - kFixtureSlide),
                                  "-Wl,-e,_text", "-o", vmlinux, s_file, c_file});
  ASSERT_TRUE(cc.ok() && cc->exit_code == 0) << (cc.ok() ? cc->err : cc.status().ToString());
  // Where the linker put them, read back with nm (binutils), independently of kwatch.
  auto nm = kwatch::testing::Run({"/usr/bin/nm", vmlinux});
  ASSERT_TRUE(nm.ok());
  std::map<std::string, uint64_t> link;
  std::istringstream in(nm->out);
  std::string line;
  while (std::getline(in, line)) {
    char name[256] = {};
    char type = 0;
    unsigned long long a = 0;
    if (std::sscanf(line.c_str(), "%llx %c %255s", &a, &type, name) == 3) {
      link[name] = a;
    }
  }
  ASSERT_EQ(link.count("init_task"), 1U);
  const uint64_t prio = link["init_task"] + 8 + kFixtureSlide;  // after 'long state'
  const std::string cpus = OnlineCpuList();
  const RunResult r =
      RunKwatch({"--write", "init_task.prio", "--vmlinux", vmlinux, "--duration", "0.2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The vmlinux has DWARF (gcc -g): kernel code will show with file:line.
  EXPECT_EQ(r.err, absl::StrFormat(
                       "kwatch: init_task.prio: 4 bytes at 0x%x, int, from vmlinux %s (KASLR "
                       "slide +0x1e00000)\n"
                       "%s"
                       "kwatch: kernel source lines from %s\n"
                       "%s"
                       "kwatch: armed 1 kernel watch on %d CPUs (one breakpoint per CPU), perf "
                       "breakpoint stream mode\n",
                       prio, vmlinux, kNoKcoreNote, vmlinux, kAccessNote, CountOf(cpus)));
  EXPECT_THAT(r.out, HasSubstr(absl::StrFormat(
                         "watch #1 init_task.prio: 4 bytes at 0x%x, int, write, kernel, CPUs %s: "
                         "0 events (the kernel counted 0)\n",
                         prio, cpus)));

  // --stack: every breakpoint also samples the kernel callchain.
  const RunResult stacked = RunKwatch(
      {"--write", "init_task.prio", "--vmlinux", vmlinux, "--stack", "--duration", "0.2"});
  EXPECT_EQ(stacked.exit_code, 0) << stacked.err;
  EXPECT_THAT(stacked.err,
              HasSubstr(absl::StrFormat("kwatch: armed 1 kernel watch on %d CPUs (one breakpoint "
                                        "per CPU), perf breakpoint stream mode, callchains of "
                                        "up to 16 frames (--stack)\n",
                                        CountOf(cpus))));

  // The same file with another banner is another build: refused.
  const std::string other =
      Write("other.S",
            absl::StrCat(asm_text.substr(0, asm_text.find("linux_banner:")),
                         "linux_banner:\n  .asciz \"Linux version 0.0.1 (nobody@nowhere)\\n\"\n"));
  const std::string vmlinux2 = (dir_ / "vmlinux2").string();
  cc = kwatch::testing::Run({"/usr/bin/gcc", "-nostdlib", "-static", "-no-pie",
                             absl::StrFormat("-Wl,-Ttext=0x%x", text - kFixtureSlide),
                             "-Wl,-e,_text", "-o", vmlinux2, other, c_file});
  ASSERT_TRUE(cc.ok() && cc->exit_code == 0) << (cc.ok() ? cc->err : cc.status().ToString());
  const RunResult refused = RunKwatch({"--write", "&jiffies", "--vmlinux", vmlinux2});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err,
              StartsWith(absl::StrFormat("kwatch: error: refusing --vmlinux %s: %s is another "
                                         "kernel build: its linux_banner is 'Linux version "
                                         "0.0.1 (nobody@nowhere)', /proc/version says '",
                                         vmlinux2, vmlinux2)));
}

// The copy-to-user paths a read(2) into user memory takes: the function that holds the
// copying instruction (`rep movsb` inlined into _copy_to_iter/_copy_to_user on CPUs with
// FSRM, else rep_movs_alternative or copy_user_generic's helpers).
std::string CopyToUserSite() {
  return "(_copy_to_iter|_copy_to_user|copy_to_user[a-z_]*|copy_page_to_iter[a-z_]*|"
         "rep_movs_alternative|copy_user_[a-z_]+|__copy_user[a-z_]*)\\+0x[0-9a-f]+";
}

// A program that read()s 8 bytes from a pipe into `buf`, then 8 into `mark`, N times (writing
// both itself too, which must not count), and writes "PID BYTES" to the file argv[2].
std::string PiperSource() {
  return "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n"
         "_Alignas(64) char buf[64];\n"
         "_Alignas(64) char mark[64];\n"
         "int main(int argc, char** argv) {\n"
         "  int n = atoi(argv[1]), fds[2];\n"
         "  if (pipe(fds) != 0) return 1;\n"
         "  long total = 0;\n"
         "  for (int i = 0; i < n; ++i) {\n"
         "    if (write(fds[1], \"12345678\", 8) != 8) return 2;\n"
         "    buf[0] = 0;\n"  // a user write: excluded
         "    total += read(fds[0], buf, 8);\n"
         "    if (write(fds[1], \"abcdefgh\", 8) != 8) return 2;\n"
         "    mark[0] = 0;\n"
         "    total += read(fds[0], mark, 8);\n"
         "  }\n"
         "  FILE* f = fopen(argv[2], \"w\");\n"
         "  if (f == NULL) return 3;\n"
         "  fprintf(f, \"%d %ld\\n\", getpid(), total);\n"
         "  return fclose(f) == 0 ? 0 : 4;\n}\n";
}

// The fields every event object carries, in every mode (docs/output.md "One event schema"),
// with their JSON types; `value_at` when `value` is a number.
void ExpectEventSchema(const json& e) {
  const auto is_hex = [](const json& v) {
    return v.is_string() && v.get<std::string>().rfind("0x", 0) == 0;
  };
  EXPECT_EQ(e["type"], "event") << e.dump();
  EXPECT_TRUE(e["time_ns"].is_number_unsigned()) << e.dump();
  EXPECT_TRUE(e["pid"].is_number_integer()) << e.dump();
  EXPECT_TRUE(e["tid"].is_number_integer()) << e.dump();
  EXPECT_TRUE(e["cpu"].is_number_integer() || e["cpu"].is_null()) << e.dump();
  EXPECT_TRUE(e["access"] == "r" || e["access"] == "w" || e["access"] == "rw" || e["access"] == "x")
      << e.dump();
  EXPECT_TRUE(is_hex(e["addr"])) << e.dump();
  EXPECT_TRUE(e["len"].is_number_unsigned()) << e.dump();
  EXPECT_TRUE(e["expr"].is_string()) << e.dump();
  EXPECT_TRUE(e["field"].is_string()) << e.dump();
  EXPECT_TRUE(is_hex(e["ip"])) << e.dump();
  EXPECT_TRUE(e["function"].is_string()) << e.dump();
  EXPECT_TRUE(e["offset"].is_number_unsigned()) << e.dump();
  EXPECT_TRUE(e["file"].is_string()) << e.dump();
  EXPECT_TRUE(e["line"].is_number_integer()) << e.dump();
  EXPECT_TRUE(e["value"].is_number() || e["value"].is_null()) << e.dump();
  if (e["value"].is_number()) {
    EXPECT_TRUE(e["value_at"] == "access" || e["value_at"] == "drain") << e.dump();
  }
}

// A process watch, a kernel watch and --kernel-accesses: one schema for their events.
TEST_F(KernelCli, EveryModesEventsShareOneSchema) {
  const RunResult process = RunKwatch({"--write", "g_stats.hits", "--backend", "page", "--json",
                                       "--", kwatch::testing::TargetPath("field_writer"), "1", "5",
                                       "--truth", (dir_ / "fw-truth").string()});
  ASSERT_EQ(process.exit_code, 0) << process.err;
  const JsonRun p = ParseJsonLines(process.out);
  ASSERT_EQ(p.events.size(), 5U);
  for (const json& e : p.events) {
    ExpectEventSchema(e);
    EXPECT_EQ(e["function"], "Work");
  }
  const std::string src = Write("piper.c", PiperSource());
  const std::string prog = (dir_ / "piper").string();
  auto cc = kwatch::testing::Run({"/usr/bin/gcc", "-g", "-O1", "-o", prog, src});
  ASSERT_TRUE(cc.ok() && cc->exit_code == 0) << (cc.ok() ? cc->err : cc.status().ToString());
  const RunResult accesses = RunKwatch({"--kernel-accesses", "--write", "buf", "--len", "8",
                                        "--json", "--", prog, "3", (dir_ / "truth").string()});
  ASSERT_EQ(accesses.exit_code, 0) << accesses.err;
  const RunResult kernel = RunKwatch({"--write", "&jiffies", "--json", "--duration", "0.3"});
  ASSERT_EQ(kernel.exit_code, 0) << kernel.err;
  KW_REQUIRE_DEBUG_TRAPS();
  const JsonRun a = ParseJsonLines(accesses.out);
  ASSERT_FALSE(a.events.empty());
  for (const json& e : a.events) {
    ExpectEventSchema(e);
    EXPECT_EQ(e["expr"], "buf");
  }
  const JsonRun k = ParseJsonLines(kernel.out);
  ASSERT_FALSE(k.events.empty());
  for (const json& e : k.events) {
    ExpectEventSchema(e);
    EXPECT_EQ(e["expr"], "&jiffies");
    EXPECT_EQ(e["function"], "tick_do_update_jiffies64");
  }
}

// Without CAP_BPF (and CAP_SYS_ADMIN, which implies it), as in a container that kept
// CAP_PERFMON (a kernel address's breakpoint needs CAP_SYS_ADMIN; a process's does not): no
// value at the access, said once with its reason, and every access seen all the same.
TEST_F(KernelCli, KernelAccessesWithoutBpfHaveNoValuesAndSaySo) {
  const std::string src = Write("piper.c", PiperSource());
  const std::string prog = (dir_ / "piper").string();
  auto cc = kwatch::testing::Run({"/usr/bin/gcc", "-g", "-O1", "-o", prog, src});
  ASSERT_TRUE(cc.ok() && cc->exit_code == 0) << (cc.ok() ? cc->err : cc.status().ToString());
  auto r =
      kwatch::testing::Run({"/usr/bin/setpriv", "--bounding-set", "-bpf,-sys_admin", "--inh-caps",
                            "-bpf,-sys_admin", KwatchPath(), "--kernel-accesses", "--write", "buf",
                            "--len", "8", "--json", "--", prog, "3", (dir_ / "truth").string()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_THAT(r->err, StartsWith("kwatch: note: no values at the access (bpf(BPF_MAP_CREATE, "
                                 "BPF_MAP_TYPE_RINGBUF): Operation not permitted; a BPF program "
                                 "on a breakpoint needs root, or CAP_BPF with CAP_PERFMON)\n"));
  EXPECT_THAT(r->err, Not(HasSubstr(kAccessNote)));
  KW_REQUIRE_DEBUG_TRAPS();
  const JsonRun run = ParseJsonLines(r->out);
  ASSERT_FALSE(run.events.empty());
  for (const json& e : run.events) {
    EXPECT_EQ(e["value"], nullptr) << e.dump();
  }
}

// --kernel-accesses: the program above reads 20 times into each buffer while kwatch watches
// both for the kernel's writes only (exclude_user). Each read is one copy-to-user of 8 bytes;
// the copying instruction may trap once (a `mov` of 8 bytes) or once per byte (`rep movsb`
// traps after every iteration: CPUs with FSRM/ERMS). Whatever the CPU does, it does the same
// for every read: the events of the two buffers alternate in runs of the same length k.
TEST_F(KernelCli, KernelAccessesToAReadBuffer) {
  const std::string src = Write("piper.c", PiperSource());
  const std::string prog = (dir_ / "piper").string();
  auto cc = kwatch::testing::Run({"/usr/bin/gcc", "-g", "-O1", "-o", prog, src});
  ASSERT_TRUE(cc.ok() && cc->exit_code == 0) << (cc.ok() ? cc->err : cc.status().ToString());
  const std::string truth = (dir_ / "truth").string();
  constexpr int kReads = 20;
  const RunResult r = RunKwatch({"--kernel-accesses", "--write", "buf", "mark", "--len", "8",
                                 "--json", "--", prog, std::to_string(kReads), truth});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, StartsWith(kAccessNote));
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "kwatch: armed 2 watches on pid [0-9]+ \\(.*piper\\) for the kernel's "
                         "accesses only \\(exclude_user\\), perf breakpoint stream mode\n"));
  int pid = 0;
  long bytes = 0;
  ASSERT_EQ(std::sscanf(ReadFile(truth).c_str(), "%d %ld", &pid, &bytes), 2);
  EXPECT_EQ(bytes, 2 * 8 * kReads);
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["stop_reason"], "target exited");
  ASSERT_EQ(run.summary["watches"].size(), 2U);
  // What follows needs delivered debug traps (never on this project's earlier VMs).
  KW_REQUIRE_DEBUG_TRAPS();
  EXPECT_EQ(run.summary["lost"], 0);
  EXPECT_EQ(run.summary["events"].get<size_t>(), run.events.size());
  std::vector<json> evs = run.events;
  std::stable_sort(evs.begin(), evs.end(), [](const json& a, const json& b) {
    return a["time"].get<double>() < b["time"].get<double>();
  });
  // Every event: the target's only thread, a kernel write, in a copy-to-user path.
  for (const json& e : evs) {
    EXPECT_EQ(e["tid"], pid) << e.dump();
    EXPECT_EQ(e["comm"], "piper") << e.dump();
    EXPECT_EQ(e["access"], "w") << e.dump();
    EXPECT_THAT(e["site"].get<std::string>(), ::testing::MatchesRegex(CopyToUserSite()))
        << e.dump();
  }
  // Runs of one buffer's events alternate buf, mark, buf, ... one run per read, all of one
  // length k.
  std::vector<std::vector<json>> runs;
  for (const json& e : evs) {
    if (runs.empty() || runs.back().front()["field"] != e["field"]) {
      runs.emplace_back();
    }
    runs.back().push_back(e);
  }
  ASSERT_EQ(runs.size(), 2U * kReads);
  const size_t k = runs.front().size();
  EXPECT_TRUE(k == 1 || k == 8) << "events per 8-byte read: " << k;
  // Values at the access (a BPF program on the breakpoints): each read's last event holds the
  // 8 bytes read(2) delivered, "12345678" in buf and "abcdefgh" in mark (little-endian).
  for (const std::vector<json>& run : runs) {
    for (const json& e : run) {
      EXPECT_EQ(e["value_at"], "access") << e.dump();
    }
    const bool buf = run.front()["field"] == "buf";
    EXPECT_EQ(run.back()["value"].get<int64_t>(),
              buf ? int64_t{0x3837363534333231} : int64_t{0x6867666564636261})
        << run.back().dump();
  }
  std::map<std::string, size_t> per_watch;
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].front()["field"], i % 2 == 0 ? "buf" : "mark") << "run " << i;
    EXPECT_EQ(runs[i].size(), k) << "run " << i << " of " << runs[i].front()["field"];
    per_watch[runs[i].front()["field"]] += runs[i].size();
    if (k == 8 && runs[i].size() == 8) {
      // rep movsb: seven traps on the instruction itself, the last just after it.
      const uint64_t rep = std::stoull(runs[i][0]["ip"].get<std::string>(), nullptr, 16);
      for (size_t j = 1; j < 7; ++j) {
        EXPECT_EQ(runs[i][j]["ip"], runs[i][0]["ip"]) << "run " << i << " event " << j;
      }
      const uint64_t after = std::stoull(runs[i][7]["ip"].get<std::string>(), nullptr, 16);
      EXPECT_GT(after, rep);
      EXPECT_LE(after - rep, 15U) << "an x86 instruction is at most 15 bytes";
    }
  }
  // The summary: events = the kernel's count = kReads * k per watch, and the sites add up.
  for (const json& w : run.summary["watches"]) {
    const std::string field = w["expr"];
    EXPECT_EQ(w["events"].get<size_t>(), kReads * k) << field;
    EXPECT_EQ(w["kernel_count"].get<size_t>(), kReads * k) << field;
    EXPECT_EQ(per_watch[field], kReads * k) << field;
    size_t sum = 0;
    for (const json& site : w["sites"]) {
      sum += site["events"].get<size_t>();
      EXPECT_THAT(site["site"].get<std::string>(), ::testing::MatchesRegex(CopyToUserSite()));
      EXPECT_EQ(site["tasks"], json::array({pid}));
    }
    EXPECT_EQ(sum, kReads * k) << field;
    // Events at the IP of the same task's previous event on its CPU.
    std::map<std::pair<int, int>, std::string> last;
    size_t repeated = 0;
    for (const json& e : evs) {
      if (e["field"] != field) {
        continue;
      }
      const std::pair<int, int> key{e["cpu"].get<int>(), e["tid"].get<int>()};
      auto it = last.find(key);
      repeated += (it != last.end() && it->second == e["ip"]) ? 1 : 0;
      last[key] = e["ip"];
    }
    EXPECT_EQ(w["repeated_ip_events"].get<size_t>(), repeated) << field;
  }

  // The text summary shows the same sites, most events first, and explains repeated IPs.
  const RunResult text = RunKwatch({"--kernel-accesses", "--write", "buf", "--len", "8", "-q", "--",
                                    prog, std::to_string(kReads), truth});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out,
              HasSubstr(absl::StrFormat("kwatch: %d events, 0 lost; target exited\n", kReads * k)));
  EXPECT_THAT(text.out, HasSubstr(absl::StrFormat(": %d events (the kernel counted %d)\n",
                                                  kReads * k, kReads * k)));
  const size_t table = text.out.find(
      "kernel sites of watch #1 buf (the IP the CPU reported: after the access):\n"
      "    EVENTS  TASKS  CPUS      SITE\n");
  ASSERT_NE(table, std::string::npos) << text.out;
  std::istringstream in(text.out.substr(table));
  std::string line;
  std::getline(in, line);
  std::getline(in, line);
  size_t sum = 0;
  while (std::getline(in, line)) {
    size_t n = 0;
    size_t tasks = 0;
    std::array<char, 64> cpus{};
    std::array<char, 256> site{};
    ASSERT_EQ(std::sscanf(line.c_str(), "%zu %zu %63s %255s", &n, &tasks, cpus.data(), site.data()),
              4)
        << line;
    EXPECT_EQ(tasks, 1U) << line;
    EXPECT_THAT(std::string(site.data()), ::testing::MatchesRegex(CopyToUserSite())) << line;
    sum += n;
  }
  EXPECT_EQ(sum, kReads * k);
  EXPECT_THAT(text.err,
              HasSubstr("kwatch: note: a rep string instruction traps after each iteration"));
}

// A program that finds the top of its own kernel stack (the kernel stack pointer of a
// context-switch sample, PERF_SAMPLE_REGS_INTR, rounded up to THREAD_SIZE = argv[3]: x86-64
// kernel stacks are THREAD_SIZE-aligned), writes "PID TOP" to argv[1], waits for SIGUSR1,
// makes argv[2] getppid() system calls, then waits for SIGUSR2 and exits.
std::string KstackSource() {
  return R"(#define _GNU_SOURCE
#include <asm/perf_regs.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char** argv) {
  const uint64_t thread_size = strtoull(argv[3], NULL, 0);
  struct perf_event_attr a;
  memset(&a, 0, sizeof a);
  a.type = PERF_TYPE_SOFTWARE;
  a.size = sizeof a;
  a.config = PERF_COUNT_SW_CONTEXT_SWITCHES;
  a.sample_period = 1;
  a.sample_type = PERF_SAMPLE_REGS_INTR;
  a.sample_regs_intr = 1ULL << PERF_REG_X86_SP;
  a.exclude_user = 1;
  int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
  if (fd < 0) return 10;
  long page = sysconf(_SC_PAGESIZE);
  char* ring = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (ring == MAP_FAILED) return 11;
  struct timespec ts = {0, 1000000};
  nanosleep(&ts, NULL);
  struct perf_event_mmap_page* meta = (struct perf_event_mmap_page*)ring;
  if (meta->data_head == 0) return 12;
  __sync_synchronize();
  const char* rec = ring + meta->data_offset;
  struct perf_event_header h;
  uint64_t abi = 0, sp = 0;
  memcpy(&h, rec, sizeof h);
  memcpy(&abi, rec + 8, 8);
  memcpy(&sp, rec + 16, 8);
  if (h.type != PERF_RECORD_SAMPLE || abi == 0) return 13;
  close(fd);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGUSR2);
  sigprocmask(SIG_BLOCK, &set, NULL);
  FILE* f = fopen(argv[1], "w");
  fprintf(f, "%d 0x%llx\n", getpid(), (unsigned long long)((sp | (thread_size - 1)) + 1));
  fclose(f);
  int sig = 0;
  sigwait(&set, &sig);
  long n = atol(argv[2]);
  for (long i = 0; i < n; ++i) syscall(SYS_getppid);
  sigwait(&set, &sig);
  return 0;
}
)";
}

// THREAD_SIZE of this kernel: 16 KiB on x86-64, 32 KiB with KASAN.
uint64_t KernelThreadSize() {
  auto cfg =
      kwatch::testing::Run({"/bin/sh", "-c", "zcat /proc/config.gz | grep -c '^CONFIG_KASAN=y'"});
  return cfg.ok() && cfg->out == "1\n" ? 0x8000 : 0x4000;
}

// The system call a task is in (/proc/PID/syscall's first word: the number, "running" or -1)
// and how often it has blocked (voluntary context switches).
std::string SyscallOf(int pid) {
  return ReadFile(absl::StrCat("/proc/", pid, "/syscall"));
}
long VoluntarySwitches(int pid) {
  const std::string status = ReadFile(absl::StrCat("/proc/", pid, "/status"));
  const size_t at = status.find("voluntary_ctxt_switches:");
  return at == std::string::npos ? -1 : std::atol(status.c_str() + at + 24);
}

// A kernel address that kernel code writes, named by a fixture System.map: the orig_ax word of
// a task's pt_regs at the top of its kernel stack, which entry_SYSCALL_64 pushes on every
// system call the task makes (and sync_regs copies on interrupts and exceptions from user
// mode). The task is the program above; while it lives nobody else uses its stack.
class KernelStackWord : public KernelCli {
 protected:
  void SetUp() override {
    KernelCli::SetUp();
    const std::string src = Write("kstack.c", KstackSource());
    prog_ = (dir_ / "kstack").string();
    auto cc = kwatch::testing::Run({"/usr/bin/gcc", "-O1", "-o", prog_, src});
    ASSERT_TRUE(cc.ok() && cc->exit_code == 0) << (cc.ok() ? cc->err : cc.status().ToString());
    const std::string where = (dir_ / "kstack.txt").string();
    auto t = kwatch::testing::Spawned::Start(
        {prog_, where, std::to_string(kSyscalls), absl::StrFormat("0x%x", KernelThreadSize())});
    ASSERT_TRUE(t.ok()) << t.status();
    target_ = *std::move(t);
    for (int i = 0; i < 200 && !absl::StrContains(ReadFile(where), '\n'); ++i) {
      usleep(10000);
    }
    unsigned long long top = 0;
    ASSERT_EQ(std::sscanf(ReadFile(where).c_str(), "%d %llx", &pid_, &top), 2)
        << "kstack could not learn its kernel stack: " << target_->err();
    // struct pt_regs (168 bytes, no FRED padding here) ends at the top: orig_ax is its 16th word.
    constexpr uint64_t kPtRegsBytes = 168;
    constexpr uint64_t kOrigAxOffset = uint64_t{15} * 8;
    word_ = top - kPtRegsBytes + kOrigAxOffset;
    map_ = Write("System.map",
                 FixtureMap(raw_) + absl::StrFormat("%016x D kw_orig_ax\n", word_ - kFixtureSlide));
  }

  // Runs kwatch on kw_orig_ax with `args`; once armed (and `after_armed` returned) lets the
  // target make its system calls,
  // waits until it blocks in its second sigwait (kSyscalls + 1 entries made), gives kwatch
  // 300 ms to drain, interrupts it, and ends the target.
  RunResult WatchWhileTargetCalls(
      const std::vector<std::string>& args,
      const std::function<void(kwatch::testing::Spawned&)>& after_armed = {}) {
    std::vector<std::string> argv = {KwatchPath(), "--write", "kw_orig_ax", "--system-map", map_};
    argv.insert(argv.end(), args.begin(), args.end());
    auto k = kwatch::testing::Spawned::Start(argv);
    EXPECT_TRUE(k.ok()) << k.status();
    if (!k.ok()) {
      return {};
    }
    EXPECT_TRUE((*k)->WaitForStderr("kwatch: armed ").ok()) << (*k)->err();
    if (after_armed) {
      after_armed(**k);
    }
    const long blocked = VoluntarySwitches(pid_);
    kill(pid_, SIGUSR1);
    // Blocked again, in rt_sigtimedwait (128), after the getppid calls.
    for (int i = 0; i < 500; ++i) {
      if (VoluntarySwitches(pid_) > blocked && absl::StartsWith(SyscallOf(pid_), "128 ")) {
        break;
      }
      usleep(10000);
    }
    usleep(300000);
    kill((*k)->pid(), SIGINT);
    auto r = (*k)->Finish();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : RunResult{};
  }

  void TearDown() override {
    if (target_ != nullptr) {
      kill(target_->pid(), SIGUSR2);
      (void)target_->Finish();
    }
    KernelCli::TearDown();
  }

  static constexpr int kSyscalls = 1000;
  std::string prog_;
  std::unique_ptr<kwatch::testing::Spawned> target_;
  int pid_ = 0;
  uint64_t word_ = 0;
  std::string map_;
};

TEST_F(KernelStackWord, EverySystemCallOfTheTaskIsSeen) {
  const std::string cpus = OnlineCpuList();
  const RunResult r = WatchWhileTargetCalls({"--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(absl::StrFormat(
                         "kwatch: kw_orig_ax: 8 bytes at 0x%x, from System.map %s (KASLR slide "
                         "+0x1e00000)\n%s",
                         word_, map_, kNoKcoreNote)));
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrFormat("kwatch: armed 1 kernel watch on %d CPUs", CountOf(cpus))));
  // Each system call's entry writes the word at one IP: no rep string instruction (decoded
  // from the kernel's code, read through BPF), so no rep string note.
  EXPECT_THAT(r.err, Not(HasSubstr("a rep string instruction traps")));
  EXPECT_THAT(r.err, HasSubstr("kwatch: note: the instruction at a repeated IP is no rep string "
                               "instruction: the task ran it again"));
  EXPECT_THAT(r.err, HasSubstr(kAccessNote));
  // Values at the access: the word is pt_regs->orig_ax, which each system call's entry sets to
  // its number (getppid's for each of the task's calls, rt_sigtimedwait's where it blocks),
  // and an interrupt or exception taken in user mode to -1 (sync_regs).
  size_t getppids = 0;
  for (const json& e : ParseJsonLines(r.out).events) {
    EXPECT_EQ(e["value_at"], "access") << e.dump();
    if (absl::StartsWith(e["function"].get<std::string>(), "entry_SYSCALL_64")) {
      EXPECT_TRUE(e["value"] == SYS_getppid || e["value"] == SYS_rt_sigtimedwait) << e.dump();
    } else {
      EXPECT_EQ(e["value"], -1) << e.dump();
    }
    getppids += e["value"] == SYS_getppid ? 1 : 0;
  }
  KW_REQUIRE_DEBUG_TRAPS();
  EXPECT_EQ(getppids, static_cast<size_t>(kSyscalls));
  const JsonRun run = ParseJsonLines(r.out);
  EXPECT_EQ(run.summary["stop_reason"], "interrupted by INT");
  KW_REQUIRE_DEBUG_TRAPS();
  ASSERT_EQ(run.summary["watches"].size(), 1U);
  const json& w = run.summary["watches"][0];
  EXPECT_EQ(run.summary["lost"], 0);
  EXPECT_EQ(w["events"].get<size_t>(), run.events.size());
  EXPECT_EQ(w["kernel_count"].get<size_t>(), run.events.size());
  // Only the target uses its stack while it lives: every event is its own, at a named kernel
  // function, on an online CPU.
  std::map<std::string, size_t> per_site;
  for (const json& e : run.events) {
    EXPECT_EQ(e["tid"], pid_) << e.dump();
    EXPECT_EQ(e["comm"], "kstack") << e.dump();
    EXPECT_EQ(e["addr"], absl::StrFormat("0x%x", word_)) << e.dump();
    EXPECT_THAT(e["site"].get<std::string>(),
                ::testing::MatchesRegex("[A-Za-z_][A-Za-z0-9_.]*\\+0x[0-9a-f]+"))
        << e.dump();
    const std::vector<std::string> online = absl::StrSplit(cpus, ',');
    EXPECT_THAT(online, ::testing::Contains(std::to_string(e["cpu"].get<int>())));
    ++per_site[e["site"].get<std::string>()];
  }
  // The system call entry pushes orig_ax once per call: getppid kSyscalls times, then the
  // second rt_sigtimedwait. Interrupts and faults from user mode add events at other sites.
  ASSERT_FALSE(w["sites"].empty());
  const json& top = w["sites"][0];
  EXPECT_THAT(top["site"].get<std::string>(), StartsWith("entry_SYSCALL_64"));
  EXPECT_EQ(top["events"], kSyscalls + 1);
  EXPECT_EQ(per_site[top["site"].get<std::string>()], kSyscalls + 1U);
  EXPECT_EQ(top["tasks"], json::array({pid_}));
}

// Values at drain time from a kernel core file (--kcore; /proc/kcore has the same format): a
// fixture that maps the page of the watched word with known bytes, the word holding kValue.
// Every event of the live watch shows exactly the fixture's value, marked as read at drain,
// and the recording stores it.
TEST_F(KernelStackWord, ValuesAtDrainComeFromTheKcoreFile) {
  constexpr uint64_t kValue = 0xfedcba9876543210;
  const uint64_t page = word_ & ~uint64_t{0xfff};
  std::vector<uint8_t> bytes = kwatch::testing::PatternBytes(0x1000, 9);
  std::memcpy(bytes.data() + (word_ - page), &kValue, sizeof(kValue));
  const std::string kcore = Write("kcore", kwatch::testing::KernelCoreImage({{page, bytes}}));
  const std::string file = (dir_ / "values.kwdb").string();
  const RunResult r =
      WatchWhileTargetCalls({"--json", "--kcore", kcore, "-o", file, "--values-at-drain"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(absl::StrFormat(
                         "kwatch: values from %s, read when kwatch drains the events (~V), not at "
                         "the access\nkwatch: armed 1 kernel watch on ",
                         kcore)));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("shows no value")));
  const JsonRun run = ParseJsonLines(r.out);
  KW_REQUIRE_DEBUG_TRAPS();
  ASSERT_GE(run.events.size(), kSyscalls + 1U);
  for (const json& e : run.events) {
    EXPECT_EQ(e["value"], static_cast<int64_t>(kValue)) << e.dump();
    EXPECT_EQ(e["value_at"], "drain") << e.dump();
  }
  auto reader = core::store::TraceReader::Open(file);
  ASSERT_TRUE(reader.ok()) << reader.status();
  size_t recorded = 0;
  ASSERT_TRUE((*reader)
                  ->ForEachEvent({},
                                 [&](const core::AccessEvent& e) {
                                   ++recorded;
                                   EXPECT_EQ(e.value, kValue);
                                   EXPECT_FALSE(e.value_exact);
                                   return true;
                                 })
                  .ok());
  EXPECT_EQ(recorded, run.events.size());
}

// The same in text: a VALUE column, each event's value `~V` (signed, as kwatch prints values).
TEST_F(KernelStackWord, ValuesAtDrainInText) {
  constexpr uint64_t kValue = 0x0000000012345678;
  const uint64_t page = word_ & ~uint64_t{0xfff};
  std::vector<uint8_t> bytes = kwatch::testing::PatternBytes(0x1000, 9);
  std::memcpy(bytes.data() + (word_ - page), &kValue, sizeof(kValue));
  const std::string kcore = Write("kcore", kwatch::testing::KernelCoreImage({{page, bytes}}));
  const RunResult r = WatchWhileTargetCalls({"--kcore", kcore, "--values-at-drain"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n');
  ASSERT_GE(lines.size(), 2U);
  EXPECT_EQ(lines[0],
            "TIME(s)        CPU  TID     COMM             ACC WATCH                    VALUE (~ "
            "= at drain)   IP (after the access)");
  KW_REQUIRE_DEBUG_TRAPS();
  size_t events = 0;
  for (size_t i = 1; i < lines.size() && !absl::StartsWith(lines[i], "kwatch: "); ++i) {
    // TIME CPU TID COMM ACC WATCH VALUE SITE
    EXPECT_THAT(lines[i], ::testing::MatchesRegex(absl::StrFormat(
                              "[0-9.]+ +[0-9]+ +%d +kstack +w +kw_orig_ax +~305419896 +[A-Za-z_]"
                              "[A-Za-z0-9_.]*\\+0x[0-9a-f]+",
                              pid_)));
    ++events;
  }
  EXPECT_GE(events, kSyscalls + 1U);
}

// Writes `value` to a sysfs file; false (with the errno text in `why`) on failure.
bool WriteSys(const std::string& path, const std::string& value, std::string* why) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    *why =
        absl::StrCat("open(", path, "): ", std::strerror(errno));  // NOLINT(concurrency-mt-unsafe)
    return false;
  }
  const bool ok = std::fputs(value.c_str(), f) >= 0;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    *why = absl::StrCat("write(", path, ", ", value,
                        "): ", std::strerror(errno));  // NOLINT(concurrency-mt-unsafe)
  }
  return ok && closed;
}

// CPU hotplug: CPU 1 is offline when kwatch arms (one breakpoint, on CPU 0), comes online
// mid-session, kwatch arms it there and says so, and the target's system calls, made on CPU 1
// only, are all seen there. CPU 1 is put back online on every path. Runs alone (RUN_SERIAL in
// tests/cli/serial_tests.cmake): it takes a CPU away from everything else for a moment.
TEST_F(KernelStackWord, CpuComingOnlineMidSessionIsWatched) {
  const std::string cpu1 = "/sys/devices/system/cpu/cpu1/online";
  KW_REQUIRE_FEATURE(access(cpu1.c_str(), W_OK) == 0,
                     "CPU 1 cannot be taken offline here (no writable " + cpu1 + ")");
  std::string why;
  absl::Cleanup restore = [&cpu1] {
    std::string err;
    for (int i = 0; i < 50 && !WriteSys(cpu1, "1", &err); ++i) {
      usleep(100000);
    }
  };
  ASSERT_TRUE(WriteSys(cpu1, "0", &why)) << why;
  ASSERT_EQ(OnlineCpuList(), "0");
  const RunResult r = WatchWhileTargetCalls({"--json"}, [&](kwatch::testing::Spawned& k) {
    EXPECT_THAT(k.err(), HasSubstr("kwatch: armed 1 kernel watch on 1 CPUs"));
    std::string err;
    ASSERT_TRUE(WriteSys(cpu1, "1", &err)) << err;
    EXPECT_TRUE(k.WaitForStderr("kwatch: CPU 1 came online during the session: armed 1 kernel "
                                "watch there (accesses on it before this line were not seen)\n")
                    .ok())
        << k.err();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(1, &set);
    ASSERT_EQ(sched_setaffinity(pid_, sizeof(set), &set), 0);
  });
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("was not watched")));
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.summary["watches"].size(), 1U);
  const json& w = run.summary["watches"][0];
  EXPECT_EQ(w["cpus"], json::array({0, 1}));
  KW_REQUIRE_DEBUG_TRAPS();
  EXPECT_EQ(w["events"], w["kernel_count"]);
  ASSERT_FALSE(w["sites"].empty());
  const json& top = w["sites"][0];
  EXPECT_THAT(top["site"].get<std::string>(), StartsWith("entry_SYSCALL_64"));
  EXPECT_EQ(top["events"], kSyscalls + 1);
  EXPECT_EQ(top["cpus"], json::array({1}));
}

// CPU hotplug the other way: CPU 1 is online at arming, goes offline and comes straight back
// (two writes, no pause: kwatch hears both from the kernel's uevents). The kernel drops the
// old CPU-bound breakpoint (it would count nothing); kwatch closes it, opens a new one, and
// the target's system calls on CPU 1 are all seen. RUN_SERIAL, CPU 1 restored on every path.
TEST_F(KernelStackWord, CpuGoingOfflineAndBackIsArmedAgain) {
  const std::string cpu1 = "/sys/devices/system/cpu/cpu1/online";
  KW_REQUIRE_FEATURE(access(cpu1.c_str(), W_OK) == 0,
                     "CPU 1 cannot be taken offline here (no writable " + cpu1 + ")");
  absl::Cleanup restore = [&cpu1] {
    std::string err;
    for (int i = 0; i < 50 && !WriteSys(cpu1, "1", &err); ++i) {
      usleep(100000);
    }
  };
  const RunResult r = WatchWhileTargetCalls({"--json"}, [&](kwatch::testing::Spawned& k) {
    EXPECT_THAT(k.err(), HasSubstr("kwatch: armed 1 kernel watch on 2 CPUs"));
    std::string err;
    ASSERT_TRUE(WriteSys(cpu1, "0", &err)) << err;
    ASSERT_TRUE(WriteSys(cpu1, "1", &err)) << err;
    EXPECT_TRUE(k.WaitForStderr("kwatch: CPU 1 came online during the session: armed 1 kernel "
                                "watch there (accesses on it before this line were not seen)\n")
                    .ok())
        << k.err();
    EXPECT_THAT(k.err(), HasSubstr("kwatch: CPU 1 went offline: its breakpoints are closed (the "
                                   "kernel drops CPU-bound events of an offline CPU); it is "
                                   "armed again if it comes back\n"));
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(1, &set);
    ASSERT_EQ(sched_setaffinity(pid_, sizeof(set), &set), 0);
  });
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  ASSERT_EQ(run.summary["watches"].size(), 1U);
  const json& w = run.summary["watches"][0];
  EXPECT_EQ(w["cpus"], json::array({0, 1}));
  KW_REQUIRE_DEBUG_TRAPS();
  EXPECT_EQ(w["events"], w["kernel_count"]);
  ASSERT_FALSE(w["sites"].empty());
  const json& top = w["sites"][0];
  EXPECT_THAT(top["site"].get<std::string>(), StartsWith("entry_SYSCALL_64"));
  EXPECT_EQ(top["events"], kSyscalls + 1);
  EXPECT_EQ(top["cpus"], json::array({1}));
}

// -o: the same session recorded, and `kwatch report` reads back exactly what kwatch counted,
// with the task's name and the kernel sites.
TEST_F(KernelStackWord, RecordingAndReport) {
  const std::string file = (dir_ / "kstack.kwdb").string();
  const RunResult r = WatchWhileTargetCalls({"-q", "--json", "-o", file});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const JsonRun run = ParseJsonLines(r.out);
  const size_t events = run.summary["events"].get<size_t>();
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrFormat("kwatch: recorded %d events to %s (kwatch report %s)\n",
                                        events, file, file)));
  const RunResult rep = RunKwatch({"report", file, "--format", "json"});
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  const json j = json::parse(rep.out);
  EXPECT_EQ(j["session"]["mode"], "kernel");
  EXPECT_EQ(j["session"]["pid"], 0);
  EXPECT_EQ(j["session"]["events"].get<size_t>(), events);
  EXPECT_EQ(j["session"]["exit_reason"], "interrupted by INT");
  ASSERT_EQ(j["watches"].size(), 1U);
  const json& w = j["watches"][0];
  EXPECT_EQ(w["expr"], "kw_orig_ax");
  EXPECT_EQ(w["address"], absl::StrFormat("0x%x", word_));
  EXPECT_EQ(w["writes"].get<size_t>(), events);
  EXPECT_EQ(w["reads"], 0);
  KW_REQUIRE_DEBUG_TRAPS();
  ASSERT_EQ(w["threads"].size(), 1U);
  EXPECT_EQ(w["threads"][0]["tid"], pid_);
  EXPECT_EQ(w["threads"][0]["comm"], "kstack");
  EXPECT_EQ(w["threads"][0]["writes"].get<size_t>(), events);
  ASSERT_FALSE(w["top_sites"].empty());
  EXPECT_THAT(w["top_sites"][0]["function"].get<std::string>(), StartsWith("entry_SYSCALL_64"));
  EXPECT_EQ(w["top_sites"][0]["count"], kSyscalls + 1);
  // The text report names the task and the site.
  const RunResult text = RunKwatch({"report", file});
  EXPECT_THAT(text.out, HasSubstr(absl::StrFormat("    tid %d (pid %d, kstack)\n", pid_, pid_)));
  EXPECT_THAT(text.out,
              ::testing::ContainsRegex(absl::StrFormat(
                  " %d  entry_SYSCALL_64[a-z_]*\\+0x[0-9a-f]+: kw_orig_ax\n", kSyscalls + 1)));
}

// -o with --kernel-accesses: the read buffer's events, recorded and reported.
TEST_F(KernelCli, KernelAccessesRecordingAndReport) {
  const std::string src = Write("piper.c", PiperSource());
  const std::string prog = (dir_ / "piper").string();
  auto cc = kwatch::testing::Run({"/usr/bin/gcc", "-g", "-O1", "-o", prog, src});
  ASSERT_TRUE(cc.ok() && cc->exit_code == 0) << (cc.ok() ? cc->err : cc.status().ToString());
  const std::string truth = (dir_ / "truth").string();
  const std::string file = (dir_ / "piper.kwdb").string();
  const RunResult r = RunKwatch({"--kernel-accesses", "--write", "buf", "mark", "--len", "8",
                                 "--json", "-q", "-o", file, "--", prog, "20", truth});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  int pid = 0;
  long bytes = 0;
  ASSERT_EQ(std::sscanf(ReadFile(truth).c_str(), "%d %ld", &pid, &bytes), 2);
  const JsonRun run = ParseJsonLines(r.out);
  const RunResult rep = RunKwatch({"report", file, "--format", "json"});
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  const json j = json::parse(rep.out);
  EXPECT_EQ(j["session"]["mode"], "kernel-accesses");
  EXPECT_EQ(j["session"]["pid"], pid);
  EXPECT_EQ(j["session"]["exit_status"], 0);
  EXPECT_EQ(j["session"]["events"], run.summary["events"]);
  ASSERT_EQ(j["watches"].size(), 2U);
  KW_REQUIRE_DEBUG_TRAPS();
  for (size_t i = 0; i < 2; ++i) {
    const json& w = j["watches"][i];
    const json& live = run.summary["watches"][i];
    EXPECT_EQ(w["expr"], live["expr"]);
    EXPECT_EQ(w["writes"], live["events"]);
    EXPECT_EQ(w["writes"], live["kernel_count"]);
    ASSERT_EQ(w["threads"].size(), 1U);
    EXPECT_EQ(w["threads"][0]["tid"], pid);
    EXPECT_EQ(w["threads"][0]["comm"], "piper");
    size_t sum = 0;
    for (const json& s : w["top_sites"]) {
      EXPECT_THAT(
          absl::StrFormat("%s+0x%x", s["function"].get<std::string>(), s["offset"].get<uint64_t>()),
          ::testing::MatchesRegex(CopyToUserSite()));
      sum += s["count"].get<size_t>();
    }
    EXPECT_EQ(sum, w["writes"].get<size_t>());
  }
}

TEST_F(KernelCli, RecordingAReadWriteKernelWatchIsRefused) {
  const RunResult r = RunKwatch({"--rw", "&jiffies", "-o", (dir_ / "x.kwdb").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "kwatch: error: -o records kernel --write watches only: a read-write breakpoint does "
            "not say whether the kernel read or wrote, kwatch does not read kernel code to "
            "decode the access, and a recording stores each event as a read or a write; record "
            "with --write, or watch --rw live\n");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.kwdb"));
}

// Runs kwatch; while it is refused because registers are held outside kwatch (other sessions
// on a shared machine hold breakpoints that the kernel counts on every CPU), tries again, for
// up to 10 s.
RunResult RunWhenRegistersFree(const std::vector<std::string>& args) {
  RunResult r;
  for (int attempt = 0; attempt < 10; ++attempt) {
    r = RunKwatch(args);
    if (r.exit_code == 0 || !absl::StrContains(r.err, "held outside kwatch")) {
      break;
    }
    sleep(1);
  }
  return r;
}

// The drmgr refusal of a kernel watch that gets no register on some CPU, as kwatch prints it,
// for the first refused watch `k` (1-based) on `cpu` with `external` registers held by other
// tools there: the watches before it hold the rest.
std::string NoRegisterError(int k, int cpu, int external, uint64_t addr) {
  std::vector<std::string> parts;
  if (k > 1) {
    std::vector<std::string> held;
    for (int i = 1; i < k; ++i) {
      held.push_back(absl::StrFormat("watch #%d kw_%d", i, i - 1));
    }
    parts.push_back(absl::StrCat("held by ", absl::StrJoin(held, ", ")));
  }
  if (external > 0) {
    parts.push_back(absl::StrCat(external, " held outside kwatch"));
  }
  return absl::StrFormat(
      "kwatch: error: watch #%d kw_%d on CPU %d: no debug register free: 8 bytes at 0x%x need "
      "1 slot, 0 free: no aligned cover fits (CPU %d: %s); kernel watches take one debug "
      "register per CPU each (4 per CPU at most, fewer when other tools hold some) and have no "
      "fallback: watch fewer objects at once\n",
      k, k - 1, cpu, addr, cpu, absl::StrJoin(parts, "; "));
}

// Parses "watch #K kw_.. on CPU C: ..." and "; E held outside kwatch" from kwatch's error.
struct Refusal {
  int k = 0;
  int cpu = -1;
  int external = 0;
};
Refusal ParseRefusal(const std::string& err) {
  Refusal r;
  const size_t at = err.find("kwatch: error: watch #");
  if (at != std::string::npos) {
    std::sscanf(err.c_str() + at, "kwatch: error: watch #%d kw_%*d on CPU %d", &r.k, &r.cpu);
  }
  const size_t ext = err.find(" held outside kwatch)");
  if (ext != std::string::npos) {
    const size_t begin = err.rfind(' ', ext - 1);
    r.external = std::atoi(err.c_str() + begin + 1);
  }
  return r;
}

// Kernel watches ask drmgr for one register per CPU each: a fifth one (or fewer, when other
// tools hold registers of a CPU) is refused before anything else is opened there, with
// drmgr's decision in the watches' names. Other sessions on this machine may hold registers
// (counted by the kernel on every CPU), so the test checks that the refused watch and the
// registers held outside kwatch add up to four, and the exact text.
TEST_F(KernelCli, FifthKernelWatchIsRefusedByDrmgr) {
  const std::string map = WordsMap(5);
  const RunResult r = RunKwatch({"--write", "kw_0", "kw_1", "kw_2", "kw_3", "kw_4", "--system-map",
                                 map, "--duration", "0.2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  const Refusal f = ParseRefusal(r.err);
  ASSERT_GE(f.k, 1) << r.err;
  EXPECT_EQ(f.k - 1 + f.external, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr(NoRegisterError(f.k, f.cpu, f.external, WordAddr(f.k - 1))));
}

// Two registers of CPU 0 held by another tool (CPU-wide breakpoints, disabled, as perf would
// hold them): kwatch learns them from the kernel's ENOSPC, and drmgr's refusal says so.
TEST_F(KernelCli, RegistersHeldOutsideKwatchAreLearnedPerCpu) {
  const std::string map = WordsMap(4);
  std::vector<core::UniqueFd> held;
  for (int i = 0; i < 2; ++i) {
    perf_event_attr attr{};
    attr.type = PERF_TYPE_BREAKPOINT;
    attr.size = sizeof(attr);
    attr.bp_type = HW_BREAKPOINT_W;
    attr.bp_addr = FixtureDataAddr(raw_) + 0x100 + 8 * static_cast<uint64_t>(i);
    attr.bp_len = HW_BREAKPOINT_LEN_8;
    attr.sample_period = 1;
    attr.disabled = 1;
    held.emplace_back(
        static_cast<int>(::syscall(SYS_perf_event_open, &attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC)));
    ASSERT_TRUE(held.back().valid())
        << "perf_event_open(CPU 0): " << std::strerror(errno);  // NOLINT(concurrency-mt-unsafe)
  }
  const RunResult r = RunKwatch(
      {"--write", "kw_0", "kw_1", "kw_2", "kw_3", "--system-map", map, "--duration", "0.2"});
  EXPECT_EQ(r.exit_code, 1);
  const Refusal f = ParseRefusal(r.err);
  ASSERT_GE(f.k, 1) << r.err;
  EXPECT_EQ(f.k - 1 + f.external, 4) << r.err;
  if (f.cpu == 0) {
    EXPECT_GE(f.external, 2) << r.err;
  }
  EXPECT_THAT(r.err, HasSubstr(NoRegisterError(f.k, f.cpu, f.external, WordAddr(f.k - 1))));
  // Without them, the same two first watches arm on every CPU (once other sessions on the
  // machine leave two registers free: RunWhenRegistersFree).
  held.clear();
  const RunResult ok = RunWhenRegistersFree(
      {"--write", "kw_0", "kw_1", "--system-map", map, "--duration", "0.2", "-q"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// `kwatch slots` lists a kernel session's registers per CPU, from drmgr's decision.
TEST_F(KernelCli, SlotsShowsKernelWatchRegistersPerCpu) {
  const std::string map = WordsMap(2);
  // Other sessions on a shared machine may hold registers of every CPU for a moment (a thread
  // with 3 or 4 breakpoints takes them on all CPUs): try again for up to 10 s.
  absl::StatusOr<std::unique_ptr<kwatch::testing::Spawned>> k;
  for (int attempt = 0; attempt < 10; ++attempt) {
    k = kwatch::testing::Spawned::Start(
        {KwatchPath(), "--write", "kw_0", "kw_1", "--system-map", map, "--duration", "30", "-q"});
    ASSERT_TRUE(k.ok()) << k.status();
    if ((*k)->WaitForStderr("kwatch: armed 2 kernel watches").ok() ||
        !absl::StrContains((*k)->err(), "held outside kwatch")) {
      break;
    }
    sleep(1);
  }
  ASSERT_TRUE(absl::StrContains((*k)->err(), "kwatch: armed 2 kernel watches")) << (*k)->err();
  const RunResult slots = RunKwatch({"slots", "--json"});
  ASSERT_EQ(slots.exit_code, 0) << slots.err;
  const json j = json::parse(slots.out);
  ASSERT_EQ(j["kernel_sessions"].size(), 1U) << slots.out;
  const json& session = j["kernel_sessions"][0];
  EXPECT_EQ(session["kwatch_pid"], (*k)->pid());
  std::vector<int> cpus;
  for (const json& c : session["cpus"]) {
    cpus.push_back(c["cpu"].get<int>());
    EXPECT_EQ(c["kwatch"], 2) << c.dump();
    EXPECT_EQ(c["free"].get<int>() + c["external"].get<int>(), 2) << c.dump();
    ASSERT_EQ(c["slots"].size(), 4U);
    for (int i = 0; i < 2; ++i) {
      const json& row = c["slots"][static_cast<size_t>(i)];
      EXPECT_EQ(row["slot"], i);
      EXPECT_EQ(row["state"], "armed");
      EXPECT_EQ(row["labels"], json::array({absl::StrCat("kw_", i)}));
      EXPECT_EQ(row["addr"], absl::StrFormat("0x%x", WordAddr(i)));
      EXPECT_EQ(row["len"], 8);
      EXPECT_EQ(row["kind"], "write");
    }
  }
  EXPECT_EQ(absl::StrJoin(cpus, ","), OnlineCpuList());
  kill((*k)->pid(), SIGINT);
  auto end = (*k)->Finish();
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->exit_code, 0) << end->err;
  // The session's file is gone with it.
  const RunResult after = RunKwatch({"slots", "--json"});
  EXPECT_EQ(json::parse(after.out)["kernel_sessions"], json::array());
}

// --kernel-accesses asks drmgr too (process scope, as process sessions do): a program with five
// words w0..w4, which it leaves alone; with argument "wait" it blocks until SIGTERM.
std::string WordsProgram() {
  return R"(#include <signal.h>
#include <string.h>
#include <unistd.h>
long w0, w1, w2, w3, w4;
int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "wait") == 0) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    int sig = 0;
    sigwait(&set, &sig);
  }
  return (int)(w0 + w1 + w2 + w3 + w4);
}
)";
}

// The drmgr refusal of a --kernel-accesses watch, as kwatch prints it, for the first refused
// watch `k` (1-based) of process `pid` with `external` registers of its threads held by other
// tools: the watches before it hold the rest.
std::string NoThreadRegisterError(int k, int pid, int external, uint64_t addr) {
  std::vector<std::string> parts;
  if (k > 1) {
    std::vector<std::string> held;
    for (int i = 1; i < k; ++i) {
      held.push_back(absl::StrFormat("watch #%d w%d", i, i - 1));
    }
    parts.push_back(absl::StrCat("held by ", absl::StrJoin(held, ", ")));
  }
  if (external > 0) {
    parts.push_back(absl::StrCat(external, " held outside kwatch"));
  }
  return absl::StrFormat(
      "kwatch: error: watch #%d w%d: no debug register free: 8 bytes at 0x%x need 1 slot, 0 "
      "free: no aligned cover fits (process %d (all threads): %s); --kernel-accesses takes one "
      "debug register of every thread of the process per watch (4 at most, fewer when other "
      "tools hold some) and has no fallback (page protection cannot see the kernel's "
      "accesses): watch fewer objects at once\n",
      k, k - 1, addr, pid, absl::StrJoin(parts, "; "));
}

// Parses "watch #K wN: ..." and "; E held outside kwatch" from kwatch's error.
Refusal ParseThreadRefusal(const std::string& err) {
  Refusal r;
  const size_t at = err.find("kwatch: error: watch #");
  if (at != std::string::npos) {
    std::sscanf(err.c_str() + at, "kwatch: error: watch #%d", &r.k);
  }
  const size_t ext = err.find(" held outside kwatch)");
  if (ext != std::string::npos) {
    const size_t begin = err.rfind(' ', ext - 1);
    r.external = std::atoi(err.c_str() + begin + 1);
  }
  return r;
}

// The address of a global of a non-PIE program, read with nm (binutils), independently of
// kwatch.
uint64_t NmAddr(const std::string& prog, const std::string& name) {
  auto nm = kwatch::testing::Run({"/usr/bin/nm", prog});
  if (!nm.ok()) {
    return 0;
  }
  std::istringstream in(nm->out);
  std::string line;
  while (std::getline(in, line)) {
    char sym[256] = {};
    char type = 0;
    unsigned long long a = 0;
    if (std::sscanf(line.c_str(), "%llx %c %255s", &a, &type, sym) == 3 && sym == name) {
      return a;
    }
  }
  return 0;
}

// Builds WordsProgram into `dir`, not PIE: the words' addresses are the file's (NmAddr), known
// before the program runs. "" (with the compiler's complaint in `why`) on failure.
std::string BuildWordsProgram(const std::filesystem::path& dir, std::string* why) {
  const std::string src = (dir / "words.c").string();
  std::ofstream(src) << WordsProgram();
  const std::string prog = (dir / "words").string();
  auto cc = kwatch::testing::Run({"/usr/bin/gcc", "-g", "-O1", "-no-pie", "-o", prog, src});
  if (!cc.ok() || cc->exit_code != 0) {
    *why = cc.ok() ? cc->err : cc.status().ToString();
    return "";
  }
  return prog;
}

// Five --kernel-accesses watches of one process: drmgr gives four registers of its threads
// and refuses the fifth with its reason, in the watches' names (as for kernel watches).
TEST_F(KernelCli, KernelAccessesFifthWatchIsRefusedByDrmgr) {
  std::string why;
  const std::string prog = BuildWordsProgram(dir_, &why);
  ASSERT_NE(prog, "") << why;
  const auto Word = [&prog](int i) { return NmAddr(prog, absl::StrCat("w", i)); };
  const RunResult r =
      RunKwatch({"--kernel-accesses", "--write", "w0", "w1", "w2", "w3", "w4", "--", prog});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  const Refusal f = ParseThreadRefusal(r.err);
  ASSERT_GE(f.k, 1) << r.err;
  // Other sessions' CPU-wide breakpoints count against every thread: those are held outside.
  EXPECT_EQ(f.k - 1 + f.external, 4) << r.err;
  const size_t pid_at = r.err.find("(process ");
  ASSERT_NE(pid_at, std::string::npos) << r.err;
  const int pid = std::atoi(r.err.c_str() + pid_at + 9);
  EXPECT_EQ(r.err, NoThreadRegisterError(f.k, pid, f.external, Word(f.k - 1)));
}

// Two registers of the process's thread held by another tool (per-thread breakpoints,
// disabled, as a debugger would hold them): kwatch learns them from the kernel's ENOSPC, and
// drmgr's refusal says so.
TEST_F(KernelCli, KernelAccessesRegistersHeldOutsideKwatchAreLearned) {
  std::string why;
  const std::string prog = BuildWordsProgram(dir_, &why);
  ASSERT_NE(prog, "") << why;
  const auto Word = [&prog](int i) { return NmAddr(prog, absl::StrCat("w", i)); };
  auto t = kwatch::testing::Spawned::Start({prog, "wait"});
  ASSERT_TRUE(t.ok()) << t.status();
  const pid_t pid = (*t)->pid();
  absl::Cleanup end = [pid, &t] {
    kill(pid, SIGTERM);
    (void)(*t)->Finish();
  };
  std::vector<core::UniqueFd> held;
  for (int i = 0; i < 2; ++i) {
    perf_event_attr attr{};
    attr.type = PERF_TYPE_BREAKPOINT;
    attr.size = sizeof(attr);
    attr.bp_type = HW_BREAKPOINT_W;
    attr.bp_addr = Word(0) + 0x100 + 8 * static_cast<uint64_t>(i);
    attr.bp_len = HW_BREAKPOINT_LEN_8;
    attr.sample_period = 1;
    attr.disabled = 1;
    held.emplace_back(
        static_cast<int>(::syscall(SYS_perf_event_open, &attr, pid, -1, -1, PERF_FLAG_FD_CLOEXEC)));
    ASSERT_TRUE(held.back().valid())
        << "perf_event_open(pid " << pid
        << "): " << std::strerror(errno);  // NOLINT(concurrency-mt-unsafe)
  }
  const std::string p = std::to_string(pid);
  const RunResult r =
      RunKwatch({"--kernel-accesses", "--write", "w0", "w1", "w2", "w3", "-p", p, "-q"});
  EXPECT_EQ(r.exit_code, 1);
  const Refusal f = ParseThreadRefusal(r.err);
  ASSERT_GE(f.k, 1) << r.err;
  EXPECT_GE(f.external, 2) << r.err;
  EXPECT_EQ(f.k - 1 + f.external, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr(NoThreadRegisterError(f.k, pid, f.external, Word(f.k - 1))));
  // Without them, the same two first watches arm (once other sessions on the machine leave
  // two registers free: RunWhenRegistersFree).
  held.clear();
  const RunResult ok = RunWhenRegistersFree(
      {"--kernel-accesses", "--write", "w0", "w1", "-p", p, "-q", "--duration", "0.2"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// `kwatch slots -p PID` shows the registers a --kernel-accesses session holds in the
// process's threads, from drmgr's decision, and drops them when the session ends.
TEST_F(KernelCli, KernelAccessesSlotsShowsTheProcessRegisters) {
  std::string why;
  const std::string prog = BuildWordsProgram(dir_, &why);
  ASSERT_NE(prog, "") << why;
  const auto Word = [&prog](int i) { return NmAddr(prog, absl::StrCat("w", i)); };
  absl::StatusOr<std::unique_ptr<kwatch::testing::Spawned>> k;
  for (int attempt = 0; attempt < 10; ++attempt) {
    k = kwatch::testing::Spawned::Start({KwatchPath(), "--kernel-accesses", "--write", "w0", "w1",
                                         "-q", "--kill-on-exit", "--", prog, "wait"});
    ASSERT_TRUE(k.ok()) << k.status();
    if ((*k)->WaitForStderr("kwatch: armed 2 watches on pid ").ok() ||
        !absl::StrContains((*k)->err(), "held outside kwatch")) {
      break;
    }
    sleep(1);
  }
  ASSERT_TRUE(absl::StrContains((*k)->err(), "kwatch: armed 2 watches on pid ")) << (*k)->err();
  int pid = 0;
  ASSERT_EQ(std::sscanf((*k)->err().c_str() + (*k)->err().find("on pid "), "on pid %d", &pid), 1);
  const RunResult slots = RunKwatch({"slots", "-p", std::to_string(pid), "--json"});
  ASSERT_EQ(slots.exit_code, 0) << slots.err;
  const json j = json::parse(slots.out);
  ASSERT_EQ(j["processes"].size(), 1U) << slots.out;
  const json& proc = j["processes"][0];
  EXPECT_EQ(proc["pid"], pid);
  ASSERT_EQ(proc["sessions"].size(), 1U) << slots.out;
  EXPECT_EQ(proc["sessions"][0]["kwatch_pid"], (*k)->pid());
  ASSERT_EQ(proc["threads"].size(), 1U) << slots.out;
  const json& thread = proc["threads"][0];
  EXPECT_EQ(thread["tid"], pid);
  EXPECT_EQ(thread["kwatch"], 2);
  EXPECT_EQ(thread["free"].get<int>() + thread["external"].get<int>(), 2) << thread.dump();
  ASSERT_EQ(thread["slots"].size(), 4U);
  for (int i = 0; i < 2; ++i) {
    const json& row = thread["slots"][static_cast<size_t>(i)];
    EXPECT_EQ(row["slot"], i);
    EXPECT_EQ(row["state"], "armed");
    EXPECT_EQ(row["labels"], json::array({absl::StrCat("w", i)}));
    EXPECT_EQ(row["addr"], absl::StrFormat("0x%x", Word(i)));
    EXPECT_EQ(row["len"], 8);
    EXPECT_EQ(row["kind"], "write");
    EXPECT_EQ(row["kwatch_pid"], (*k)->pid());
  }
  // The text table names each holder with its session.
  const RunResult text = RunKwatch({"slots", "-p", std::to_string(pid)});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out,
              HasSubstr(absl::StrFormat("  DR0   w0 (kwatch %d)  8 bytes at 0x%x  write  armed\n"
                                        "  DR1   w1 (kwatch %d)  8 bytes at 0x%x  write  armed\n",
                                        (*k)->pid(), Word(0), (*k)->pid(), Word(1))))
      << text.out;
  // The target ends (SIGTERM ends its sigwait: exit status 0), and the session with it.
  kill(pid, SIGTERM);
  auto end = (*k)->Finish();
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->exit_code, 0) << end->err;
  EXPECT_THAT(end->out, HasSubstr("kwatch: 0 events, 0 lost; target exited\n"));
  // The session's file is gone with it.
  const RunResult after = RunKwatch({"slots", "--json"});
  EXPECT_EQ(json::parse(after.out)["processes"], json::array()) << after.out;
}

TEST_F(KernelCli, MismatchedSystemMapIsRefusedWithEvidence) {
  const std::string map = Write("System.map", FixtureMap(raw_, /*skew=*/0x1000));
  const RunResult r = RunKwatch({"--write", "&jiffies", "--system-map", map});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, StartsWith(absl::StrFormat(
                         "kwatch: error: refusing --system-map %s: %s does not match the "
                         "running kernel: _text gives a KASLR slide of +0x1e00000 (0x%x in the "
                         "file, 0x%x in /proc/kallsyms), but ",
                         map, map, AddrOf(raw_, "_text") - kFixtureSlide, AddrOf(raw_, "_text"))));
  EXPECT_THAT(r.err, HasSubstr("running (slide +0x1dff000)"));
  EXPECT_THAT(r.err, HasSubstr("kwatch never guesses an address"));
}

TEST_F(KernelCli, ExecuteOnKernelTextExplainsTheKernelsEinval) {
  const uint64_t sched = AddrOf(raw_, "schedule");
  ASSERT_NE(sched, 0U);
  const RunResult r = RunKwatch({"--exec", "schedule", "--duration", "0.2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, absl::StrFormat(
                       "kwatch: schedule: 1 byte at 0x%x, from /proc/kallsyms\n"
                       "kwatch: error: perf_event_open(breakpoint 0x%x len 8 execute, cpu 0): "
                       "Invalid argument; execute breakpoints on kernel text are refused by this "
                       "kernel (it allows them only with CONFIG_KPROBES, and never in the kprobe "
                       "blacklist)\n",
                       sched, sched));
}

TEST_F(KernelCli, WriteWatchOnKernelTextIsArmedWithAWarning) {
  const uint64_t sched = AddrOf(raw_, "schedule");
  const std::string cpus = OnlineCpuList();
  const RunResult r = RunKwatch({"--write", "schedule", "--duration", "0.2", "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, absl::StrFormat(
                       "kwatch: warning: 'schedule' is in a read-only kernel section (type 'T' in "
                       "/proc/kallsyms): nothing writes there, so --write will see no event\n"
                       "kwatch: schedule: 8 bytes at 0x%x, from /proc/kallsyms\n"
                       "kwatch: armed 1 kernel watch on %d CPUs (one breakpoint per CPU), perf "
                       "breakpoint stream mode\n",
                       sched, CountOf(cpus)));
  EXPECT_EQ(r.out, absl::StrFormat("kwatch: 0 events, 0 lost; --duration 0.2s elapsed\n"
                                   "watch #1 schedule: 8 bytes at 0x%x, write, kernel, CPUs %s: "
                                   "0 events (the kernel counted 0)\n",
                                   sched, cpus));
}

TEST_F(KernelCli, WithoutPrivilegesSaysWhatIsNeeded) {
  // Run a copy that user nobody can reach (the build tree may be under /root).
  const std::filesystem::path copy = dir_ / "kwatch";
  std::filesystem::copy_file(KwatchPath(), copy);
  std::filesystem::permissions(dir_, std::filesystem::perms(0755));
  std::filesystem::permissions(copy, std::filesystem::perms(0755));
  auto r = kwatch::testing::Run({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                 "--clear-groups", copy.string(), "--write", "&jiffies"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 1);
  EXPECT_EQ(r->err,
            "kwatch: error: watching the kernel needs root, or CAP_PERFMON (Linux >= 5.8) or "
            "CAP_SYS_ADMIN (also CAP_SYSLOG to read kernel addresses in /proc/kallsyms): run it "
            "with sudo, or `sudo setcap cap_perfmon,cap_syslog+ep $(command -v kwatch)`\n");
}

// Without a vmlinux with DWARF, --stack says that kernel frames will be function+offset
// only, and why (each place tried), then arms with callchains.
TEST_F(KernelCli, StackWithoutVmlinuxSaysFramesAreFunctionOffsetOnly) {
  const std::string map = Write("System.map", FixtureMap(raw_));
  const RunResult r = RunKwatch({"--write", "&jiffies", "--len", "8", "--system-map", map,
                                 "--stack", "--stack-depth", "8", "--duration", "0.2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kwatch: note: no vmlinux with debug info matches the running "
                               "kernel ("));
  EXPECT_THAT(r.err, HasSubstr("so kernel code is shown as function+offset without file:line.\n"
                               "vmlinux files tried:\n"));
  EXPECT_THAT(r.err, HasSubstr("perf breakpoint stream mode, callchains of up to 8 frames "
                               "(--stack)\n"));
  EXPECT_THAT(r.out, HasSubstr("kwatch: 0 events, 0 lost; --duration 0.2s elapsed\n"));
}

TEST_F(KernelCli, IfIsRefusedForKernelStreams) {
  constexpr char kWhy[] =
      "kwatch: error: --if needs the values of each access, and kernel watches (and "
      "--kernel-accesses) are perf breakpoint streams that read no memory at the access; "
      "leave --if out and filter the --json events (tid, cpu, comm, site)\n";
  RunResult r = RunKwatch({"--write", "&jiffies", "--if", "new > 1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, kWhy);
  r = RunKwatch({"--kernel-accesses", "--write", "buf", "--if", "tid == 1", "--",
                 kwatch::testing::TargetPath("field_writer"), "1", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, kWhy);
}

TEST_F(KernelCli, ReadOnlyIsRefusedForTheKernel) {
  const RunResult r = RunKwatch({"--read", "&jiffies"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--read is not available for kernel watches"));
}

TEST_F(KernelCli, PageFallbackAndStopModeAreRefusedForTheKernel) {
  RunResult r = RunKwatch({"--overcommit", "pages", "--write", "&jiffies"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--overcommit=pages cannot watch kernel memory"));
  r = RunKwatch({"--overcommit", "multiplex", "--write", "&jiffies"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--overcommit=multiplex is for process watches"));
  r = RunKwatch({"--stop", "--write", "&jiffies"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("stop mode stops a process's threads through ptrace"));
}

}  // namespace
}  // namespace kwatch::clitest
