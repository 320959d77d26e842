// kwatch-gui on a 1-million-event recording: the time from "open this file" to every model
// filled (the target: under 2 s), and the time a time-range selection takes to narrow
// the sites, threads and cache lines (a slice loaded in the background).
//
// The recording is written once with TraceWriter (outside the timing) into $KWATCH_BENCH_DIR
// (default /tmp): 4 threads, 48 code sites, one 64-byte struct of eight 8-byte fields watched
// read-write and a 4 KiB array of 512 fields, events 5 us apart (a 5 s session). Removed at
// exit.
//
//   BM_LoadSnapshot1M    LoadSnapshot: open, replay into the profile, read sources (worker)
//   BM_LoadSlice1M       LoadSnapshot of a tenth of the run (the worker's part of a selection)
//   BM_FillModels1M      the GUI-thread part: every model reset from that snapshot
//   BM_OpenInSession1M   SessionModel::Open to Loaded + DetailLoaded (both, end to end)
//   BM_TimeSlice1M       SessionModel::SetTimeSelection (a tenth of the run) to DetailLoaded
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "core/event.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#if __has_include("watch/recording_summary.h")
#include "watch/recording_summary.h"
#define KWATCH_BENCH_SUMMARY 1
#endif
#include "gui/cache_line_model.h"
#include "gui/field_tree_model.h"
#include "gui/headless_app.h"
#include "gui/heatmap_model.h"
#include "gui/session_model.h"
#include "gui/site_table_model.h"
#include "gui/snapshot.h"
#include "gui/thread_model.h"
#include "gui/timeline_model.h"

namespace kwatch {
namespace {

// $KWATCH_BENCH_EVENTS events (default 1 million; the names say 1M whatever it is).
uint64_t EventCount() {
  const char* n = std::getenv("KWATCH_BENCH_EVENTS");  // NOLINT(concurrency-mt-unsafe)
  return n != nullptr ? std::strtoull(n, nullptr, 10) : 1'000'000;
}
const uint64_t kEvents = EventCount();
constexpr uint64_t kStepNs = 5000;
constexpr uint64_t kStart = 1'000'000'000'000ULL;
constexpr uint64_t kStruct = 0x555555560040ULL;
constexpr uint64_t kTable = 0x555555561000ULL;

std::string BenchPath() {
  const char* dir = std::getenv("KWATCH_BENCH_DIR");  // NOLINT(concurrency-mt-unsafe)
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/kwatch_gui_bench_", ::getpid(), ".kwdb");
}

core::store::WatchRecord StructWatch() {
  core::store::WatchRecord w;
  w.id = 0;
  w.expr = "g_stats";
  w.address = core::RemoteAddr{kStruct};
  w.length = 64;
  w.kind = "rw";
  w.backend = "page";
  w.type_name = "struct stats";
  for (int i = 0; i < 8; ++i) {
    w.fields.push_back(core::symbols::FieldLayout{.path = absl::StrCat(".f", i),
                                                  .type_name = "long",
                                                  .offset = static_cast<uint64_t>(8 * i),
                                                  .size = 8});
  }
  return w;
}

core::store::WatchRecord TableWatch() {
  core::store::WatchRecord w;
  w.id = 1;
  w.expr = "g_table";
  w.address = core::RemoteAddr{kTable};
  w.length = 4096;
  w.kind = "w";
  w.backend = "page";
  w.type_name = "long[512]";
  for (int i = 0; i < 512; ++i) {
    w.fields.push_back(core::symbols::FieldLayout{.path = absl::StrCat("[", i, "]"),
                                                  .type_name = "long",
                                                  .offset = static_cast<uint64_t>(8 * i),
                                                  .size = 8});
  }
  return w;
}

core::AccessEvent MakeEvent(uint64_t i) {
  core::AccessEvent e;
  e.time_ns = kStart + i * kStepNs;
  e.pid = 4242;
  e.tid = static_cast<pid_t>(4242 + (i & 3));
  e.cpu = static_cast<uint32_t>(i & 1);
  const bool table = i % 4 == 3;
  e.watch_id = table ? 1 : 0;
  e.ip = core::RemoteAddr{0x555555554000ULL + ((i * 7) % 48) * 0x11};
  e.addr = core::RemoteAddr{table ? kTable : kStruct};
  e.len = table ? 4096 : 64;
  // Threads mostly write their own fields of the struct (false sharing to find).
  e.access_addr = e.addr + (table ? ((i * 13) & 511) * 8 : ((i & 3) * 2 + ((i >> 5) & 1)) * 8);
  e.access_size = 8;
  e.kind = (i % 5) == 0 ? core::AccessKind::kRead : core::AccessKind::kWrite;
  e.value = i;
  e.value_exact = true;
  return e;
}

class Recording {
 public:
  Recording() : path_(BenchPath()) {
    core::store::SessionRecord s = core::store::SessionRecordForThisHost();
    s.command_line = "kwatch --rw g_stats g_table -o bench.kwdb -- ./bench";
    s.pid = 4242;
    s.kwatch_version = "bench";
    s.mode = "watch";
    s.backend = "page";
    s.start_mono_ns = kStart;
    auto w = core::store::TraceWriter::Create(path_, s);
    if (!w.ok()) {
      std::fprintf(stderr, "gui_bench: %s\n", std::string(w.status().message()).c_str());
      std::exit(1);  // NOLINT(concurrency-mt-unsafe)
    }
#ifdef KWATCH_BENCH_SUMMARY
    (*w)->SetSummarySource(watch::MakeProfileSummarySource(kStart));  // as kwatch -o keeps it
#endif
    (void)(*w)->AddWatch(StructWatch());
    (void)(*w)->AddWatch(TableWatch());
    for (uint64_t ip = 0; ip < 48; ++ip) {
      core::store::SiteRecord site;
      site.ip = core::RemoteAddr{0x555555554000ULL + ip * 0x11};
      site.function = absl::StrCat("worker", ip / 12);
      site.offset = (ip % 12) * 0x11;
      site.file = "/nonexistent/bench.c";  // unreadable: the loader must cope quickly
      site.line = static_cast<int>(100 + ip);
      (void)(*w)->AddSite(site);
    }
    for (uint64_t i = 0; i < kEvents; ++i) {
      if (absl::Status st = (*w)->Append(MakeEvent(i)); !st.ok()) {
        std::fprintf(stderr, "gui_bench: %s\n", std::string(st.message()).c_str());
        std::exit(1);  // NOLINT(concurrency-mt-unsafe)
      }
    }
    core::store::SessionEnd end;
    end.end_mono_ns = kStart + kEvents * kStepNs;
    end.exit_status = 0;
    end.exit_reason = "target exited";
    (void)(*w)->Finish(end);
  }
  ~Recording() {
    std::remove(path_.c_str());
  }
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  const std::string& path() const {
    return path_;
  }

