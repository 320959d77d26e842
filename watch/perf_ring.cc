#include "watch/perf_ring.h"

#include <linux/perf_event.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"

namespace kwatch::watch {

namespace {

bool IsPowerOfTwo(size_t n) {
  return n != 0 && (n & (n - 1)) == 0;
}

perf_event_mmap_page* Meta(uint8_t* base) {
  return reinterpret_cast<perf_event_mmap_page*>(base);
}

template <typename T>
T Load(const uint8_t* p) {
  T v{};
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Layout of a PERF_RECORD_SAMPLE with sample_type = IP | TID | TIME | ADDR | CPU:
//   header; u64 ip; u32 pid, tid; u64 time; u64 addr; u32 cpu, res;
constexpr size_t kSampleIpOff = 8;
constexpr size_t kSamplePidOff = 16;
constexpr size_t kSampleTidOff = 20;
constexpr size_t kSampleTimeOff = 24;
constexpr size_t kSampleAddrOff = 32;
constexpr size_t kSampleCpuOff = 40;
static_assert(kSampleCpuOff + 8 == kPerfSampleRecordSize);

// The fixed fields of a sample record (header included) of that layout.
PerfSample LoadSample(const uint8_t* rec) {
  PerfSample s;
  s.ip = Load<uint64_t>(rec + kSampleIpOff);
  s.pid = Load<uint32_t>(rec + kSamplePidOff);
  s.tid = Load<uint32_t>(rec + kSampleTidOff);
  s.time = Load<uint64_t>(rec + kSampleTimeOff);
  s.addr = Load<uint64_t>(rec + kSampleAddrOff);
  s.cpu = Load<uint32_t>(rec + kSampleCpuOff);
  return s;
}

// PERF_RECORD_LOST: header; u64 id; u64 lost;
constexpr size_t kLostCountOff = 16;
constexpr size_t kLostRecordSize = 24;

// The parts of a sample after the fixed fields, as `format` says: { u64 nr; u64 ips[nr]; }
// for the callchain, then { u64 abi; u64 regs[weight(mask)]; } for the user registers. A
// malformed tail leaves the registers empty.
void LoadSampleTail(const uint8_t* rec, size_t size, const PerfSampleFormat& format,
                    PerfSample& s) {
  size_t off = kPerfSampleRecordSize;
  if (format.callchain) {
    if (size < off + 8) {
      return;
    }
    const auto nr = Load<uint64_t>(rec + off);
    if (nr > (size - off - 8) / 8) {
      return;
    }
    off += 8 + 8 * nr;
  }
  if (format.regs_user != 0) {
    if (size < off + 8) {
      return;
    }
    const auto abi = Load<uint64_t>(rec + off);
    off += 8;
    const size_t n = 8 * static_cast<size_t>(std::popcount(format.regs_user));
    if (abi != PERF_SAMPLE_REGS_ABI_NONE && size - off >= n) {
      s.user_regs = std::span<const uint8_t>(rec + off, n);
    }
  }
}

}  // namespace

size_t PerfSampleRecordSize(uint64_t regs_mask) {
  return kPerfSampleRecordSize + 8 + 8 * static_cast<size_t>(std::popcount(regs_mask));
}

bool ParseCallchainSample(std::span<const uint8_t> record, PerfSample& sample,
                          PerfCallchain& chain) {
  chain.kernel.clear();
  chain.user.clear();
  if (record.size() < kPerfSampleRecordSize + 8 ||
      Load<perf_event_header>(record.data()).type != PERF_RECORD_SAMPLE) {
    return false;
  }
  const uint8_t* p = record.data();
  sample = LoadSample(p);
  const auto nr = Load<uint64_t>(p + kPerfSampleRecordSize);
  const size_t room = (record.size() - kPerfSampleRecordSize - 8) / 8;
  if (nr > room) {
    return false;
  }
  std::vector<uint64_t>* into = &chain.kernel;
  for (uint64_t i = 0; i < nr; ++i) {
    const auto ip = Load<uint64_t>(p + kPerfSampleRecordSize + 8 + 8 * i);
    if (ip >= PERF_CONTEXT_MAX) {  // a context marker
      into = ip == PERF_CONTEXT_USER     ? &chain.user
             : ip == PERF_CONTEXT_KERNEL ? &chain.kernel
                                         : nullptr;
      continue;
    }
    if (into != nullptr) {
      into->push_back(ip);
    }
  }
  return true;
}

absl::StatusOr<PerfRing> PerfRing::Map(int fd, size_t data_pages, PerfSampleFormat format) {
  if (!IsPowerOfTwo(data_pages)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "perf ring: %d data pages is not a power of two (the kernel requires 2^n)", data_pages));
  }
  const long page = ::sysconf(_SC_PAGESIZE);
  const size_t page_size = page > 0 ? static_cast<size_t>(page) : 4096;
  const size_t size = (1 + data_pages) * page_size;
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    return core::SyscallError(err, "mmap(perf ring)");
  }
  return PerfRing(core::UniqueMmap(addr, size), static_cast<uint8_t*>(addr), page_size,
                  data_pages * page_size, format);
}

