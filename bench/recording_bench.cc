// Recordings that scale (issue 27): what a recording costs on disk and how long `kwatch report`
// takes to its first screen as the recording grows.
//
// Each recording is written once (outside the timings, through the real TraceWriter, with the
// profile kept while recording as `kwatch -o` keeps it) into $KWATCH_BENCH_DIR (default /tmp):
// 8 threads, 256 code sites, a 64-byte struct of eight 8-byte fields watched read-write and a
// 4 KiB array of 512 fields, one event every 8.3 us (120,000 events/s: the rate of the 40-minute
// full-rate soak), exact values. Removed at exit. Sizes: 1M and 10M events; with
// KWATCH_BENCH_100M=1 also 100M (about 14 minutes on the project's VM for writing it).
// KWATCH_BENCH_KEEP=1 leaves the recordings in place.
//
//   BM_Write/N          writing the recording as fast as it goes: items_per_second,
//                       bytes_per_event (final file size / events), write_amplification
//                       (/proc/self/io write_bytes during the writing, WAL and checkpoints
//                       included, / final file size), syscall_write_amplification (wchar:
//                       the bytes handed to write(2) / final file size)
//   BM_WritePaced/N     the same, paced at the session's own rate (120,000 events/s in real
//                       time, a Flush every 50 ms): what a live session writes to disk, with
//                       the kernel's writeback and kwatch's durable points (every 30 s) in it.
//                       1M events take 8.3 s, 10M 83 s.
//   BM_ReportText/N     `kwatch report FILE` to its text: open, profile (ReportProfileOptions),
//                       render; what the user waits for
//   BM_DrillDown1s/N    `kwatch report FILE --from 2 --to 3`: a one-second window, replayed
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "core/event.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"
#include "watch/profile/report_render.h"
#include "watch/recording.h"
#if __has_include("watch/recording_summary.h")
#include "watch/recording_summary.h"
#define KWATCH_BENCH_SUMMARY 1
#endif

