#include "watch/kernel/kernel_session.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "watch/kernel/drain_values.h"
#include "watch/kernel/kernel_event.h"
#include "watch/perf_util.h"

namespace kwatch::watch::kernel {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Registers without breakpoints: records what the session asks, refuses what it is told to.
class FakeRegisters final : public KernelRegisters {
 public:
  struct Log {
    std::vector<std::pair<size_t, int>> requests;  // (watch, cpu)
    std::vector<int> released;
    int changed = 0;
    bool closed = false;
  };
  FakeRegisters(Log& log, absl::Status refusal, std::vector<ClosedBreakpoint> on_release)
      : log_(log), refusal_(std::move(refusal)), on_release_(std::move(on_release)) {}

  std::vector<ArmedBreakpoint> Armed() override { return {}; }
  absl::Status Request(size_t w, uint64_t, uint64_t, int cpu) override {
    log_.requests.emplace_back(w, cpu);
    return refusal_;
  }
  std::vector<ClosedBreakpoint> ReleaseCpu(int cpu) override {
    log_.released.push_back(cpu);
    return std::exchange(on_release_, {});
  }
  void CloseAll() override { log_.closed = true; }
  void Changed() override { ++log_.changed; }

 private:
  Log& log_;
  absl::Status refusal_;
  std::vector<ClosedBreakpoint> on_release_;
};

class RecordingSink final : public KernelEventSink {
 public:
  absl::Status OnEvent(const KernelEvent&, const KernelWatch&) override {
    ++events;
    return absl::OkStatus();
  }
  void OnNote(const KernelNote& note) override { notes.push_back(note); }
  void OnSummary(const KernelSummary& s, std::span<const KernelWatch> w) override {
    summary = s;
    watches = w.size();
  }
  std::vector<KernelNote::Kind> Kinds() const {
    std::vector<KernelNote::Kind> out;
    for (const KernelNote& n : notes) {
      out.push_back(n.kind);
    }
    return out;
  }

  int events = 0;
  std::vector<KernelNote> notes;
  KernelSummary summary;
  size_t watches = 0;
};

KernelWatch Watch(std::vector<int> cpus) {
  KernelWatch w;
  w.display = "jiffies";
  w.addr = 0xffffffff82000000ULL;
  w.len = 8;
  w.cpus = std::move(cpus);
  return w;
}

// Runs Steps until the session ends (a short --duration).
KernelSessionEnd RunToEnd(KernelWatchSession& s) {
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<bool> more = s.Step(absl::Milliseconds(100));
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) {
      break;
    }
  }
  absl::StatusOr<KernelSessionEnd> end = s.Finish();
  EXPECT_TRUE(end.ok()) << end.status();
  return end.ok() ? *end : KernelSessionEnd{};
}

TEST(KernelWatchSession, EndsAtItsDurationWithTheSummaryAndClosesTheRegisters) {
  FakeRegisters::Log log;
  RecordingSink sink;
  KernelSessionOptions opts;
  opts.duration = 0.1;
  auto s = KernelWatchSession::Create(
      opts, {Watch(OnlineCpus())},
      std::make_unique<FakeRegisters>(log, absl::OkStatus(), std::vector<ClosedBreakpoint>{}),
      nullptr, nullptr, sink);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(log.changed, 1);  // published once at the start
  const KernelSessionEnd end = RunToEnd(**s);
  EXPECT_EQ(end.stop_reason, "--duration 0.1s elapsed");
  EXPECT_EQ(sink.summary.stop_reason, end.stop_reason);
  EXPECT_EQ(sink.summary.events, 0u);
  EXPECT_THAT(sink.summary.counted, ElementsAre(0u));
  EXPECT_EQ(sink.watches, 1u);
  EXPECT_THAT(log.requests, IsEmpty());  // every online CPU was held already
  EXPECT_THAT(sink.notes, IsEmpty());
  EXPECT_TRUE(log.closed);
  EXPECT_FALSE(end.exit_status.has_value());
}

