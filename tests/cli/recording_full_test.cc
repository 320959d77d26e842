// `kwatch ... -o FILE` when the disk fills up (a real, small tmpfs in a private mount
// namespace of the test process, which kwatch inherits) and when the output directory is
// removed while recording: kwatch stops cleanly, says why and how much was committed, the
// target runs on unharmed (exact ground truth and exit status), and the recording left behind
// reads with `kwatch report`, holding exactly the events it says were committed.
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/store/trace_reader.h"
#include "tests/cli/cli_test_util.h"
#include "tests/core/store/private_tmpfs.h"
#include "tests/test_util.h"

namespace kwatch::clitest {
namespace {

using ::kwatch::testing::PrivateTmpfs;
using ::kwatch::testing::Spawned;
using ::kwatch::testing::SubreaperScope;
using ::kwatch::testing::TargetPath;

// The first number after `prefix` in `text`, or nullopt.
std::optional<uint64_t> NumberAfter(const std::string& text, const std::string& prefix) {
  const std::regex re(prefix + "([0-9]+)");
  std::smatch m;
  uint64_t n = 0;
  if (!std::regex_search(text, m, re) || !absl::SimpleAtoi(m[1].str(), &n)) {
    return std::nullopt;
  }
  return n;
}

// The target `pid`'s shell status. kwatch detaches a launched target when a recording fails
// and lets it run on: it is then reparented to this test (a subreaper) and waited for here.
// Under load the target may instead end while kwatch is still stopping, and kwatch, its
// parent, reaps it and reports the status (`target PID exited with status N` in
// `kwatch_output`): that status is taken. -1 when neither happened.
int WaitTarget(pid_t pid, const std::string& kwatch_output) {
  int status = 0;
  if (::waitpid(pid, &status, 0) == pid) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  if (errno != ECHILD) {
    return -1;
  }
  const std::optional<uint64_t> code =
      NumberAfter(kwatch_output, absl::StrCat("target ", pid, " exited with status "));
  return code.has_value() ? static_cast<int>(*code) : -1;
}

// What the recording says it committed, read back: the events (or hits) must be exactly as
// many as the stop message said, and `kwatch report` must read the file.
void CheckCutRecording(const std::string& path, const std::string& kwatch_output, bool probe) {
  const std::optional<uint64_t> said = NumberAfter(
      kwatch_output, probe ? "recording stopped with 0 events and " : "recording stopped with ");
  ASSERT_TRUE(said.has_value()) << kwatch_output;
  auto r = core::store::TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)->complete());
  EXPECT_TRUE(absl::StrContains((*r)->cut_reason(), "No space left on device"))
      << (*r)->cut_reason();
  auto count = probe ? (*r)->CountHits() : (*r)->CountEvents();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, *said);
  EXPECT_GT(*count, 0u);
  r->reset();
  auto report = ::kwatch::testing::Run({KwatchPath(), "report", path});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->exit_code, 0) << report->err;
  EXPECT_TRUE(absl::StrContains(report->out, probe
                                                 ? absl::StrCat("0 events, ", *said, " probe hits")
                                                 : absl::StrCat("recorded  ", *said, " events")))
      << report->out;
  EXPECT_TRUE(absl::StrContains(report->err, "cut short")) << report->err;
}

TEST(RecordingFull, WatchOnAFullDiskStopsCleanlyAndLeavesAReadableRecording) {
  SubreaperScope subreaper;
  // 1.5 MiB, of which kwatch's reserve takes 1: the 200,000 events' recording takes about
  // 0.7 MB in blocks with a WAL of a few hundred KiB (3 MiB filled while the WAL grew to 16 MiB).
  auto fs = PrivateTmpfs::Mount(3 << 19);
  KW_REQUIRE_FEATURE(fs.ok(), std::string(fs.status().message()));
  const std::string path = (*fs)->File("run.kwdb");
  const std::string truth = ::testing::TempDir() + "recording_full_truth.txt";
  std::filesystem::remove(truth);
  auto run = ::kwatch::testing::Run({KwatchPath(), "--backend", "page", "--rw", "g_stats.hits",
                                     "-q", "-o", path, "--", TargetPath("field_writer"), "2",
                                     "100000", "--truth", truth, "--exit", "7"});
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string all = run->out + run->err;
  // Said at once, with the file, the error and the counts.
  EXPECT_TRUE(absl::StrContains(all, absl::StrCat("recording failed: committing to ", path)) ||
              absl::StrContains(all, absl::StrCat("recording failed: writing events to ", path)))
      << all;
  EXPECT_TRUE(absl::StrContains(all, "No space left on device")) << all;
  EXPECT_NE(run->exit_code, 0) << "a failed recording must make kwatch exit non-zero\n" << all;
  const std::optional<uint64_t> pid = NumberAfter(run->err, "armed 1 watch on pid ");
  ASSERT_TRUE(pid.has_value()) << run->err;
  // The target ran on, unharmed: exact ground truth, its own exit status.
  EXPECT_EQ(WaitTarget(static_cast<pid_t>(*pid), all), 7) << all;
  const auto t = ReadTruth(truth);
  ASSERT_EQ(t.size(), 2u);
  for (const auto& [tid, v] : t) {
    EXPECT_EQ(v.hits_w, 100000) << tid;
    EXPECT_EQ(v.misses_w, 50000) << tid;
    EXPECT_EQ(v.flags_r, 25000) << tid;
  }
  CheckCutRecording(path, all, /*probe=*/false);
  std::filesystem::remove(truth);
}

