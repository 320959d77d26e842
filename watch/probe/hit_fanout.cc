#include "watch/probe/hit_fanout.h"

#include <algorithm>

namespace kwatch::watch::probe {

void HitFanout::OnStart() {
  for (HitSink* s : sinks_) {
    s->OnStart();
  }
}

bool HitFanout::Add(const ProbeHit& hit) {
  for (HitSink* s : sinks_) {
    if (!s->Add(hit)) {
      return false;
    }
  }
  return true;
}

bool HitFanout::done() const {
  return std::any_of(sinks_.begin(), sinks_.end(), [](const HitSink* s) { return s->done(); });
}

std::string HitFanout::done_reason() const {
  for (const HitSink* s : sinks_) {
    if (s->done()) {
      return s->done_reason();
    }
  }
  return "";
}

void HitFanout::Flush() {
  for (HitSink* s : sinks_) {
    s->Flush();
  }
}

absl::Status HitFanout::status() const {
  for (const HitSink* s : sinks_) {
    if (absl::Status st = s->status(); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

void HitFanout::OnNote(const ProbeNote& note) {
  for (HitSink* s : sinks_) {
    s->OnNote(note);
  }
}

}  // namespace kwatch::watch::probe