TEST(KernelWatchSession, ArmsEveryOnlineCpuThatHoldsNoRegister) {
  FakeRegisters::Log log;
  RecordingSink sink;
  KernelSessionOptions opts;
  opts.duration = 0.1;
  auto s = KernelWatchSession::Create(
      opts, {Watch({})},
      std::make_unique<FakeRegisters>(log, absl::OkStatus(), std::vector<ClosedBreakpoint>{}),
      nullptr, nullptr, sink);
  ASSERT_TRUE(s.ok()) << s.status();
  (void)RunToEnd(**s);
  const std::vector<int> online = OnlineCpus();
  ASSERT_EQ(log.requests.size(), online.size());  // once each: then they are held
  std::vector<KernelNote::Kind> expected(online.size(), KernelNote::Kind::kCpuArmed);
  EXPECT_EQ(sink.Kinds(), expected);
  EXPECT_EQ(sink.notes.front().cpu, online.front());
  EXPECT_EQ(sink.notes.front().count, 1u);
  EXPECT_EQ(log.changed, 1 + static_cast<int>(online.size()));
  EXPECT_EQ((*s)->watches().front().cpus, online);
}

TEST(KernelWatchSession, ACpuWhoseRegistersAreAllTakenIsSaidOnceAndLeft) {
  FakeRegisters::Log log;
  RecordingSink sink;
  KernelSessionOptions opts;
  opts.duration = 0.2;
  std::vector<int> online = OnlineCpus();
  const int missing = online.back();
  online.pop_back();
  auto s = KernelWatchSession::Create(
      opts, {Watch(online)},
      std::make_unique<FakeRegisters>(log, absl::ResourceExhaustedError("all 4 in use"),
                                      std::vector<ClosedBreakpoint>{}),
      nullptr, nullptr, sink);
  ASSERT_TRUE(s.ok()) << s.status();
  (void)RunToEnd(**s);
  ASSERT_EQ(log.requests.size(), 1u);  // drmgr's refusals do not change by waiting
  EXPECT_EQ(sink.Kinds(),
            (std::vector{KernelNote::Kind::kCpuRefused, KernelNote::Kind::kCpuUnwatched}));
  EXPECT_EQ(sink.notes[0].cpu, missing);
  EXPECT_EQ(sink.notes[0].why.message(), "all 4 in use");
  EXPECT_EQ(sink.notes[1].cpu, missing);
}

TEST(KernelWatchSession, AnOfflineCpuIsRetiredAndWhatItCountedKept) {
  FakeRegisters::Log log;
  RecordingSink sink;
  KernelSessionOptions opts;
  opts.duration = 0.1;
  std::vector<int> cpus = OnlineCpus();
  constexpr int kGone = 4095;  // held, but not online
  cpus.push_back(kGone);
  auto s = KernelWatchSession::Create(
      opts, {Watch(cpus)},
      std::make_unique<FakeRegisters>(log, absl::OkStatus(),
                                      std::vector<ClosedBreakpoint>{{7, 2, {0}}}),
      nullptr, nullptr, sink);
  ASSERT_TRUE(s.ok()) << s.status();
  (void)RunToEnd(**s);
  EXPECT_THAT(log.released, ElementsAre(kGone));
  EXPECT_EQ(sink.Kinds(), std::vector{KernelNote::Kind::kCpuOffline});
  EXPECT_EQ(sink.notes[0].cpu, kGone);
  EXPECT_THAT(sink.summary.counted, ElementsAre(7u));
  EXPECT_EQ(sink.summary.lost, 2u);
  EXPECT_EQ((*s)->watches().front().cpus, OnlineCpus());
}

TEST(SiteTally, CountsEventsThatRepeatTheirTasksPreviousIpOnTheirCpu) {
  SiteTally t;
  PerfSample s;
  s.ip = 0x10;
  s.tid = 5;
  s.cpu = 0;
  t.Add(s);
  t.Add(s);  // same task, CPU and IP: repeated
  s.cpu = 1;
  t.Add(s);  // another CPU: first of its own
  s.ip = 0x20;
  t.Add(s);
  EXPECT_EQ(t.repeated, 1u);
  EXPECT_EQ(t.first_repeated_ip, 0x10u);
  const auto sites = SitesByEvents(t);
  ASSERT_EQ(sites.size(), 2u);
  EXPECT_EQ(sites[0].first, 0x10u);
  EXPECT_EQ(sites[0].second->events, 3u);
  EXPECT_THAT(sites[0].second->cpus, ElementsAre(0u, 1u));
}

TEST(DrainValues, WithoutKernelMemoryNothingIsRead) {
  DrainValues v(nullptr, 1);
  EXPECT_FALSE(v.Enabled());
  const DrainValues::Value got = v.Get(0, Watch({}));
  EXPECT_FALSE(got.value.has_value());
  EXPECT_TRUE(got.first_failure.ok());
}

}  // namespace
}  // namespace kwatch::watch::kernel