TEST(RecordingFull, ProbeOnAFullDiskStopsCleanlyAndLeavesAReadableRecording) {
  SubreaperScope subreaper;
  auto fs = PrivateTmpfs::Mount(3 << 20);
  KW_REQUIRE_FEATURE(fs.ok(), std::string(fs.status().message()));
  const std::string path = (*fs)->File("run.kwdb");
  // The ptrace backend: every hit is recorded (the agent's rings would drop most of them at
  // this rate, counted as lost, and the disk might not fill).
  auto run = ::kwatch::testing::Run({KwatchPath(), "probe", "--backend", "ptrace", "-q", "-o", path,
                                     "tick i", "--", TargetPath("uprobe_loop"), "300000",
                                     "--threads", "2"});
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string all = run->out + run->err;
  EXPECT_TRUE(absl::StrContains(all, absl::StrCat("committing to ", path))) << all;
  EXPECT_TRUE(absl::StrContains(all, "No space left on device")) << all;
  EXPECT_NE(run->exit_code, 0) << "a failed recording must make kwatch exit non-zero\n" << all;
  const std::optional<uint64_t> pid = NumberAfter(run->err, "armed 1 probe on pid ");
  ASSERT_TRUE(pid.has_value()) << run->err;
  // Every INT3 removed: the target finishes with its exact result and status 0.
  EXPECT_EQ(WaitTarget(static_cast<pid_t>(*pid), all), 0) << all;
  // sum over 2 threads t of sum_i (3i + 100 + t), i < 300000.
  EXPECT_TRUE(absl::StrContains(run->out, "sum=270059400000")) << run->out;
  CheckCutRecording(path, all, /*probe=*/true);
}

TEST(RecordingFull, RemovedOutputDirectoryIsReportedAsLost) {
  SubreaperScope subreaper;
  std::string dir = ::testing::TempDir() + "kwatch_vanish_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/run.kwdb";
  const std::string truth = ::testing::TempDir() + "recording_vanish_truth.txt";
  std::filesystem::remove(truth);
  auto kw =
      Spawned::Start({KwatchPath(), "--backend", "page", "--rw", "g_stats.hits", "-q", "-o", path,
                      "--", TargetPath("field_writer"), "1", "3000000", "--truth", truth});
  ASSERT_TRUE(kw.ok()) << kw.status();
  ASSERT_TRUE((*kw)->WaitForStderr("armed 1 watch on pid").ok()) << (*kw)->err();
  ::usleep(300'000);
  std::filesystem::remove_all(dir);
  auto run = (*kw)->Finish(60);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string all = run->out + run->err;
  EXPECT_TRUE(absl::StrContains(all, path + ": the recording's file was removed while recording"))
      << all;
  EXPECT_TRUE(absl::StrContains(all, "the recording is lost")) << all;
  // Never a claim that the file holds anything.
  EXPECT_FALSE(absl::StrContains(all, "holds the events committed")) << all;
  EXPECT_FALSE(absl::StrContains(all, "kwatch report " + path)) << all;
  EXPECT_NE(run->exit_code, 0) << all;
  struct stat st {};
  EXPECT_NE(::stat(dir.c_str(), &st), 0) << "kwatch re-created " << dir;
  const std::optional<uint64_t> pid = NumberAfter(run->err, "armed 1 watch on pid ");
  ASSERT_TRUE(pid.has_value()) << run->err;
  EXPECT_EQ(WaitTarget(static_cast<pid_t>(*pid), all), 0) << all;
  const auto t = ReadTruth(truth);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t.begin()->second.hits_w, 3000000);
  std::filesystem::remove(truth);
}

}  // namespace
}  // namespace kwatch::clitest
