#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "watch/perf_ring.h"

namespace kwatch::watch::kernel {

// What one kernel site (trap IP) did to one watch: the per-site summary.
struct SiteStat {
  uint64_t events = 0;
  std::set<uint32_t> tids;
  std::set<uint32_t> cpus;
};

// The events of one watch by trap IP, and how many repeated the IP of the previous event of
// the same task on the same CPU (the signature of a rep string instruction trapping per
// iteration).
struct SiteTally {
  std::map<uint64_t, SiteStat> by_ip;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> last_ip;  // (cpu, tid) -> ip
  uint64_t repeated = 0;
  uint64_t first_repeated_ip = 0;

  void Add(const PerfSample& s);
};

// The sites of a tally, most events first (then by address).
std::vector<std::pair<uint64_t, const SiteStat*>> SitesByEvents(const SiteTally& t);

// One watched kernel object (kernel watches), or one watched range of a process's memory
// (--kernel-accesses), and what the session saw of it.
struct KernelWatch {
  std::string expr;     // as typed
  std::string display;  // "jiffies", "init_task.prio"
  uint64_t addr = 0;    // run-time address
  uint32_t len = 8;
  std::string type_name;  // "" when no source gives a type
  std::string source;     // where the symbol's address came from
  int64_t slide = 0;
  std::vector<int> cpus;  // kernel watches: the CPUs it holds registers on (in arming order)
  uint64_t events = 0;    // delivered
  SiteTally sites;        // the delivered events by kernel site
  // What the breakpoints of CPUs that went offline had counted before they were closed (the
  // kernel drops CPU-bound events when their CPU goes offline).
  uint64_t closed_count = 0;
};

// One delivered event: a breakpoint sample for watch `watch` (a register shared between
// watches of equal ranges gives each of them the sample).
struct KernelEvent {
  PerfSample s;
  size_t watch = 0;
  PerfCallchain chain;  // callchains requested (--stack)
  // The watch's value: read at the access itself (value_at_access, a BPF program on the
  // breakpoint), else at drain time, when kernel memory is read.
  std::optional<uint64_t> value;
  bool value_at_access = false;
};

// Something the session tells its user besides events.
struct KernelNote {
  enum class Kind : uint8_t {
    kValueUnreadable,  // `watch`'s value cannot be read (`why`); said once per watch
    kAccessValues,     // values are read at the access (`why` OK), or why not (`why`)
    kCpuOffline,       // `cpu` went offline: its breakpoints are closed
    kCpuArmed,         // `cpu` came online: `count` watches armed there
    kCpuRefused,       // `cpu` came online, but the watches could not be armed there (`why`)
    kCpuUnwatched,     // at the end: `cpu` came online during the session and was not watched
    kDetached,         // at the end: the target `pid` was let go and keeps running
  };
  Kind kind = Kind::kValueUnreadable;
  int cpu = -1;
  size_t watch = 0;
  size_t count = 0;
  pid_t pid = 0;
  absl::Status why;
};

// The end of a session, for its summary.
struct KernelSummary {
  uint64_t events = 0;  // delivered
  uint64_t lost = 0;    // lost by the rings, those of closed breakpoints included
  std::string stop_reason;
  std::vector<uint64_t> counted;  // per watch: what the kernel counted, closed breakpoints too
};

// Where a kernel watch session's events, notes and summary go (a text or JSON printer, a
// recorder in front of one). Called on the session's thread only, in this order: OnEvent and
// OnNote while it runs (OnDrained after each drain, OnStepEnd after each Step), OnSummary once
// from Finish, then the notes of the end.
class KernelEventSink {
 public:
  virtual ~KernelEventSink() = default;

  // One event, in time order within a drain; `w` already counts it. An error ends the session
  // with the error's message as its stop reason (the first one only; later events still come).
  virtual absl::Status OnEvent(const KernelEvent& ev, const KernelWatch& w) = 0;
  // Every ring was drained once.
  virtual void OnDrained() {}
  // One Step is done. An error ends the session as OnEvent's does.
  virtual absl::Status OnStepEnd() { return absl::OkStatus(); }
  virtual void OnNote(const KernelNote& note) = 0;
  virtual void OnSummary(const KernelSummary& summary, std::span<const KernelWatch> watches) = 0;

 protected:
  // Copied and moved only as part of an implementation (no slicing through the interface).
  KernelEventSink() = default;
  KernelEventSink(const KernelEventSink&) = default;
  KernelEventSink& operator=(const KernelEventSink&) = default;
  KernelEventSink(KernelEventSink&&) = default;
  KernelEventSink& operator=(KernelEventSink&&) = default;
};

}  // namespace kwatch::watch::kernel
