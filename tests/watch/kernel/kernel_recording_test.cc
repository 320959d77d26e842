// watch/kernel/kernel_recording.h: a kernel session's recording (-o), written and read back.
#include "watch/kernel/kernel_recording.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kernel/kernel_symbols.h"
#include "core/store/trace_reader.h"
#include "watch/recording_sink.h"

namespace kwatch::watch::kernel {
namespace {

// The next sink: counts what it is given.
class CountingSink final : public KernelEventSink {
 public:
  absl::Status OnEvent(const KernelEvent& /*ev*/, const KernelWatch& /*w*/) override {
    ++events;
    return absl::OkStatus();
  }
  void OnDrained() override { ++drained; }
  absl::Status OnStepEnd() override {
    ++steps;
    return absl::OkStatus();
  }
  void OnNote(const KernelNote& /*note*/) override { ++notes; }
  void OnSummary(const KernelSummary& /*summary*/,
                 std::span<const KernelWatch> /*watches*/) override {
    ++summaries;
  }

  int events = 0;
  int drained = 0;
  int steps = 0;
  int notes = 0;
  int summaries = 0;
};

class KernelRecordingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("kwatch-krec-", getpid());
    std::filesystem::create_directories(dir_);
    auto s = core::kernel::KernelSymbolResolver::Create({});
    ASSERT_TRUE(s.ok()) << s.status();
    symbols_ = *std::move(s);
    const core::kernel::KernelSymbol* schedule = symbols_->kallsyms().Find("schedule");
    ASSERT_NE(schedule, nullptr);
    site_ = schedule->addr + 0x10;
    watches_.resize(2);
    watches_[0].display = "jiffies";
    watches_[0].addr = 0xffffffff82000000ULL;
    watches_[0].len = 8;
    watches_[0].cpus = {0, 1};
    watches_[1].display = "init_task.prio";
    watches_[1].addr = 0xffffffff82000040ULL;
    watches_[1].len = 4;
    watches_[1].type_name = "int";
    watches_[1].cpus = {1};
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  RecordingSpec Spec() const {
    return RecordingSpec{(dir_ / "k.kwdb").string(), "kwatch --write jiffies -o k.kwdb", "9.9"};
  }
  KernelEvent Event(size_t watch, uint32_t tid, uint32_t cpu, uint64_t time) const {
    KernelEvent ev;
    ev.s.ip = site_;
    ev.s.pid = tid;
    ev.s.tid = tid;
    ev.s.cpu = cpu;
    ev.s.time = time;
    ev.watch = watch;
    return ev;
  }

