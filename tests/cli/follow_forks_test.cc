// End-to-end tests of -f/--follow-forks: `kwatch probe -f` on tests/targets/fork_tree.c,
// whose every process calls probed(tag) a known number of times (tag 0: the target, k: its
// k-th child, 100: the grandchild). Each on the ptrace backend and on the in-process agent
// (its jump path and its INT3 path): the same exact counts.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/test_util.h"

namespace kwatch {
namespace {

using ::kwatch::testing::KwatchPath;
using ::kwatch::testing::KwatchProbe;
using ::kwatch::testing::RunResult;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::SubreaperScope;
using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

struct Hits {
  std::vector<json> all;
  json summary;
};

Hits ParseHits(const std::string& out) {
  Hits h;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (line.front() != '{') {
      continue;  // the target's own output
    }
    json j = json::parse(std::string(line));
    if (j["type"] == "hit") {
      h.all.push_back(std::move(j));
    } else if (j["type"] == "summary") {
      h.summary = std::move(j);
    }
  }
  return h;
}

// probed hits: tag -> {pid -> count}.
std::map<long, std::map<int, int>> ProbedByTag(const Hits& h) {
  std::map<long, std::map<int, int>> out;
  for (const json& j : h.all) {
    if (j["event"] == "probed") {
      ++out[j["args"]["tag"].get<long>()][j["pid"].get<int>()];
    }
  }
  return out;
}

std::string ProcStatusTracer(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("TracerPid:", 0) == 0) {
      return std::string(absl::StripAsciiWhitespace(line.substr(10)));
    }
  }
  return "";
}

// The backends under test: "ptrace", "agent" (jump probes where possible), "agent --no-jump".
class FollowForks : public ::testing::TestWithParam<std::string> {
 protected:
  // `kwatch probe --backend B ARGS...`.
  RunResult Probe(const std::vector<std::string>& args) const {
    return KwatchProbe(WithBackend(args));
  }
  std::vector<std::string> WithBackend(const std::vector<std::string>& args) const {
    std::vector<std::string> all = {"--backend"};
    for (absl::string_view w : absl::StrSplit(GetParam(), ' ')) {
      all.emplace_back(w);
    }
    all.insert(all.end(), args.begin(), args.end());
    return all;
  }
  bool agent() const { return absl::StartsWith(GetParam(), "agent"); }
};

INSTANTIATE_TEST_SUITE_P(Backends, FollowForks,
                         ::testing::Values("ptrace", "agent", "agent --no-jump"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "ptrace"  ? std::string("Ptrace")
                                  : info.param == "agent" ? std::string("Agent")
                                                          : std::string("AgentInt3");
                         });