PerfRing PerfRing::OverMemory(void* base, size_t page_size, size_t data_size,
                              PerfSampleFormat format) {
  KW_CHECK(base != nullptr);
  KW_CHECK(page_size >= sizeof(perf_event_mmap_page));
  KW_CHECK(IsPowerOfTwo(data_size));
  return {core::UniqueMmap(), static_cast<uint8_t*>(base), page_size, data_size, format};
}

void PerfRing::Join(PerfRing other) {
  KW_CHECK(other.joined_.empty());
  joined_.push_back(std::move(other));
}

uint64_t PerfRing::lost() const {
  uint64_t total = lost_;
  for (const PerfRing& r : joined_) {
    total += r.lost_;
  }
  return total;
}

size_t PerfRing::Pending() const {
  size_t total = PendingOne();
  for (const PerfRing& r : joined_) {
    total += r.PendingOne();
  }
  return total;
}

size_t PerfRing::PendingOne() const {
  perf_event_mmap_page* meta = Meta(base_);
  const uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
  return static_cast<size_t>(head - meta->data_tail);
}

size_t PerfRing::Drain(absl::FunctionRef<void(const PerfSample&)> on_sample) {
  const auto each = [&on_sample](const PerfSample& s, uint64_t /*position*/) { on_sample(s); };
  size_t samples = DrainOne(each);
  for (PerfRing& r : joined_) {
    samples += r.DrainOne(each);
  }
  return samples;
}

bool ParseSample(std::span<const uint8_t> record, const PerfSampleFormat& format,
                 PerfSample& sample) {
  if (record.size() < kPerfSampleRecordSize) {
    return false;
  }
  const auto hdr = Load<perf_event_header>(record.data());
  if (hdr.type != PERF_RECORD_SAMPLE || hdr.size > record.size() ||
      hdr.size < kPerfSampleRecordSize) {
    return false;
  }
  sample = LoadSample(record.data());
  if (format.callchain || format.regs_user != 0) {
    LoadSampleTail(record.data(), hdr.size, format, sample);
  }
  return true;
}

uint64_t PerfRing::Consumed() const {
  return __atomic_load_n(&Meta(base_)->data_tail, __ATOMIC_ACQUIRE);
}

size_t PerfRing::DrainAt(absl::FunctionRef<void(const PerfSample&, uint64_t position)> on_sample) {
  return DrainOne(on_sample);
}