  std::filesystem::path dir_;
  std::unique_ptr<core::kernel::KernelSymbolResolver> symbols_;
  uint64_t site_ = 0;
  std::vector<KernelWatch> watches_;
};

TEST_F(KernelRecordingTest, EventsSitesTasksAndTheEnd) {
  auto writer = CreateKernelRecording(Spec(), 0, watches_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  TaskNames names;
  CountingSink next;
  KernelRecordingSink sink(**writer, *symbols_, names, next);
  KernelEvent first = Event(0, 0, 1, 1000);
  first.value = 42;
  ASSERT_TRUE(sink.OnEvent(first, watches_[0]).ok());
  ASSERT_TRUE(sink.OnEvent(Event(1, 0, 0, 2000), watches_[1]).ok());
  sink.OnDrained();
  ASSERT_TRUE(sink.OnStepEnd().ok());
  sink.OnNote(KernelNote{});
  sink.OnSummary(KernelSummary{}, watches_);
  EXPECT_EQ(next.events, 2);
  EXPECT_EQ(next.drained, 1);
  EXPECT_EQ(next.steps, 1);
  EXPECT_EQ(next.notes, 1);
  EXPECT_EQ(next.summaries, 1);
  KernelSessionEnd end;
  end.stop_reason = "interrupted by INT";
  end.lost = 3;
  const RecordingOutcome outcome = sink.Finish(end);
  EXPECT_TRUE(outcome.complete);
  EXPECT_TRUE(outcome.error.ok()) << outcome.error;
  EXPECT_EQ(outcome.events, 2U);
  EXPECT_EQ(outcome.path, Spec().path);
  EXPECT_EQ(outcome.warning, "");
  EXPECT_EQ(outcome.kept_at, "");

  auto r = core::store::TraceReader::Open(Spec().path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)->complete());
  EXPECT_EQ((*r)->session().mode, "kernel");
  EXPECT_EQ((*r)->session().backend, "perf");
  EXPECT_EQ((*r)->session().pid, 0);
  EXPECT_EQ((*r)->session().kwatch_version, "9.9");
  EXPECT_EQ((*r)->session().command_line, "kwatch --write jiffies -o k.kwdb");
  ASSERT_TRUE((*r)->end().has_value());
  EXPECT_EQ((*r)->end()->exit_reason, "interrupted by INT");
  EXPECT_EQ((*r)->end()->lost_count, 3U);
  EXPECT_FALSE((*r)->end()->exit_status.has_value());
  ASSERT_EQ((*r)->watches().size(), 2U);
  EXPECT_EQ((*r)->watches()[0].expr, "jiffies");
  EXPECT_EQ((*r)->watches()[0].kind, "w");
  EXPECT_EQ((*r)->watches()[0].coverage, "8 bytes (hardware breakpoint on CPUs 0,1)");
  EXPECT_EQ((*r)->watches()[1].coverage, "4 bytes (hardware breakpoint on CPUs 1)");
  EXPECT_EQ((*r)->watches()[1].type_name, "int");
  EXPECT_EQ((*r)->watches()[1].address.value, 0xffffffff82000040ULL);
  // One site for both events: schedule+0x10.
  ASSERT_EQ((*r)->sites().size(), 1U);
  EXPECT_EQ((*r)->sites()[0].ip.value, site_);
  EXPECT_EQ((*r)->sites()[0].function, "schedule");
  EXPECT_EQ((*r)->sites()[0].offset, 0x10U);
  // tid 0 on CPUs 1 and 0: each CPU's idle task.
  ASSERT_EQ((*r)->tasks().size(), 2U);
  std::vector<std::string> comms = {(*r)->tasks()[0].comm, (*r)->tasks()[1].comm};
  std::sort(comms.begin(), comms.end());
  EXPECT_EQ(comms, (std::vector<std::string>{"swapper/0", "swapper/1"}));
  std::vector<core::AccessEvent> events;
  ASSERT_TRUE((*r)->ForEachEvent({},
                                 [&](const core::AccessEvent& e) {
                                   events.push_back(e);
                                   return true;
                                 })
                  .ok());
  ASSERT_EQ(events.size(), 2U);
  EXPECT_EQ(events[0].time_ns, 1000U);
  EXPECT_EQ(events[0].watch_id, 0U);
  EXPECT_EQ(events[0].cpu, 1U);
  EXPECT_EQ(events[0].kind, core::AccessKind::kWrite);
  EXPECT_EQ(events[0].addr.value, 0xffffffff82000000ULL);
  EXPECT_EQ(events[0].len, 8U);
  EXPECT_EQ(events[0].ip.value, site_);
  EXPECT_EQ(events[0].value, std::optional<uint64_t>(42));
  EXPECT_FALSE(events[0].value_exact);
  EXPECT_EQ(events[1].watch_id, 1U);
  EXPECT_EQ(events[1].len, 4U);
  EXPECT_FALSE(events[1].value.has_value());
}

TEST_F(KernelRecordingTest, KernelAccessesRecording) {
  auto writer = CreateKernelRecording(Spec(), 4242, std::span(watches_).first(1));
  ASSERT_TRUE(writer.ok()) << writer.status();
  const RecordingOutcome outcome = FinishRecording(**writer, absl::OkStatus(), {});
  EXPECT_TRUE(outcome.complete);
  EXPECT_EQ(outcome.events, 0U);
  auto r = core::store::TraceReader::Open(Spec().path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->session().mode, "kernel-accesses");
  EXPECT_EQ((*r)->session().pid, 4242);
  ASSERT_EQ((*r)->watches().size(), 1U);
  EXPECT_EQ((*r)->watches()[0].coverage, "8 bytes (hardware breakpoint, kernel accesses only)");
}

TEST_F(KernelRecordingTest, AFailureIsKeptAndSaid) {
  auto writer = CreateKernelRecording(Spec(), 0, watches_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const absl::Status broken = absl::ResourceExhaustedError("disk full");
  EXPECT_EQ(RecordingFailed(broken), absl::ResourceExhaustedError("recording failed: disk full"));
  EXPECT_TRUE(RecordingFailed(absl::OkStatus()).ok());
  const RecordingOutcome outcome = FinishRecording(**writer, broken, {});
  EXPECT_FALSE(outcome.complete);
  EXPECT_EQ(outcome.error, broken);
  EXPECT_EQ(outcome.kept_at, Spec().path);
  EXPECT_EQ(outcome.path, "");
}

}  // namespace
}  // namespace kwatch::watch::kernel