namespace kwatch {
namespace {

constexpr uint64_t kStart = 1'000'000'000'000ULL;
constexpr uint64_t kStepNs = 8333;  // 120,000 events/s

std::string BenchPath(uint64_t n) {
  const char* dir = std::getenv("KWATCH_BENCH_DIR");  // NOLINT(concurrency-mt-unsafe)
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/kwatch_recording_bench_", ::getpid(), "_", n,
                      ".kwdb");
}

core::store::WatchRecord StructWatch() {
  core::store::WatchRecord w;
  w.id = 0;
  w.expr = "g_stats";
  w.address = core::RemoteAddr{0x555555560040ULL};
  w.length = 64;
  w.kind = "rw";
  w.backend = "perf";
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
  e.time_ns = kStart + i * kStepNs;
  e.pid = 4242;
  e.tid = static_cast<pid_t>(4242 + (i & 7));
  e.cpu = static_cast<uint32_t>(i & 1);
  const bool table = i % 4 == 3;
  e.watch_id = table ? 1 : 0;
  e.ip = core::RemoteAddr{0x555555554000ULL + ((i * 7) & 255) * 0x11};
  e.trap_ip = e.ip + 3;
  e.addr = table ? core::RemoteAddr{0x555555561000ULL} : core::RemoteAddr{0x555555560040ULL};
  e.len = table ? 4096 : 64;
  e.access_addr = e.addr + (table ? ((i * 13) & 511) * 8 : (i & 7) * 8);
  e.access_size = 8;
  e.kind = (i & 3) == 0 ? core::AccessKind::kRead : core::AccessKind::kWrite;
  e.value = i / 8;
  e.old_value = i / 8 - 1;
  e.value_exact = true;
  return e;
}

// A field of /proc/self/io ("write_bytes:": pages this process dirtied, i.e. what goes to the
// disk; "wchar:": bytes passed to write(2) and pwrite(2)). Every thread counts (the checkpoint
// thread too).
uint64_t ProcIo(const std::string& field) {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (io >> key >> v) {
    if (key == field) {
      return v;
    }
  }
  return 0;
}

struct Written {
  std::string path;
  uint64_t events = 0;
  uint64_t file_bytes = 0;
  uint64_t disk_writes = 0;     // /proc/self/io write_bytes while writing
  uint64_t syscall_writes = 0;  // /proc/self/io wchar while writing
  uint64_t cancelled = 0;       // /proc/self/io cancelled_write_bytes while writing
  double seconds = 0;
};

Written WriteRecording(uint64_t n, bool paced) {
  Written out;
  out.path = absl::StrCat(BenchPath(n), paced ? ".paced" : "");
  out.events = n;
  core::store::SessionRecord s = core::store::SessionRecordForThisHost();
  s.command_line = "kwatch --rw g_stats g_table -o bench.kwdb -- ./bench";
  s.pid = 4242;
  s.kwatch_version = "bench";
  s.mode = "watch";
  s.backend = "perf";
  s.start_mono_ns = kStart;
  ::sync();
  const uint64_t io0 = ProcIo("write_bytes:");
  const uint64_t wchar0 = ProcIo("wchar:");
  const uint64_t cancel0 = ProcIo("cancelled_write_bytes:");
  const uint64_t t0 = core::store::MonotonicClockNs();
  auto w = core::store::TraceWriter::Create(out.path, s);
  if (!w.ok()) {
    std::fprintf(stderr, "recording_bench: %s\n", std::string(w.status().message()).c_str());
    std::exit(1);  // NOLINT(concurrency-mt-unsafe)
  }
#ifdef KWATCH_BENCH_SUMMARY
  (*w)->SetSummarySource(watch::MakeProfileSummarySource(kStart));
#endif
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
  for (uint64_t i = 0; i < n; ++i) {
    if (absl::Status st = (*w)->Append(MakeEvent(i)); !st.ok()) {
      std::fprintf(stderr, "recording_bench: %s\n", std::string(st.message()).c_str());
      std::exit(1);  // NOLINT(concurrency-mt-unsafe)
    }
    if (i % 6000 == 5999) {  // a drain every 50 ms of the session's time
      (void)(*w)->Flush();
      if (paced) {  // ... and in real time
        const uint64_t due = t0 + (i + 1) * kStepNs;
        if (const uint64_t now = core::store::MonotonicClockNs(); now < due) {
          ::usleep(static_cast<useconds_t>((due - now) / 1000));
        }
      }
    }
  }
  core::store::SessionEnd end;
  end.end_mono_ns = kStart + n * kStepNs;
  end.exit_status = 0;
  end.exit_reason = "target exited";
  if (absl::Status st = (*w)->Finish(end); !st.ok()) {
    std::fprintf(stderr, "recording_bench: %s\n", std::string(st.message()).c_str());
    std::exit(1);  // NOLINT(concurrency-mt-unsafe)
  }
  w->reset();
  ::sync();
  out.seconds = static_cast<double>(core::store::MonotonicClockNs() - t0) / 1e9;
  out.disk_writes = ProcIo("write_bytes:") - io0;
  out.syscall_writes = ProcIo("wchar:") - wchar0;
  out.cancelled = ProcIo("cancelled_write_bytes:") - cancel0;
  struct stat st {};
  ::stat(out.path.c_str(), &st);
  out.file_bytes = static_cast<uint64_t>(st.st_size);
  std::fprintf(stderr,
               "recording_bench: %llu events%s: %.1f s to write, %llu bytes (%.2f bytes/event), "
               "%llu bytes written to disk (%.2fx; %llu cancelled), %llu to write(2) (%.2fx)\n",
               static_cast<unsigned long long>(n), paced ? " paced" : "", out.seconds,
               static_cast<unsigned long long>(out.file_bytes),
               static_cast<double>(out.file_bytes) / static_cast<double>(n),
               static_cast<unsigned long long>(out.disk_writes),
               static_cast<double>(out.disk_writes) / static_cast<double>(out.file_bytes),
               static_cast<unsigned long long>(out.cancelled),
               static_cast<unsigned long long>(out.syscall_writes),
               static_cast<double>(out.syscall_writes) / static_cast<double>(out.file_bytes));
  return out;
}

const Written& Recording(uint64_t n, bool paced = false) {
  static auto* recordings = new std::map<std::pair<uint64_t, bool>, Written>();
  auto it = recordings->find({n, paced});
  if (it == recordings->end()) {
    it = recordings->emplace(std::make_pair(n, paced), WriteRecording(n, paced)).first;
  }
  return it->second;
}

void RemoveRecordings() {
  for (uint64_t n : {uint64_t{1'000'000}, uint64_t{10'000'000}, uint64_t{100'000'000}}) {
    std::remove(BenchPath(n).c_str());
    std::remove(absl::StrCat(BenchPath(n), ".paced").c_str());
  }
}

void WriteCounters(benchmark::State& state, bool paced) {
  const auto n = static_cast<uint64_t>(state.range(0));
  for (auto _ : state) {
    const Written& w = Recording(n, paced);
    state.SetIterationTime(w.seconds);
  }
  const Written& w = Recording(n, paced);
  state.SetItemsProcessed(static_cast<int64_t>(n));
  const auto file = static_cast<double>(w.file_bytes);
  state.counters["bytes_per_event"] = file / static_cast<double>(w.events);
  state.counters["write_amplification"] = static_cast<double>(w.disk_writes) / file;
  state.counters["syscall_write_amplification"] = static_cast<double>(w.syscall_writes) / file;
  state.counters["file_MB"] = file / 1e6;
}

void BM_Write(benchmark::State& state) {
  WriteCounters(state, false);
}

void BM_WritePaced(benchmark::State& state) {
  WriteCounters(state, true);
}

watch::profile::SiteNamer NamerFor(const core::store::TraceReader& r) {
  return [&r](core::RemoteAddr ip) {
    if (const core::store::SiteRecord* s = r.FindSite(ip); s != nullptr) {
      return watch::profile::SiteName{s->function, s->offset, s->file, s->line, s->inlined};
    }
    return watch::profile::SiteName{};
  };
}

void Report(benchmark::State& state, const watch::RecordingSlice& slice) {
  const auto n = static_cast<uint64_t>(state.range(0));
  const std::string& path = Recording(n).path;
  uint64_t events = 0;
  size_t bytes = 0;
  for (auto _ : state) {
    auto reader = core::store::TraceReader::Open(path);
    if (!reader.ok()) {
      state.SkipWithError(std::string(reader.status().message()).c_str());
      return;
    }
    auto profile =
        watch::ProfileFromRecording(**reader, slice, watch::ReportProfileOptions(**reader, 0));
    if (!profile.ok()) {
      state.SkipWithError(std::string(profile.status().message()).c_str());
      return;
    }
    watch::profile::ReportRenderOptions ropts;
    bytes = watch::profile::RenderText(*profile, NamerFor(**reader), ropts).size();
    events = profile->events();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["events"] = static_cast<double>(events);
  state.counters["report_bytes"] = static_cast<double>(bytes);
}

void BM_ReportText(benchmark::State& state) {
  Report(state, {});
}

void BM_DrillDown1s(benchmark::State& state) {
  Report(state, watch::RecordingSlice{2.0, 3.0, std::nullopt});
}

void Sizes(benchmark::internal::Benchmark* b) {
  b->Arg(1'000'000)->Arg(10'000'000);
  if (std::getenv("KWATCH_BENCH_100M") != nullptr) {  // NOLINT(concurrency-mt-unsafe)
    b->Arg(100'000'000);
  }
}

BENCHMARK(BM_Write)->Apply(Sizes)->UseManualTime()->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_WritePaced)
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->UseManualTime()
    ->Unit(benchmark::kSecond)
    ->Iterations(1);
BENCHMARK(BM_ReportText)->Apply(Sizes)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_DrillDown1s)
    ->Apply(Sizes)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5)
    ->UseRealTime();

}  // namespace
}  // namespace kwatch

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (std::getenv("KWATCH_BENCH_KEEP") == nullptr) {  // NOLINT(concurrency-mt-unsafe)
    kwatch::RemoveRecordings();
  }
  return 0;
}
