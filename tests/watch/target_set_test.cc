#include "watch/target_set.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/ptrace/process.h"
#include "core/ptrace/process_group.h"
#include "tests/test_util.h"
#include "watch/access_sink.h"
#include "watch/session.h"

namespace kwatch::watch {
namespace {

using ::kwatch::testing::TargetPath;
using ::testing::HasSubstr;

// Counts what a TargetSet sends: events per pid, notes by kind, the summary's info.
class CountingSink final : public AccessSink {
 public:
  absl::Status OnEvent(WatchSession& /*session*/, Summary& /*summary*/, const core::AccessEvent& ev,
                       const core::AccessEvent& as_counted) override {
    ++events_by_pid[ev.pid];
    EXPECT_EQ(as_counted.pid, ev.pid);
    return absl::OkStatus();
  }
  absl::Status OnDrained() override {
    ++drains;
    return absl::OkStatus();
  }
  void OnNote(const AccessNote& note) override { notes[note.kind].push_back(note); }
  void OnSummary(const AccessSummary& summary) override {
    info = summary.info;
    summary_events = summary.summary.events();
  }

  std::map<pid_t, uint64_t> events_by_pid;
  std::map<AccessNote::Kind, std::vector<AccessNote>> notes;
  uint64_t drains = 0;
  std::optional<RunInfo> info;
  uint64_t summary_events = 0;
};

// The writes of fork_watch's processes as they reported them: pid -> writes, over every image.
std::map<pid_t, long> ReadTruth(const std::string& path) {
  std::map<pid_t, long> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    // {"pid":P,"parent":Q,"writes":N,...}: the numbers after "pid": and "writes":.
    auto number_after = [&](const std::string& key) {
      const size_t at = line.find(key);
      long v = -1;
      if (at != std::string::npos) {
        const size_t start = at + key.size();
        const size_t end = line.find_first_of(",}", start);
        (void)absl::SimpleAtoi(line.substr(start, end - start), &v);
      }
      return v;
    };
    out[static_cast<pid_t>(number_after("\"pid\":"))] += number_after("\"writes\":");
  }
  return out;
}

// A launched target with its page-protection session on `expr` armed, as `kwatch` sets one up.
struct Launched {
  core::UniqueFd sigfd;
  std::unique_ptr<core::ptrace::ProcessGroup> group;
  std::unique_ptr<core::ptrace::Process> proc;
  std::unique_ptr<WatchSession> session;
  SessionOptions session_opts;
};

std::optional<Launched> Launch(const std::vector<std::string>& argv, const std::string& expr,
                               bool follow_forks) {
  Launched l;
  auto sigfd = BlockSessionSignals();
  EXPECT_TRUE(sigfd.ok()) << sigfd.status();
  if (!sigfd.ok()) {
    return std::nullopt;
  }
  l.sigfd = *std::move(sigfd);
  if (follow_forks) {
    l.group = std::make_unique<core::ptrace::ProcessGroup>(/*follow_forks=*/true);
  }
  core::ptrace::LaunchOptions lo;
  auto proc = core::ptrace::Process::Start(std::nullopt, argv, lo);
  EXPECT_TRUE(proc.ok()) << proc.status();
  if (!proc.ok()) {
    return std::nullopt;
  }
  l.proc = *std::move(proc);
  if (l.group != nullptr) {
    l.group->Add(*l.proc);
  }
  WatchRequest req;
  req.expr = expr;
  req.kind = drmgr::DrKind::kWrite;
  l.session_opts.backend = BackendKind::kPage;  // exact without debug traps
  auto session = WatchSession::Create(*l.proc, {req}, l.session_opts);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) {
    (void)l.proc->Kill();
    return std::nullopt;
  }
  l.session = *std::move(session);
  if (absl::Status s = l.session->Arm(); !s.ok()) {
    ADD_FAILURE() << s;
    (void)l.proc->Kill();
    return std::nullopt;
  }
  return l;
}

std::unique_ptr<TargetSet> MakeSet(Launched& l, const TargetSetOptions& opts, AccessSink& sink) {
  auto set = TargetSet::Create(opts, l.session_opts, std::move(l.sigfd), std::move(l.group),
                               std::move(l.proc), std::move(l.session), {}, sink);
  EXPECT_TRUE(set.ok()) << set.status();
  return set.ok() ? *std::move(set) : nullptr;
}

absl::StatusOr<TargetSetEnd> RunToEnd(TargetSet& set) {
  for (int steps = 0; steps < 10'000; ++steps) {
    absl::StatusOr<bool> more = set.Step();
    if (!more.ok()) {
      set.Abandon();
      return more.status();
    }
    if (!*more) {
      return set.Finish();
    }
  }
  set.Abandon();
  return absl::DeadlineExceededError("the session did not end");
}

std::string TruthFile(const std::string& name) {
  std::string p = ::testing::TempDir() + "target_set_" + name + "_" + std::to_string(::getpid());
  std::remove(p.c_str());
  return p;
}

