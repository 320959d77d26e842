#pragma once

// One sink over several, so that a session's hits can be counted, recorded (-o) and printed at
// once: the session is given a HitFanout over the tally, the recorder and a printer.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "watch/probe/hit_sink.h"

namespace kwatch::watch::probe {

// Passes everything to its sinks, in their order. A hit goes to each sink in turn until one
// does not take it (the tally, first, at the hit limit): those after it do not see it either.
// done() when any sink is done; status() is the first sink's error in order (put the recorder
// before a printer: a failed recording is the stop reason rather than the closed output it may
// cause). The sinks are the caller's and outlive the fan-out. Not thread-safe.
class HitFanout final : public HitSink {
 public:
  explicit HitFanout(std::vector<HitSink*> sinks) : sinks_(std::move(sinks)) {}

  void OnStart() override;
  bool Add(const ProbeHit& hit) override;
  bool done() const override;
  std::string done_reason() const override;
  void Flush() override;
  absl::Status status() const override;
  void OnNote(const ProbeNote& note) override;

 private:
  std::vector<HitSink*> sinks_;
};

}  // namespace kwatch::watch::probe
