// watch/probe_tally.h and ReportProfileOptions (watch/recording.h): what `kwatch report`
// computes from a recording before rendering it.
#include "watch/probe_tally.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_writer.h"
#include "watch/recording.h"

namespace kwatch::watch {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

constexpr uint64_t kStart = 5'000'000'000;
constexpr uint64_t kSecond = 1'000'000'000;

class ProbeTallyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ =
        (std::filesystem::temp_directory_path() / absl::StrCat("kwatch-tally-", getpid())).string();
  }
  void TearDown() override {
    std::filesystem::remove(path_);
    if (!aside_.empty()) {
      std::filesystem::remove(aside_);
    }
  }

  // A probe recording of 12 s: probe 0 "req" (arg len) hit 70 times by tid 11 and 12, probe 1
  // never; with `finish` false it is cut short.
  std::unique_ptr<core::store::TraceReader> Record(bool finish) {
    core::store::SessionRecord rec = core::store::SessionRecordForThisHost();
    rec.start_mono_ns = kStart;
    rec.mode = "probe";
    auto w = core::store::TraceWriter::Create(path_, rec);
    EXPECT_TRUE(w.ok()) << w.status();
    for (uint32_t id : {0U, 1U}) {
      core::store::ProbeRecord p;
      p.id = id;
      p.event = id == 0 ? "req" : "idle";
      EXPECT_TRUE((*w)->AddProbe(p).ok());
    }
    for (int i = 0; i < 70; ++i) {
      core::store::HitRecord h;
      h.time_ns = kStart + static_cast<uint64_t>(i) * kSecond / 10;  // 0.0 s .. 6.9 s
      h.tid = i % 7 == 0 ? 12 : 11;
      h.probe_id = 0;
      // 66 distinct values ("many" five times, then 5..69): 64 are kept, the last two apart.
      h.args = {{"len", i < 5 ? std::string("many") : absl::StrCat(i)}, {"flag", "1"}};
      EXPECT_TRUE((*w)->AppendHit(h).ok());
    }
    if (finish) {
      core::store::SessionEnd end;
      end.end_mono_ns = kStart + 12 * kSecond;
      EXPECT_TRUE((*w)->Finish(end).ok());
    } else {
      EXPECT_TRUE((*w)->Flush().ok());
    }
    // A second recording at path_ is written beside the first until it is finished.
    const std::string where = (*w)->path();
    if (where != path_) {
      aside_ = where;
    }
    w->reset();
    auto r = core::store::TraceReader::Open(where);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  std::string path_;
  std::string aside_;
};

TEST_F(ProbeTallyTest, HitsThreadsAndValues) {
  auto r = Record(true);
  ASSERT_NE(r, nullptr);
  auto t = TallyHits(*r, {});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 1U);  // probe 1 had no hit
  const ProbeTally& req = t->at(0);
  EXPECT_EQ(req.hits, 70U);
  EXPECT_THAT(req.threads, ElementsAre(Pair(11, 60), Pair(12, 10)));
  ASSERT_EQ(req.args.size(), 2U);
  EXPECT_EQ(req.args[0].first, "len");
  EXPECT_EQ(req.args[0].second.size(), ProbeTally::kMaxValues);
  EXPECT_EQ(req.args[0].second.at("many"), 5U);
  EXPECT_THAT(req.other_values, ElementsAre(2, 0));
  EXPECT_EQ(req.args[1].first, "flag");
  EXPECT_THAT(req.args[1].second, ElementsAre(Pair("1", 70)));
  // The most frequent first; equal counts in value order.
  EXPECT_THAT(TopValues(req.args[0].second, 3),
              ElementsAre(Pair("many", 5), Pair("10", 1), Pair("11", 1)));
  EXPECT_THAT(TopValues({{"x", 1}}, 3), ElementsAre(Pair("x", 1)));
}

TEST_F(ProbeTallyTest, ASliceOfTheRecording) {
  auto r = Record(true);
  ASSERT_NE(r, nullptr);
  // From 1 s to 2 s: hits 10..20; of tid 12: 14.
  auto t = TallyHits(*r, RecordingSlice{1.0, 2.0, std::nullopt});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->at(0).hits, 11U);
  auto tid = TallyHits(*r, RecordingSlice{1.0, 2.0, 12});
  ASSERT_TRUE(tid.ok()) << tid.status();
  EXPECT_EQ(tid->at(0).hits, 1U);
  EXPECT_THAT(tid->at(0).args[0].second, ElementsAre(Pair("14", 1)));
}

TEST_F(ProbeTallyTest, ReportColumns) {
  auto r = Record(true);
  ASSERT_NE(r, nullptr);
  // Automatic: the session's 12 s over about 120 columns.
  const profile::ProfileOptions automatic = ReportProfileOptions(*r, 0);
  EXPECT_EQ(automatic.bucket_ns, 0U);
  EXPECT_EQ(automatic.initial_bucket_ns, 100'000'000U);
  EXPECT_EQ(automatic.max_buckets, profile::ProfileOptions{}.max_buckets);
  // 50 ms columns: room for the whole session.
  const profile::ProfileOptions fixed = ReportProfileOptions(*r, 50);
  EXPECT_EQ(fixed.bucket_ns, 50'000'000U);
  EXPECT_EQ(fixed.max_buckets, 241U);
  EXPECT_EQ(ReportProfileOptions(*r, 0.001).max_buckets, 4096U);
  // Cut short: no length to go by.
  auto cut = Record(false);
  ASSERT_NE(cut, nullptr);
  EXPECT_EQ(ReportProfileOptions(*cut, 0).initial_bucket_ns,
            profile::ProfileOptions{}.initial_bucket_ns);
  EXPECT_EQ(ReportProfileOptions(*cut, 50).max_buckets, profile::ProfileOptions{}.max_buckets);
}

}  // namespace
}  // namespace kwatch::watch