// With a process group, every process of fork_watch's tree is followed: the sink sees exactly
// the writes each one made, under its own pid, and the summary lists each with its counts.
TEST(TargetSet, FollowsForksAndCountsEveryProcessExactly) {
  const std::string truth = TruthFile("follow");
  std::optional<Launched> l =
      Launch({TargetPath("fork_watch"), "3", truth}, "g_counter", /*follow_forks=*/true);
  ASSERT_TRUE(l.has_value());
  const pid_t main_pid = l->proc->pid();
  CountingSink sink;
  std::unique_ptr<TargetSet> set = MakeSet(*l, {}, sink);
  ASSERT_NE(set, nullptr);
  EXPECT_TRUE(set->follows_forks());
  auto end = RunToEnd(*set);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->exit_status, 3);  // fork_watch's main exits 3
  EXPECT_EQ(end->info.stop_reason, "target exited; its followed children ended");

  const std::map<pid_t, long> t = ReadTruth(truth);
  ASSERT_EQ(t.size(), 5U);  // main, 3 children, the grandchild
  ASSERT_EQ(t.count(main_pid), 1U);
  long total = 0;
  for (const auto& [pid, writes] : t) {
    EXPECT_EQ(sink.events_by_pid.contains(pid) ? sink.events_by_pid.at(pid) : 0U,
              static_cast<uint64_t>(writes))
        << "pid " << pid;
    total += writes;
  }
  EXPECT_EQ(total, 5 + 10 + 7 + 30 + 30);
  EXPECT_EQ(sink.events_by_pid.size(), t.size());
  EXPECT_EQ(sink.summary_events, static_cast<uint64_t>(total));
  ASSERT_TRUE(sink.info.has_value());
  ASSERT_EQ(sink.info->processes.size(), 5U);
  EXPECT_EQ(sink.info->processes[0].pid, main_pid);
  EXPECT_EQ(sink.info->processes[0].parent, 0);
  for (const RunInfo::Process& p : sink.info->processes) {
    ASSERT_EQ(t.count(p.pid), 1U) << p.pid;
    EXPECT_EQ(p.events, static_cast<uint64_t>(t.at(p.pid))) << p.pid;
    EXPECT_EQ(p.per_watch, std::vector<uint64_t>{p.events}) << p.pid;
    ASSERT_TRUE(p.exit.has_value()) << p.pid;
  }
  // Each child was announced when it was adopted, and its end when it ended.
  EXPECT_EQ(sink.notes[AccessNote::Kind::kChildFollowed].size(), 4U);
  EXPECT_EQ(sink.notes[AccessNote::Kind::kChildExited].size(), 4U);
  EXPECT_TRUE(sink.notes[AccessNote::Kind::kDetached].empty());
}

// Without a process group the children are not followed: only the target's own writes count,
// and the summary says the forks were let go.
TEST(TargetSet, WithoutFollowingCountsTheTargetOnly) {
  const std::string truth = TruthFile("nofollow");
  std::optional<Launched> l =
      Launch({TargetPath("fork_watch"), "3", truth}, "g_counter", /*follow_forks=*/false);
  ASSERT_TRUE(l.has_value());
  const pid_t main_pid = l->proc->pid();
  CountingSink sink;
  std::unique_ptr<TargetSet> set = MakeSet(*l, {}, sink);
  ASSERT_NE(set, nullptr);
  auto end = RunToEnd(*set);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->exit_status, 3);
  EXPECT_EQ(end->info.stop_reason, "target exited");
  EXPECT_EQ(sink.events_by_pid, (std::map<pid_t, uint64_t>{{main_pid, 5}}));
  EXPECT_TRUE(end->info.processes.empty());
  ASSERT_EQ(end->info.notes.size(), 1U);
  EXPECT_EQ(end->info.notes[0],
            "the target forked 3 children: not followed (-f follows them), each let go with none "
            "of kwatch's watches");
}

// --count: the session ends after exactly that many events, and lets the target go.
TEST(TargetSet, StopsAtTheCount) {
  std::optional<Launched> l =
      Launch({TargetPath("field_writer"), "2", "100000", "--truth", "/dev/null"}, "g_stats.hits",
             /*follow_forks=*/false);
  ASSERT_TRUE(l.has_value());
  const pid_t main_pid = l->proc->pid();
  CountingSink sink;
  TargetSetOptions opts;
  opts.count = 7;
  opts.kill_on_exit = true;
  std::unique_ptr<TargetSet> set = MakeSet(*l, opts, sink);
  ASSERT_NE(set, nullptr);
  auto end = RunToEnd(*set);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_THAT(end->info.stop_reason, HasSubstr("--count 7 reached"));
  EXPECT_EQ(sink.events_by_pid, (std::map<pid_t, uint64_t>{{main_pid, 7}}));
  EXPECT_EQ(sink.summary_events, 7U);
  EXPECT_GE(sink.drains, 1U);
}

}  // namespace
}  // namespace kwatch::watch
