#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/base/unique_mmap.h"

namespace kwatch::watch {

// One PERF_RECORD_SAMPLE of a breakpoint event opened with
// sample_type = IP | TID | TIME | ADDR | CPU (in that kernel order).
struct PerfSample {
  uint64_t ip = 0;
  uint32_t pid = 0;
  uint32_t tid = 0;
  uint64_t time = 0;
  uint64_t addr = 0;
  uint32_t cpu = 0;
  // PERF_SAMPLE_REGS_USER, for a ring whose format samples them: the registers of the mask,
  // u64 each in ascending perf_regs bit order (LoadPerfUserRegs, watch/perf_util.h). Empty
  // when the ring samples none, the record is malformed, or the kernel had no user registers
  // for it (abi NONE). Points into the ring or a scratch copy: valid during the callback.
  std::span<const uint8_t> user_regs;
};

// Size in bytes of one such PERF_RECORD_SAMPLE, header included (8-byte aligned).
inline constexpr size_t kPerfSampleRecordSize = 48;

// What the samples of a ring carry after the fields above (perf_event_attr.sample_type).
struct PerfSampleFormat {
  bool callchain = false;  // PERF_SAMPLE_CALLCHAIN (skipped by Drain)
  uint64_t regs_user = 0;  // PERF_SAMPLE_REGS_USER with this sample_regs_user mask (0: none)
};

// Parses one PERF_RECORD_SAMPLE (header included, the whole record) of a ring of `format`;
// false for another record type or a record too short. sample.user_regs points into `record`.
bool ParseSample(std::span<const uint8_t> record, const PerfSampleFormat& format,
                 PerfSample& sample);

// Size in bytes of a sample record with user registers of `regs_mask` (abi word included) and
// no callchain: 48 + 8 + 8 per register.
size_t PerfSampleRecordSize(uint64_t regs_mask);

// The frames of a sample's callchain (PERF_SAMPLE_CALLCHAIN), innermost first, split by the
// context markers the kernel puts in the chain (PERF_CONTEXT_KERNEL, PERF_CONTEXT_USER).
struct PerfCallchain {
  std::vector<uint64_t> kernel;  // kernel text addresses
  std::vector<uint64_t> user;    // user addresses of the task, when it came from user space
};

// Parses a PERF_RECORD_SAMPLE (header included, as PerfRing::DrainRecords hands it over)
// of sample_type IP | TID | TIME | ADDR | CPU | CALLCHAIN into `sample` and `chain`. False
// for another record type, or a record too short for what it claims (chain left empty).
bool ParseCallchainSample(std::span<const uint8_t> record, PerfSample& sample,
                          PerfCallchain& chain);

// The mmap ring buffer of one perf event: a metadata page plus 2^n data pages. Owns the
// mapping. A ring may also own the rings of the same logical event on other CPUs (Join):
// Linux refuses to mmap an inherited per-task event (cpu -1), so an inherited watch with
// samples is one event per CPU, and its rings are drained as one. Single consumer; not
// thread-safe.
class PerfRing {
 public:
  // Maps the ring of `fd` with `data_pages` data pages (a power of two), whose samples have
  // `format`.
  static absl::StatusOr<PerfRing> Map(int fd, size_t data_pages, PerfSampleFormat format = {});

  // Over memory the caller owns (tests, benchmarks): `base` points at a metadata page
  // followed by `data_size` bytes of data (power of two). The caller keeps it alive.
  static PerfRing OverMemory(void* base, size_t page_size, size_t data_size,
                             PerfSampleFormat format = {});

  PerfRing(PerfRing&&) noexcept = default;
  PerfRing& operator=(PerfRing&&) noexcept = default;
  PerfRing(const PerfRing&) = delete;
  PerfRing& operator=(const PerfRing&) = delete;
  ~PerfRing() = default;

  // Consumes every complete record: calls `on_sample` for each sample, adds the count of
  // each PERF_RECORD_LOST to lost(), skips other records. Records that wrap around the end
  // of the buffer are reassembled. Publishes data_tail once at the end. Returns the number
  // of samples delivered. Joined rings are drained after this one, each in its own order
  // (samples are not merged by time across rings).
  size_t Drain(absl::FunctionRef<void(const PerfSample&)> on_sample);

  // Drain for this ring alone (not the joined ones), with each sample's position: the bytes
  // written to the ring before its record (data_head's count when it began).
  size_t DrainAt(absl::FunctionRef<void(const PerfSample&, uint64_t position)> on_sample);

  // Consumes every complete record of any type and layout: calls `on_record` with the whole
  // record, header included (records that wrap around the end of the buffer are reassembled
  // into a scratch copy valid during the call). PERF_RECORD_LOST counts are added to lost()
  // as well. Returns the number of records delivered. Joined rings are drained after this one.
  size_t DrainRecords(absl::FunctionRef<void(std::span<const uint8_t> record)> on_record);

  // Samples the kernel reported lost (PERF_RECORD_LOST) so far, joined rings included.
  uint64_t lost() const;

  // Bytes this ring consumed so far (its data_tail): every record that began below it was read.
  uint64_t Consumed() const;

  // Bytes waiting to be drained, joined rings included.
  size_t Pending() const;

  // Takes ownership of `other` (the ring of the same logical event on another CPU) so that
  // Drain, lost and Pending cover it too.
  void Join(PerfRing other);

 private:
  size_t DrainOne(absl::FunctionRef<void(const PerfSample&, uint64_t position)> on_sample);
  size_t PendingOne() const;
  size_t DrainRecordsOne(absl::FunctionRef<void(std::span<const uint8_t>)> on_record);

  PerfRing(core::UniqueMmap map, uint8_t* base, size_t page_size, size_t data_size,
           PerfSampleFormat format)
      : map_(std::move(map)),
        base_(base),
        page_size_(page_size),
        data_size_(data_size),
        format_(format) {}

  core::UniqueMmap map_;  // empty for OverMemory
  uint8_t* base_ = nullptr;
  size_t page_size_ = 0;
  size_t data_size_ = 0;
  PerfSampleFormat format_;
  uint64_t lost_ = 0;
  std::vector<uint8_t> wrap_scratch_;  // a record that wraps, reassembled
  std::vector<PerfRing> joined_;       // other CPUs of the same event; usually empty
};

}  // namespace kwatch::watch