 private:
  std::string path_;
};

Recording* g_recording = nullptr;

const std::string& Path() {
  if (g_recording == nullptr) {
    g_recording = new Recording();
  }
  return g_recording->path();
}

void BM_LoadSnapshot1M(benchmark::State& state) {
  gui::LoadRequest req;
  req.path = Path();
  uint64_t events = 0;
  for (auto _ : state) {
    auto snap = gui::LoadSnapshot(req);
    if (!snap.ok()) {
      state.SkipWithError(std::string(snap.status().message()).c_str());
      return;
    }
    events = (*snap)->profile->events();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * events));
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_LoadSnapshot1M)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

// The worker's part of a time selection: a tenth of the run, without sources.
void BM_LoadSlice1M(benchmark::State& state) {
  gui::LoadRequest req;
  req.path = Path();
  req.read_sources = false;
  const uint64_t span = kEvents * kStepNs;
  uint64_t k = 0;
  uint64_t events = 0;
  for (auto _ : state) {
    req.from_ns = (k++ % 9) * span / 10;
    req.to_ns = *req.from_ns + span / 10;
    auto snap = gui::LoadSnapshot(req);
    if (!snap.ok()) {
      state.SkipWithError(std::string(snap.status().message()).c_str());
      return;
    }
    events = (*snap)->profile->events();
  }
  state.counters["slice_events"] = static_cast<double>(events);
}
BENCHMARK(BM_LoadSlice1M)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();

void BM_FillModels1M(benchmark::State& state) {
  gui::LoadRequest req;
  req.path = Path();
  auto snap = gui::LoadSnapshot(req);
  if (!snap.ok()) {
    state.SkipWithError(std::string(snap.status().message()).c_str());
    return;
  }
  gui::FieldTreeModel tree;
  gui::HeatmapModel heat;
  gui::TimelineModel timeline;
  gui::SiteTableModel sites;
  gui::ThreadModel threads;
  gui::CacheLineModel lines;
  gui::Selection sel;
  for (auto _ : state) {
    tree.SetSnapshot(*snap);
    heat.SetSnapshot(*snap);
    timeline.SetData(*snap, sel);
    sites.SetData(*snap, *snap, sel);
    threads.SetData(*snap, sel);
    lines.SetData(*snap, *snap, sel);
    benchmark::DoNotOptimize(heat.total());
  }
  state.counters["cells"] = static_cast<double>(heat.rowCount()) * heat.columnCount();
}
BENCHMARK(BM_FillModels1M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_OpenInSession1M(benchmark::State& state) {
  const QString path = QString::fromStdString(Path());
  for (auto _ : state) {
    gui::SessionModel session;
    bool loaded = false;
    QObject::connect(&session, &gui::SessionModel::DetailLoaded, [&] { loaded = true; });
    QObject::connect(&session, &gui::SessionModel::LoadFailed, [&](const QString& m) {
      state.SkipWithError(m.toStdString().c_str());
      loaded = true;
    });
    session.Open(path);
    if (!session.WaitIdle(60'000) || !loaded) {
      state.SkipWithError("no result in 60 s");
      return;
    }
    benchmark::DoNotOptimize(session.heatmap()->total());
  }
  state.counters["events"] = static_cast<double>(kEvents);
}
BENCHMARK(BM_OpenInSession1M)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

void BM_TimeSlice1M(benchmark::State& state) {
  gui::SessionModel session;
  int details = 0;
  QObject::connect(&session, &gui::SessionModel::DetailLoaded, [&] { ++details; });
  session.Open(QString::fromStdString(Path()));
  if (!session.WaitIdle(60'000) || details != 1) {
    state.SkipWithError("no load in 60 s");
    return;
  }
  const uint64_t span = kEvents * kStepNs;
  uint64_t k = 0;
  for (auto _ : state) {
    // A tenth of the run, somewhere else each time.
    const uint64_t from = (k++ % 9) * span / 10;
    const int before = details;
    session.SetTimeSelection(from, from + span / 10);
    if (!session.WaitIdle(60'000) || details <= before) {
      state.SkipWithError("no slice in 60 s");
      return;
    }
  }
  state.counters["slice_events"] =
      static_cast<double>(session.detail_snapshot()->profile->events());
}
BENCHMARK(BM_TimeSlice1M)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();

}  // namespace
}  // namespace kwatch

int main(int argc, char** argv) {
  kwatch::gui::HeadlessApp app(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  delete kwatch::g_recording;  // removes the recording
  return 0;
}
