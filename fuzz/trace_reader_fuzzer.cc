// The recording reader (core/store/trace_reader.h): the input is written to a file and
// opened as a recording, then read the ways `kwatch report` and kwatch-gui read it (every
// event and hit, with and without filters, counts, site lookups). The reader treats the file
// as untrusted: any input must give a Status, never a crash or a sanitizer report.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/store/trace_reader.h"
#include "fuzz/fuzz_util.h"

namespace {

// Enough rows to reach every code path, few enough to keep an execution short.
constexpr int kMaxRows = 2000;

void ReadAll(const kwatch::core::store::TraceReader& r, const kwatch::core::store::EventFilter& ef,
             const kwatch::core::store::HitFilter& hf) {
  int n = 0;
  (void)r.ForEachEvent(ef, [&](const kwatch::core::AccessEvent& e) {
    (void)r.FindSite(e.ip);
    return ++n < kMaxRows;
  });
  n = 0;
  (void)r.ForEachHit(hf, [&](const kwatch::core::store::HitRecord& h) {
    (void)r.FindSite(h.ip);
    return ++n < kMaxRows;
  });
  (void)r.CountEvents(ef);
  (void)r.CountHits(hf);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kwatch::fuzz::TempFile file(data, size);
  auto reader = kwatch::core::store::TraceReader::Open(file.path());
  if (!reader.ok()) {
    return 0;
  }
  const kwatch::core::store::TraceReader& r = **reader;
  (void)r.session();
  (void)r.complete();
  (void)r.end();
  for (const kwatch::core::store::WatchRecord& w : r.watches()) {
    (void)w.fields.size();
  }
  ReadAll(r, {}, {});
  kwatch::core::store::EventFilter ef;
  ef.from_ns = 1000;
  ef.to_ns = UINT64_MAX - 1;
  ef.tid = 1;
  ef.watch_id = 1;
  kwatch::core::store::HitFilter hf;
  hf.from_ns = 1000;
  hf.to_ns = 1ULL << 62;
  hf.tid = 1;
  hf.probe_id = 1;
  ReadAll(r, ef, hf);
  return 0;
}