TEST_P(FollowForks, ProbeCountsEveryProcessExactlyAndLabelsHitsWithTheirPid) {
  const RunResult r = Probe(
      {"--json", "-f", "probed tag", "forker%return $retval", "--", TargetPath("fork_tree"), "3"});
  ASSERT_EQ(r.exit_code, 3) << r.err;  // the target's own status
  const Hits h = ParseHits(r.out);
  const int main_pid = h.summary["pid"].get<int>();
  const auto by_tag = ProbedByTag(h);
  // One process per tag, each with its exact count.
  const std::map<long, int> expected = {{0, 5}, {1, 10}, {2, 20}, {3, 30}, {100, 7}};
  std::set<int> pids;
  for (const auto& [tag, count] : expected) {
    ASSERT_TRUE(by_tag.contains(tag)) << "no hit with tag " << tag << "\n" << r.out;
    ASSERT_EQ(by_tag.at(tag).size(), 1u) << "tag " << tag << " seen in several pids";
    EXPECT_EQ(by_tag.at(tag).begin()->second, count) << "tag " << tag;
    pids.insert(by_tag.at(tag).begin()->first);
  }
  EXPECT_EQ(by_tag.size(), expected.size());
  EXPECT_EQ(pids.size(), 5u);
  EXPECT_EQ(by_tag.at(0).begin()->first, main_pid);
  // forker%return: in the target, the child's pid; in each child (its instance crossed the
  // fork), 0, labelled with the child's pid.
  std::set<int> returned_pids;
  std::set<int> zero_in;
  for (const json& j : h.all) {
    if (j["event"] != "forker__return") {
      continue;
    }
    if (j["pid"] == main_pid) {
      returned_pids.insert(j["args"]["arg1"].get<int>());
    } else {
      EXPECT_EQ(j["args"]["arg1"], 0);
      zero_in.insert(j["pid"].get<int>());
    }
  }
  const std::set<int> children = {by_tag.at(1).begin()->first, by_tag.at(2).begin()->first,
                                  by_tag.at(3).begin()->first};
  EXPECT_EQ(returned_pids, children);
  EXPECT_EQ(zero_in, children);
  // The summary counts every process.
  EXPECT_EQ(h.summary["probes"][0]["hits"], 72);
  EXPECT_EQ(h.summary["probes"][1]["hits"], 6);
  EXPECT_THAT(h.summary["notes"].dump(), HasSubstr("followed 4 forked children"));
  EXPECT_THAT(h.summary["notes"].dump(), Not(HasSubstr("not followed")));
  EXPECT_EQ(h.summary["stop_reason"], "target and its followed children exited");
  EXPECT_EQ(h.summary["backend"], agent() ? "agent" : "ptrace");
  for (const json& p : h.summary["probes"]) {
    EXPECT_EQ(p["lost"], 0) << p.dump();
    EXPECT_EQ(p["misses"], 0) << p.dump();
  }
  // The processes' own output and statuses are unchanged.
  EXPECT_THAT(r.out, HasSubstr("grandchild sum=707\n"));
  EXPECT_THAT(r.out, HasSubstr("grandchild exited 7\n"));
  for (int k = 1; k <= 3; ++k) {
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("child ", k, " sum=", 10 * k * (k + 1), "\n")));
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("child ", k, " exited ", k, "\n")));
  }
  EXPECT_THAT(r.out, HasSubstr("main sum=5\n"));
}

TEST_P(FollowForks, TextLinesOfChildrenShowPidSlashTid) {
  const RunResult r = Probe({"-f", "probed tag", "--", TargetPath("fork_tree"), "1"});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const std::regex child_line(R"(\n[0-9.]+ +([0-9]+)/\1 +probed .* tag=1\n)");
  const std::regex main_line(R"(\n[0-9.]+ +[0-9]+ +probed .* tag=0\n)");
  EXPECT_TRUE(std::regex_search(r.out, child_line)) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, main_line)) << r.out;
}

// -f with the default backend: ptrace (it probes a process's new image after an exec, the
// agent does not), said in a note; the counts are those of every backend above.
TEST(FollowForksDefault, UsesThePtraceBackendAndSaysWhy) {
  const RunResult r =
      KwatchProbe({"--json", "-f", "probed tag", "--", TargetPath("fork_tree"), "1"});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kwatch: note: -f uses the ptrace backend, which probes a "
                               "child's new image after an exec; `--backend agent -f` follows "
                               "forks in the target itself"));
  const Hits h = ParseHits(r.out);
  EXPECT_EQ(h.summary["backend"], "ptrace");
  const auto by_tag = ProbedByTag(h);
  ASSERT_TRUE(by_tag.contains(0) && by_tag.contains(1)) << r.out;
}

TEST_P(FollowForks, WithoutFollowChildrenAreNotProbedAndRunUnchanged) {
  const RunResult r =
      Probe({"--json", "probed tag", "forker%return $retval", "--", TargetPath("fork_tree"), "3"});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const Hits h = ParseHits(r.out);
  const auto by_tag = ProbedByTag(h);
  ASSERT_EQ(by_tag.size(), 1u) << r.out;
  EXPECT_EQ(by_tag.at(0).begin()->second, 5);
  EXPECT_EQ(h.summary["probes"][1]["hits"], 3);
  EXPECT_THAT(h.summary["notes"].dump(), HasSubstr("forked 3 children"));
  EXPECT_THAT(r.out, HasSubstr("grandchild sum=707\n"));
  for (int k = 1; k <= 3; ++k) {
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("child ", k, " sum=", 10 * k * (k + 1), "\n")));
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("child ", k, " exited ", k, "\n")));
  }
}

