// The library sinks of a probe session: the tally (per-probe counts, argument values, --count),
// the recorder (against a real TraceWriter and what TraceReader reads back), and the fan-out.

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/base/status_macros.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#include "tests/scratch_store.h"
#include "watch/probe/hit_fanout.h"
#include "watch/probe/hit_recorder.h"
#include "watch/probe/hit_tally.h"

namespace kwatch::watch::probe {
namespace {

// Two probes as ResolveProbes makes them: an entry with a source line and a return probe.
std::vector<ProbeDef> TwoProbes() {
  std::vector<ProbeDef> probes(2);
  probes[0].id = 1;
  probes[0].spec = "tick i r->len";
  probes[0].point.event = "tick";
  probes[0].point.function = "tick";
  probes[0].point.vaddr = core::RemoteAddr{0x1189};
  probes[0].point.function_start = core::RemoteAddr{0x1189};
  probes[0].point.file = "/src/uprobe_loop.c";
  probes[0].point.line = 17;
  probes[0].point.insn_text = "endbr64";
  probes[1].id = 2;
  probes[1].spec = "tick%return $retval";
  probes[1].point.event = "tick__return";
  probes[1].point.function = "tick";
  probes[1].point.vaddr = core::RemoteAddr{0x1189};
  probes[1].point.function_start = core::RemoteAddr{0x1189};
  probes[1].point.file = "/src/uprobe_loop.c";
  probes[1].point.line = 17;
  probes[1].point.is_return = true;
  return probes;
}

ProbeHit Hit(const ProbeDef& p, uint64_t time_ns, uint64_t ip, core::store::ProbeArgs args) {
  ProbeHit h;
  h.time_ns = time_ns;
  h.pid = 4242;
  h.tid = 4243;
  h.cpu = 1;
  h.probe = &p;
  h.ip = core::RemoteAddr{ip};
  h.args = std::move(args);
  return h;
}

// Counts what a sink is given.
class CountingSink final : public HitSink {
 public:
  explicit CountingSink(absl::Status status = absl::OkStatus()) : status_(std::move(status)) {}
  void OnStart() override { ++starts; }
  bool Add(const ProbeHit& /*hit*/) override {
    ++hits;
    return true;
  }
  void Flush() override { ++flushes; }
  absl::Status status() const override { return status_; }
  void OnNote(const ProbeNote& note) override { notes.push_back(note.kind); }

  int starts = 0;
  int hits = 0;
  int flushes = 0;
  std::vector<ProbeNote::Kind> notes;

 private:
  absl::Status status_;
};

TEST(HitTally, CountsHitsPerProbeAndTheValuesOfEachArgument) {
  const std::vector<ProbeDef> probes = TwoProbes();
  HitTally tally(probes, /*limit=*/0);
  EXPECT_EQ(tally.hits(1), 0u);
  EXPECT_TRUE(tally.args(1).empty());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(tally.Add(
        Hit(probes[0], 10 + i, 0x5189, {{"i", std::to_string(i % 2)}, {"r->len", "100"}})));
  }
  ASSERT_TRUE(tally.Add(Hit(probes[1], 20, 0x5189, {{"arg1", "103"}})));
  EXPECT_FALSE(tally.done());
  EXPECT_EQ(tally.taken(), 6u);
  EXPECT_EQ(tally.hits(1), 5u);
  EXPECT_EQ(tally.hits(2), 1u);
  EXPECT_EQ(tally.hits(3), 0u) << "an unknown probe has no hits";
  const std::vector<HitTally::ArgTally>& args = tally.args(1);
  ASSERT_EQ(args.size(), 2u);
  EXPECT_EQ(args[0].name, "i");
  EXPECT_EQ(args[0].values.at("0"), 3u);
  EXPECT_EQ(args[0].values.at("1"), 2u);
  EXPECT_EQ(args[1].name, "r->len");
  EXPECT_EQ(args[1].values.at("100"), 5u);
  // Most frequent first; ties in value order.
  const auto ranked = HitTally::Ranked(args[0]);
  ASSERT_EQ(ranked.size(), 2u);
  EXPECT_EQ(ranked[0], (std::pair<std::string, uint64_t>{"0", 3}));
  EXPECT_EQ(ranked[1], (std::pair<std::string, uint64_t>{"1", 2}));
  HitTally::ArgTally tie{"x", {{"b", 1}, {"a", 1}, {"c", 2}}, 0};
  const auto tied = HitTally::Ranked(tie);
  ASSERT_EQ(tied.size(), 3u);
  EXPECT_EQ(tied[0].first, "c");
  EXPECT_EQ(tied[1].first, "a");
  EXPECT_EQ(tied[2].first, "b");
}

TEST(HitTally, KeepsAtMostMaxValuesDistinctValuesAndCountsTheOthers) {
  const std::vector<ProbeDef> probes = TwoProbes();
  HitTally tally(probes, 0);
  const uint64_t n = HitTally::kMaxValues + 3;
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(tally.Add(Hit(probes[0], i, 0x5189, {{"i", std::to_string(i)}})));
  }
  ASSERT_EQ(tally.args(1).size(), 1u);
  EXPECT_EQ(tally.args(1)[0].values.size(), HitTally::kMaxValues);
  EXPECT_EQ(tally.args(1)[0].other, 3u);
  EXPECT_EQ(tally.hits(1), n);
}

