// `kwatch report` on a large recording: the time from opening a 10-million-event recording to
// the rendered text report (profile replayed from SQLite, then rendered), and the same for the
// JSON report.
//
// The recording is written once (outside the timing) into $KWATCH_BENCH_DIR (default /tmp):
// 8 threads, 256 code sites, one 64-byte struct of eight 8-byte fields watched read-write, and
// a second 4 KiB array of 512 fields, events 1 us apart (a 10 s session). Removed at exit.
//
// Counters: items_per_second = events replayed per second; events = events in the recording.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "core/event.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#include "watch/profile/report_render.h"
#include "watch/recording.h"

namespace kwatch {
namespace {

constexpr uint64_t kEvents = 10'000'000;
constexpr uint64_t kStart = 1'000'000'000'000ULL;

std::string BenchPath() {
  const char* dir = std::getenv("KWATCH_BENCH_DIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/kwatch_report_bench_", ::getpid(), ".kwdb");
}

core::store::WatchRecord StructWatch() {
  core::store::WatchRecord w;
  w.id = 0;
  w.expr = "g_stats";
  w.address = core::RemoteAddr{0x555555560040ULL};
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

core::store::WatchRecord ArrayWatch() {
  core::store::WatchRecord w;
  w.id = 1;
  w.expr = "g_table";
  w.address = core::RemoteAddr{0x555555561000ULL};
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
  e.time_ns = kStart + i * 1000;
  e.pid = 4242;
  e.tid = static_cast<pid_t>(4242 + (i & 7));
  e.cpu = static_cast<uint32_t>(i & 1);
  const bool table = i % 4 == 3;
  e.watch_id = table ? 1 : 0;
  e.ip = core::RemoteAddr{0x555555554000ULL + ((i * 7) & 255) * 0x11};
  e.addr = table ? core::RemoteAddr{0x555555561000ULL} : core::RemoteAddr{0x555555560040ULL};
  e.len = table ? 4096 : 64;
  e.access_addr = e.addr + (table ? ((i * 13) & 511) * 8 : (i & 7) * 8);
  e.access_size = 8;
  e.kind = (i & 3) == 0 ? core::AccessKind::kRead : core::AccessKind::kWrite;
  e.value = i;
  e.old_value = i - 1;
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
      std::fprintf(stderr, "report_bench: %s\n", std::string(w.status().message()).c_str());
      std::exit(1);
    }
    (void)(*w)->AddWatch(StructWatch());
    (void)(*w)->AddWatch(ArrayWatch());
    for (uint64_t ip = 0; ip < 256; ++ip) {
      core::store::SiteRecord site;
      site.ip = core::RemoteAddr{0x555555554000ULL + ip * 0x11};
      site.function = absl::StrCat("fn", ip / 16);
      site.offset = (ip % 16) * 0x11;
      site.file = "bench.c";
      site.line = static_cast<int>(100 + ip);
      (void)(*w)->AddSite(site);
    }
    for (uint64_t i = 0; i < kEvents; ++i) {
      if (absl::Status st = (*w)->Append(MakeEvent(i)); !st.ok()) {
        std::fprintf(stderr, "report_bench: %s\n", std::string(st.message()).c_str());
        std::exit(1);
      }
    }
    core::store::SessionEnd end;
    end.end_mono_ns = kStart + kEvents * 1000;
    end.exit_status = 0;
    end.exit_reason = "target exited";
    (void)(*w)->Finish(end);
  }
  ~Recording() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const Recording& TheRecording() {
  static const Recording* r = new Recording();
  return *r;
}

watch::profile::SiteNamer NamerFor(const core::store::TraceReader& r) {
  return [&r](core::RemoteAddr ip) {
    for (const core::store::SiteRecord& s : r.sites()) {
      if (s.ip == ip) {
        return watch::profile::SiteName{s.function, s.offset, s.file, s.line, s.inlined};
      }
    }
    return watch::profile::SiteName{};
  };
}

void Report(benchmark::State& state, bool json) {
  const std::string& path = TheRecording().path();
  size_t bytes = 0;
  for (auto _ : state) {
    auto reader = core::store::TraceReader::Open(path);
    if (!reader.ok()) {
      state.SkipWithError(std::string(reader.status().message()).c_str());
      return;
    }
    watch::profile::ProfileOptions opts;
    opts.bucket_ns = kEvents * 1000 / 120;
    auto profile = watch::ProfileFromRecording(**reader, {}, opts);
    if (!profile.ok()) {
      state.SkipWithError(std::string(profile.status().message()).c_str());
      return;
    }
    watch::profile::ReportRenderOptions ropts;
    if (json) {
      bytes = watch::profile::RenderJson(*profile, NamerFor(**reader), ropts).dump().size();
    } else {
      bytes = watch::profile::RenderText(*profile, NamerFor(**reader), ropts).size();
    }
    benchmark::DoNotOptimize(bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kEvents));
  state.counters["events"] = static_cast<double>(kEvents);
  state.counters["report_bytes"] = static_cast<double>(bytes);
}

void BM_ReportText10M(benchmark::State& state) {
  Report(state, false);
}
BENCHMARK(BM_ReportText10M)->Unit(benchmark::kMillisecond)->Iterations(2);

void BM_ReportJson10M(benchmark::State& state) {
  Report(state, true);
}
BENCHMARK(BM_ReportJson10M)->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace
}  // namespace kwatch

BENCHMARK_MAIN();