size_t PerfRing::DrainOne(absl::FunctionRef<void(const PerfSample&, uint64_t position)> on_sample) {
  perf_event_mmap_page* meta = Meta(base_);
  // Acquire pairs with the kernel's release of data_head: records below head are complete.
  const uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
  // Only this consumer writes data_tail, so a plain read is enough.
  const uint64_t start = meta->data_tail;
  uint64_t tail = start;
  const uint8_t* const data = base_ + page_size_;
  const uint64_t size = data_size_;
  const uint64_t mask = size - 1;
  size_t samples = 0;
  uint64_t lost = 0;
  // Bytes of a sample Drain parses: the fixed fields, or the whole record with a tail.
  const bool with_tail = format_.callchain || format_.regs_user != 0;

  while (head - tail >= sizeof(perf_event_header)) {
    const uint64_t off = tail & mask;
    // Records are 8-byte aligned and the buffer is a multiple of 8, so a header never wraps.
    const auto hdr = Load<perf_event_header>(data + off);
    if (hdr.size < sizeof(perf_event_header)) {
      // Corrupt: nothing after this can be trusted. Drop everything published so far.
      tail = head;
      break;
    }
    if (hdr.size > head - tail) {
      break;  // not completely published (the kernel never does this; synthetic rings may)
    }
    const uint8_t* rec = data + off;
    const bool parsed = hdr.type == PERF_RECORD_SAMPLE || hdr.type == PERF_RECORD_LOST;
    if (parsed && off + hdr.size > size) {
      // Wraps around the end: reassemble the part we parse.
      const size_t want = with_tail ? hdr.size : std::min<size_t>(hdr.size, kPerfSampleRecordSize);
      const auto first = static_cast<size_t>(size - off);
      wrap_scratch_.resize(std::max(wrap_scratch_.size(), want));
      if (first >= want) {
        std::memcpy(wrap_scratch_.data(), rec, want);
      } else {
        std::memcpy(wrap_scratch_.data(), rec, first);
        std::memcpy(wrap_scratch_.data() + first, data, want - first);
      }
      rec = wrap_scratch_.data();
    }
    if (hdr.type == PERF_RECORD_SAMPLE) {
      if (hdr.size >= kPerfSampleRecordSize) {
        PerfSample s = LoadSample(rec);
        if (with_tail) {
          LoadSampleTail(rec, hdr.size, format_, s);
        }
        on_sample(s, tail);
        ++samples;
      }
    } else if (hdr.type == PERF_RECORD_LOST) {
      if (hdr.size >= kLostRecordSize) {
        lost += Load<uint64_t>(rec + kLostCountOff);
      }
    }
    tail += hdr.size;
  }

  lost_ += lost;
  if (tail != start) {
    // Release: our reads of the records happen before the kernel may overwrite them.
    __atomic_store_n(&meta->data_tail, tail, __ATOMIC_RELEASE);
  }
  return samples;
}

size_t PerfRing::DrainRecords(absl::FunctionRef<void(std::span<const uint8_t>)> on_record) {
  size_t records = DrainRecordsOne(on_record);
  for (PerfRing& r : joined_) {
    records += r.DrainRecordsOne(on_record);
  }
  return records;
}

size_t PerfRing::DrainRecordsOne(absl::FunctionRef<void(std::span<const uint8_t>)> on_record) {
  perf_event_mmap_page* meta = Meta(base_);
  const uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
  const uint64_t start = meta->data_tail;
  uint64_t tail = start;
  const uint8_t* const data = base_ + page_size_;
  const uint64_t size = data_size_;
  const uint64_t mask = size - 1;
  size_t records = 0;
  while (head - tail >= sizeof(perf_event_header)) {
    const uint64_t off = tail & mask;
    const auto hdr = Load<perf_event_header>(data + off);
    if (hdr.size < sizeof(perf_event_header)) {
      tail = head;  // corrupt: nothing after this can be trusted
      break;
    }
    if (hdr.size > head - tail) {
      break;
    }
    const uint8_t* rec = data + off;
    if (off + hdr.size > size) {
      wrap_scratch_.resize(hdr.size);
      const auto first = static_cast<size_t>(size - off);
      std::memcpy(wrap_scratch_.data(), rec, first);
      std::memcpy(wrap_scratch_.data() + first, data, hdr.size - first);
      rec = wrap_scratch_.data();
    }
    if (hdr.type == PERF_RECORD_LOST && hdr.size >= kLostRecordSize) {
      lost_ += Load<uint64_t>(rec + kLostCountOff);
    }
    on_record(std::span<const uint8_t>(rec, hdr.size));
    ++records;
    tail += hdr.size;
  }
  if (tail != start) {
    __atomic_store_n(&meta->data_tail, tail, __ATOMIC_RELEASE);
  }
  return records;
}

}  // namespace kwatch::watch