TEST(HitTally, TheLimitTakesThatManyHitsAndNoMore) {
  const std::vector<ProbeDef> probes = TwoProbes();
  HitTally tally(probes, /*limit=*/3);
  EXPECT_TRUE(tally.Add(Hit(probes[0], 1, 0x5189, {})));
  EXPECT_TRUE(tally.Add(Hit(probes[1], 2, 0x5189, {})));
  EXPECT_FALSE(tally.done());
  EXPECT_TRUE(tally.Add(Hit(probes[0], 3, 0x5189, {})));
  EXPECT_TRUE(tally.done());
  EXPECT_FALSE(tally.Add(Hit(probes[0], 4, 0x5189, {})));
  EXPECT_EQ(tally.taken(), 3u);
  EXPECT_EQ(tally.hits(1), 2u);
  EXPECT_EQ(tally.hits(2), 1u);
}

TEST(HitFanout, AHitOverTheLimitReachesNoOtherSink) {
  const std::vector<ProbeDef> probes = TwoProbes();
  HitTally tally(probes, /*limit=*/2);
  CountingSink a;
  CountingSink b;
  HitFanout fan({&tally, &a, &b});
  fan.OnStart();
  EXPECT_EQ(a.starts, 1);
  EXPECT_EQ(b.starts, 1);
  EXPECT_TRUE(fan.Add(Hit(probes[0], 1, 0x5189, {})));
  EXPECT_FALSE(fan.done());
  EXPECT_TRUE(fan.Add(Hit(probes[0], 2, 0x5189, {})));
  EXPECT_TRUE(fan.done());
  EXPECT_FALSE(fan.Add(Hit(probes[0], 3, 0x5189, {})));
  EXPECT_EQ(a.hits, 2);
  EXPECT_EQ(b.hits, 2);
  fan.Flush();
  EXPECT_EQ(a.flushes, 1);
  EXPECT_EQ(b.flushes, 1);
  ProbeNote note;
  note.kind = ProbeNote::Kind::kReleased;
  fan.OnNote(note);
  EXPECT_EQ(a.notes, std::vector<ProbeNote::Kind>{ProbeNote::Kind::kReleased});
  EXPECT_EQ(b.notes, std::vector<ProbeNote::Kind>{ProbeNote::Kind::kReleased});
  EXPECT_TRUE(fan.status().ok());
}

TEST(HitFanout, StatusIsTheFirstFailingSinksInOrder) {
  CountingSink ok;
  CountingSink recorder(absl::DataLossError("recording failed: gone"));
  CountingSink printer(absl::UnavailableError("output closed"));
  HitFanout fan({&ok, &recorder, &printer});
  EXPECT_EQ(fan.status().message(), "recording failed: gone");
  HitFanout other({&ok, &printer, &recorder});
  EXPECT_EQ(other.status().message(), "output closed");
}

// A fresh directory, removed afterwards.
class TempDir : public ::kwatch::testing::ScratchDir {
 public:
  TempDir() : ScratchDir("kwatch_recorder") {}
};