// The values of `arg` in the hits of `event`, in order.
std::vector<long> ArgsOf(const Hits& h, const std::string& event, const std::string& arg) {
  std::vector<long> out;
  for (const json& j : h.all) {
    if (j["event"] == event) {
      out.push_back(j["args"][arg].get<long>());
    }
  }
  return out;
}

TEST(FollowForks, ExecReArmsTheProbesInTheNewImage) {
  // probe_engine exec 5 3: work() 5 times, then exec itself and work() 3 more times. The
  // ptrace backend sees the exec and probes the new image before it runs.
  const RunResult r = KwatchProbe({"--json", "--backend", "ptrace", "-f", "work i", "--",
                                   TargetPath("probe_engine"), "exec", "5", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Hits h = ParseHits(r.out);
  EXPECT_EQ(h.all.size(), 8u) << r.out;
  // The new image's first call is a hit too: the probes are in before it runs any code.
  EXPECT_THAT(ArgsOf(h, "work", "i"), ::testing::ElementsAre(0, 1, 2, 3, 4, 0, 1, 2)) << r.out;
  EXPECT_EQ(h.summary["probes"][0]["hits"], 8);
  EXPECT_THAT(h.summary["notes"].dump(), HasSubstr("1 probe re-armed in the new image (-f)"));
  EXPECT_THAT(r.out, HasSubstr("before exec sum 35"));
  EXPECT_THAT(r.out, HasSubstr("after exec sum 12"));
}

TEST(FollowForks, ExecReArmsAProbeWhoseInstructionRunsOutOfLine) {
  // deref's first instruction is a load, run from an out-of-line copy: kwatch maps the new
  // image's area with a system call run in the target at its exec stop. Only the new image
  // calls deref (3 times).
  const RunResult r = KwatchProbe({"--json", "--backend", "ptrace", "-f", "deref", "work", "--",
                                   TargetPath("probe_engine"), "exec", "5", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Hits h = ParseHits(r.out);
  EXPECT_EQ(h.summary["probes"][0]["hits"], 3) << r.out;
  EXPECT_EQ(h.summary["probes"][1]["hits"], 8) << r.out;
  EXPECT_THAT(h.summary["notes"].dump(), HasSubstr("2 probes re-armed in the new image (-f)"));
  EXPECT_THAT(r.out, HasSubstr("after exec sum 12"));
}

// The C library this test runs with (the targets use the same one).
std::string LibcPath() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash != std::string::npos && line.find("/libc.so.6", slash) != std::string::npos) {
      return line.substr(slash);
    }
  }
  return "";
}

TEST(FollowForks, ExecReArmsALibraryProbeAtTheNewImagesEntryPoint) {
  // At the exec stop only the program and ld.so are mapped; libc is probed once ld.so mapped
  // it. strtol: atol twice before the exec, then 4 loop tests (i < atol(argv[2])) after it.
  const std::string libc = LibcPath();
  ASSERT_FALSE(libc.empty());
  const RunResult r = KwatchProbe({"--json", "--backend", "ptrace", "-f", "-x", libc, "strtol",
                                   "--", TargetPath("probe_engine"), "exec", "5", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Hits h = ParseHits(r.out);
  EXPECT_EQ(h.summary["probes"][0]["hits"], 6) << r.out;
  EXPECT_THAT(h.summary["notes"].dump(),
              HasSubstr("1 probe re-armed in the new image at its entry point (-f)"));
  EXPECT_THAT(r.out, HasSubstr("after exec sum 12"));
}

// The agent does not follow an exec: the new image runs unprobed, with its output unchanged.
TEST(FollowForks, AgentEndsTheProbesAtAnExec) {
  const RunResult r = KwatchProbe({"--json", "--backend", "agent", "-f", "work i", "--",
                                   TargetPath("probe_engine"), "exec", "5", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Hits h = ParseHits(r.out);
  EXPECT_THAT(ArgsOf(h, "work", "i"), ::testing::ElementsAre(0, 1, 2, 3, 4)) << r.out;
  EXPECT_EQ(h.summary["probes"][0]["hits"], 5);
  EXPECT_THAT(r.out, HasSubstr("before exec sum 35"));
  EXPECT_THAT(r.out, HasSubstr("after exec sum 12"));
}

// Ctrl-C while followed children run: every process gets its code back and keeps running.
TEST_P(FollowForks, InterruptedKwatchLeavesNoPatchInFollowedChildren) {
  SubreaperScope reaper;
  const std::string go = absl::StrCat(::testing::TempDir(), "/go-follow-", getpid());
  std::filesystem::remove(go);
  std::vector<std::string> argv = {KwatchPath(), "probe"};
  for (std::string& a :
       WithBackend({"--json", "-f", "probed tag", "--", TargetPath("fork_tree"), "2", go})) {
    argv.push_back(std::move(a));
  }
  auto k = Spawned::Start(argv);
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE((*k)->WaitForStdout("ready 1 ").ok()) << (*k)->out();
  ASSERT_TRUE((*k)->WaitForStdout("ready 2 ").ok()) << (*k)->out();
  // The last phase-1 hit of child 2 (its 20th) is out: kwatch is idle.
  for (int i = 0; i < 30; ++i) {
    const Hits now = ParseHits((*k)->out());
    const auto by_tag = ProbedByTag(now);
    if (by_tag.contains(2) && by_tag.at(2).begin()->second == 20 && by_tag.contains(1) &&
        by_tag.at(1).begin()->second == 10) {
      break;
    }
    (void)(*k)->WaitForStdout("\n{never}", 1);  // reads output for a second
  }
  // ready K pid PID probed ADDR
  std::map<int, std::pair<int, uint64_t>> ready;
  const std::regex re(R"(ready ([0-9]+) pid ([0-9]+) probed 0x([0-9a-f]+))");
  for (std::sregex_iterator it((*k)->out().begin(), (*k)->out().end(), re), end; it != end; ++it) {
    uint64_t addr = 0;
    ASSERT_TRUE(absl::SimpleHexAtoi((*it)[3].str(), &addr));
    ready[std::stoi((*it)[1].str())] = {std::stoi((*it)[2].str()), addr};
  }
  ASSERT_EQ(ready.size(), 2u);
  ASSERT_EQ(kill((*k)->pid(), SIGINT), 0);
  ASSERT_TRUE((*k)->WaitForStdout("\"type\":\"summary\"").ok()) << (*k)->err();
  // The children keep running (waiting for GO) with their original code.
  for (const auto& [tag, who] : ready) {
    const auto [pid, addr] = who;
    const int fd = open(absl::StrCat("/proc/", pid, "/mem").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << "child " << tag << " (pid " << pid << ") is gone";
    uint8_t byte = 0;
    ASSERT_EQ(pread(fd, &byte, 1, static_cast<off_t>(addr)), 1);
    close(fd);
    EXPECT_NE(byte, 0xcc) << "INT3 left at probed in child " << tag;
    EXPECT_NE(byte, 0xe9) << "jmp left at probed in child " << tag;
    EXPECT_EQ(ProcStatusTracer(pid), "0") << "child " << tag << " still traced";
  }
  std::ofstream(go).put('1');
  auto done = (*k)->Finish();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0) << done->err;
  const Hits h = ParseHits(done->out);
  EXPECT_EQ(h.summary["stop_reason"], "interrupted by INT");
  const int target = h.summary["pid"].get<int>();
  int status = 0;
  ASSERT_EQ(waitpid(target, &status, 0), target);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 3);
  // Phase 2 ran unprobed: each child ran 20k calls of probed(k) (returning k + 1).
  EXPECT_THAT(done->out, HasSubstr("child 1 sum=40\n"));
  EXPECT_THAT(done->out, HasSubstr("child 2 sum=120\n"));
  EXPECT_THAT(done->out, HasSubstr("child 1 exited 1\n"));
  EXPECT_THAT(done->out, HasSubstr("child 2 exited 2\n"));
  EXPECT_THAT(done->out, HasSubstr("main sum=5\n"));
  const auto by_tag = ProbedByTag(h);
  EXPECT_EQ(by_tag.at(1).begin()->second, 10);
  EXPECT_EQ(by_tag.at(2).begin()->second, 20);
  EXPECT_EQ(by_tag.at(100).begin()->second, 7);
  std::filesystem::remove(go);
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

}  // namespace
}  // namespace kwatch
