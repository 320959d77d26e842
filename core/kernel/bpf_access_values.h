#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/unique_fd.h"

struct ring_buffer;  // libbpf

namespace kwatch::core::kernel {

// The watched bytes of hardware breakpoints read at the access itself: a BPF program
// (BPF_PROG_TYPE_PERF_EVENT, assembled here, loaded through libbpf) attached to each
// breakpoint's perf event (PERF_EVENT_IOC_SET_BPF) runs in the breakpoint's overflow handler,
// and copies the range's bytes (bpf_probe_read_kernel, or bpf_probe_read_user for a process's
// memory) with the CPU and CLOCK_MONOTONIC time into a BPF ring buffer. Take() pairs a sample
// with its record: on one CPU the program's records and the samples come in the same order,
// each within microseconds of the other (perf events opened with use_clockid
// CLOCK_MONOTONIC), so a sample's record is the one of its range and CPU nearest its time
// (within 2 ms), taken once. A record lost to a full buffer leaves its sample without a value,
// or, when the next access is closer than 2 ms, gives it that one's (the summary counts the
// ring's losses). Not thread-safe.
class BpfAccessValues {
 public:
  struct Range {
    uint64_t addr = 0;
    uint32_t len = 0;  // 1..8
  };

  // One program per range, one ring buffer for all. Errors name the call and what it needs
  // (CAP_BPF and CAP_PERFMON, a kernel with BPF ring buffers: Linux >= 5.8).
  static absl::StatusOr<std::unique_ptr<BpfAccessValues>> Open(std::span<const Range> ranges);
  ~BpfAccessValues();
  BpfAccessValues(const BpfAccessValues&) = delete;
  BpfAccessValues& operator=(const BpfAccessValues&) = delete;

  // Runs range `r`'s program on each overflow of perf event `fd`. Samples taken before the
  // last Attach get no value (their accesses ran no program).
  absl::Status Attach(size_t r, int fd);

  // Reads every record written so far. Call after draining the samples they belong to.
  void Consume();

  // The value of range `r` at the access of the sample taken at `time_ns` on `cpu`; nullopt
  // when its record was lost or the program could not read the bytes. Call in time order per
  // range and CPU: records of that range and CPU before it are forgotten. Several calls for the
  // same sample (watches sharing a breakpoint) get the same value.
  std::optional<uint64_t> Take(size_t r, uint32_t cpu, uint64_t time_ns);

  // Records whose read failed (an unmapped address, user memory paged out).
  uint64_t failed_reads() const { return failed_reads_; }

 private:
  struct Record {
    uint64_t time_ns = 0;
    uint64_t value = 0;
    bool ok = false;
  };
  struct Key {
    uint64_t range = 0;
    uint32_t cpu = 0;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.range, k.cpu);
    }
  };
  struct Pending {
    std::deque<Record> records;
    std::optional<Record> taken;  // the record the last sample got
    uint64_t taken_for = 0;       // that sample's time
  };

  BpfAccessValues() = default;
  static int OnRecord(void* self, void* data, size_t size);

  UniqueFd ring_map_;
  std::vector<UniqueFd> progs_;  // per range
  ring_buffer* ring_ = nullptr;
  absl::flat_hash_map<Key, Pending> pending_;
  uint64_t failed_reads_ = 0;
  uint64_t attached_at_ns_ = 0;  // CLOCK_MONOTONIC of the last Attach
};

}  // namespace kwatch::core::kernel