TEST(HitRecorder, RecordsTheProbesEachSiteOnceAndEveryHit) {
  const std::vector<ProbeDef> probes = TwoProbes();
  TempDir dir;
  const std::string path = dir.File("run.kwdb");
  core::store::SessionRecord rec = core::store::SessionRecordForThisHost();
  rec.mode = "probe";
  rec.backend = "ptrace";
  absl::StatusOr<std::unique_ptr<core::store::TraceWriter>> writer =
      core::store::TraceWriter::Create(path, rec);
  ASSERT_TRUE(writer.ok()) << writer.status();
  constexpr uint64_t kBias = 0x555555554000;
  ASSERT_TRUE(AddProbes(**writer, probes, kBias).ok());

  HitRecorder recorder(**writer);
  const uint64_t ip = 0x1189 + kBias;
  std::vector<ProbeHit> hits = {Hit(probes[0], 100, ip, {{"i", "0"}, {"r->len", "100"}}),
                                Hit(probes[1], 200, ip, {{"arg1", "100"}}),
                                Hit(probes[0], 300, ip, {{"i", "1"}, {"r->len", "100"}})};
  for (const ProbeHit& h : hits) {
    EXPECT_TRUE(recorder.Add(h));
  }
  recorder.Flush();
  EXPECT_TRUE(recorder.status().ok()) << recorder.status();
  EXPECT_TRUE(recorder.error().ok());
  core::store::SessionEnd end;
  end.exit_reason = "target exited";
  ASSERT_TRUE((*writer)->Finish(end).ok());
  writer->reset();

  absl::StatusOr<std::unique_ptr<core::store::TraceReader>> reader =
      core::store::TraceReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::vector<core::store::ProbeRecord>& recorded = (*reader)->probes();
  ASSERT_EQ(recorded.size(), 2u);
  EXPECT_EQ(recorded[0].id, 1u);
  EXPECT_EQ(recorded[0].event, "tick");
  EXPECT_EQ(recorded[0].spec, "tick i r->len");
  EXPECT_EQ(recorded[0].address.value, ip);
  EXPECT_EQ(recorded[0].function, "tick");
  EXPECT_EQ(recorded[0].file, "/src/uprobe_loop.c");
  EXPECT_EQ(recorded[0].line, 17);
  EXPECT_FALSE(recorded[0].is_return);
  EXPECT_EQ(recorded[1].event, "tick__return");
  EXPECT_TRUE(recorded[1].is_return);
  // One site for the one address hit three times.
  ASSERT_EQ((*reader)->sites().size(), 1u);
  const core::store::SiteRecord& site = (*reader)->sites()[0];
  EXPECT_EQ(site.ip.value, ip);
  EXPECT_EQ(site.function, "tick");
  EXPECT_EQ(site.offset, 0u);
  EXPECT_EQ(site.file, "/src/uprobe_loop.c");
  EXPECT_EQ(site.line, 17);
  EXPECT_EQ(site.disassembly, "endbr64");
  std::vector<core::store::HitRecord> back;
  ASSERT_TRUE((*reader)
                  ->ForEachHit({},
                               [&back](const core::store::HitRecord& h) {
                                 back.push_back(h);
                                 return true;
                               })
                  .ok());
  ASSERT_EQ(back.size(), 3u);
  for (size_t i = 0; i < hits.size(); ++i) {
    core::store::HitRecord want;
    want.time_ns = hits[i].time_ns;
    want.pid = 4242;
    want.tid = 4243;
    want.cpu = 1;
    want.probe_id = hits[i].probe->id;
    want.ip = core::RemoteAddr{ip};
    want.is_return = hits[i].probe->point.is_return;
    want.args = hits[i].args;
    EXPECT_EQ(back[i], want) << i;
  }
}

TEST(HitRecorder, AFailureIsStickyAndBecomesTheStopReason) {
  const std::vector<ProbeDef> probes = TwoProbes();
  TempDir dir;
  const std::string path = dir.File("gone.kwdb");
  absl::StatusOr<std::unique_ptr<core::store::TraceWriter>> writer =
      core::store::TraceWriter::Create(path, core::store::SessionRecordForThisHost());
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(AddProbes(**writer, probes, 0).ok());
  HitRecorder recorder(**writer);
  EXPECT_TRUE(recorder.Add(Hit(probes[0], 1, 0x1189, {})));
  // The recording's file is removed: the next commit fails, and says the recording is lost.
  ASSERT_EQ(::unlink(path.c_str()), 0);
  recorder.Flush();
  ASSERT_FALSE(recorder.error().ok());
  const absl::Status s = recorder.status();
  EXPECT_EQ(s.code(), recorder.error().code());
  EXPECT_EQ(s.message(), "recording failed: " + std::string(recorder.error().message()));
  // Later hits are taken (the tally counts them) but not recorded; the error stays the first.
  const absl::Status first = recorder.error();
  EXPECT_TRUE(recorder.Add(Hit(probes[0], 2, 0x1189, {})));
  recorder.Flush();
  EXPECT_EQ(recorder.error(), first);
}

}  // namespace
}  // namespace kwatch::watch::probe
