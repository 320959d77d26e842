#include "core/kernel/bpf_access_values.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/base/clock.h"
#include "core/base/syscall_status.h"
#include "core/kernel/bpf_insn.h"

namespace kwatch::core::kernel {
namespace {

constexpr uint32_t kRingBytes = 1U << 20;
constexpr uint64_t kMatchWindowNs = 2'000'000;
// Addresses below this are a process's (x86-64, 4- and 5-level paging).
constexpr uint64_t kKernelSpaceStart = 0xffff800000000000ULL;

// What the program writes per access: at fp-24, time, key, value.
struct WireRecord {
  uint64_t time_ns;
  uint64_t key;  // cpu << 32 | range << 1 | read failed
  uint64_t value;
};

std::array<bpf_insn, 27> Program(uint64_t addr, uint32_t len, uint32_t range, int ring_fd) {
  using namespace bpf;  // NOLINT(google-build-using-namespace): the instruction names
  const int32_t read_fn =
      addr >= kKernelSpaceStart ? BPF_FUNC_probe_read_kernel : BPF_FUNC_probe_read_user;
  return {
      Insn(kStoreDw, kR10, 0, -8, 0),   // value = 0
      Insn(kStoreDw, kR10, 0, -16, 0),  // key = 0
      Insn(kStoreDw, kR10, 0, -24, 0),  // time = 0
      Insn(kMovReg, kR1, kR10, 0, 0),
      Insn(kAddImm, kR1, 0, 0, -8),                           // r1 = &value
      Insn(kMovImm, kR2, 0, 0, static_cast<int32_t>(len)),    // r2 = len
      Insn(kLdImm64, kR3, 0, 0, static_cast<int32_t>(addr)),  // r3 = addr
      Insn(0, 0, 0, 0, static_cast<int32_t>(addr >> 32)),     //   (high half)
      Insn(kCall, 0, 0, 0, read_fn),                          // r0 = read
      Insn(kMovReg, kR7, kR0, 0, 0),                          // r7 = its result
      Insn(kCall, 0, 0, 0, BPF_FUNC_ktime_get_ns),            // CLOCK_MONOTONIC
      Insn(kStoreRegDw, kR10, kR0, -24, 0),                   // time
      Insn(kCall, 0, 0, 0, BPF_FUNC_get_smp_processor_id),    // r0 = cpu
      Insn(BPF_ALU64 | BPF_LSH | BPF_K, kR0, 0, 0, 32),       // r0 <<= 32
      Insn(BPF_ALU64 | BPF_OR | BPF_K, kR0, 0, 0, static_cast<int32_t>(range << 1)),
      Insn(BPF_JMP | BPF_JEQ | BPF_K, kR7, 0, 1, 0),       // read ok: skip
      Insn(BPF_ALU64 | BPF_OR | BPF_K, kR0, 0, 0, 1),      //   else flag it
      Insn(kStoreRegDw, kR10, kR0, -16, 0),                // key
      Insn(kLdImm64, kR1, BPF_PSEUDO_MAP_FD, 0, ring_fd),  // r1 = ring
      Insn(0, 0, 0, 0, 0),                                 //   (high half)
      Insn(kMovReg, kR2, kR10, 0, 0),
      Insn(kAddImm, kR2, 0, 0, -24),                 // r2 = &record
      Insn(kMovImm, kR3, 0, 0, sizeof(WireRecord)),  // r3 = 24
      Insn(kMovImm, kR4, 0, 0, 0),                   // r4 = flags
      Insn(kCall, 0, 0, 0, BPF_FUNC_ringbuf_output),
      Insn(kMovImm, kR0, 0, 0, 1),  // 1: the kernel writes the sample too
      Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
  };
}

std::string Advice(int err) {
  if (err == EPERM || err == EACCES) {
    return "a BPF program on a breakpoint needs root, or CAP_BPF with CAP_PERFMON";
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpfAccessValues>> BpfAccessValues::Open(
    std::span<const Range> ranges) {
  std::unique_ptr<BpfAccessValues> v(new BpfAccessValues());
  v->ring_map_ =
      UniqueFd(bpf_map_create(BPF_MAP_TYPE_RINGBUF, "kwatch_values", 0, 0, kRingBytes, nullptr));
  if (!v->ring_map_.valid()) {
    const int err = errno;
    return SyscallError(err, "bpf(BPF_MAP_CREATE, BPF_MAP_TYPE_RINGBUF)", Advice(err));
  }
  for (size_t r = 0; r < ranges.size(); ++r) {
    const std::array<bpf_insn, 27> insns =
        Program(ranges[r].addr, ranges[r].len, static_cast<uint32_t>(r), v->ring_map_.get());
    std::array<char, 4096> log{};
    LIBBPF_OPTS(bpf_prog_load_opts, opts, .log_level = 1, .log_size = log.size(),
                .log_buf = log.data());
    UniqueFd prog(bpf_prog_load(BPF_PROG_TYPE_PERF_EVENT, "kwatch_value", "GPL", insns.data(),
                                insns.size(), &opts));
    if (!prog.valid()) {
      const int err = errno;
      std::string why = Advice(err);
      if (log[0] != '\0') {
        absl::StrAppend(&why, why.empty() ? "" : "; ",
                        "verifier: ", absl::StripTrailingAsciiWhitespace(log.data()));
      }
      return SyscallError(err, "bpf(BPF_PROG_LOAD, BPF_PROG_TYPE_PERF_EVENT)", why);
    }
    v->progs_.push_back(std::move(prog));
  }
  v->ring_ = ring_buffer__new(v->ring_map_.get(), &BpfAccessValues::OnRecord, v.get(), nullptr);
  if (v->ring_ == nullptr) {
    const int err = errno;
    return SyscallError(err, "ring_buffer__new");
  }
  return v;
}

BpfAccessValues::~BpfAccessValues() {
  ring_buffer__free(ring_);
}

absl::Status BpfAccessValues::Attach(size_t r, int fd) {
  if (::ioctl(fd, PERF_EVENT_IOC_SET_BPF, progs_[r].get()) != 0) {
    const int err = errno;
    return SyscallError(err, "ioctl(PERF_EVENT_IOC_SET_BPF)", Advice(err));
  }
  attached_at_ns_ = MonotonicNs();
  return absl::OkStatus();
}

int BpfAccessValues::OnRecord(void* self, void* data, size_t size) {
  auto* v = static_cast<BpfAccessValues*>(self);
  if (size < sizeof(WireRecord)) {
    return 0;
  }
  WireRecord w{};
  std::memcpy(&w, data, sizeof(w));
  const Key key{.range = (w.key & 0xffffffffU) >> 1, .cpu = static_cast<uint32_t>(w.key >> 32)};
  const bool ok = (w.key & 1) == 0;
  if (!ok) {
    ++v->failed_reads_;
  }
  v->pending_[key].records.push_back(Record{.time_ns = w.time_ns, .value = w.value, .ok = ok});
  return 0;
}

void BpfAccessValues::Consume() {
  (void)ring_buffer__consume(ring_);
}

std::optional<uint64_t> BpfAccessValues::Take(size_t r, uint32_t cpu, uint64_t time_ns) {
  auto it = pending_.find(Key{.range = r, .cpu = cpu});
  if (it == pending_.end()) {
    return std::nullopt;
  }
  Pending& p = it->second;
  if (p.taken.has_value() && p.taken_for == time_ns) {
    return p.taken->ok ? std::optional<uint64_t>(p.taken->value) : std::nullopt;
  }
  // The record nearest the sample in time, within kMatchWindowNs: the kernel takes the
  // sample's time just before (Linux >= 6.10) or just after the program runs (more when the
  // host preempts a virtual CPU in between), and each sample's record is popped when it is
  // taken, so the next sample's nearest is its own. Records before it belonged to samples the
  // perf ring lost; a sample from before the program was attached has none.
  if (time_ns < attached_at_ns_) {
    return std::nullopt;
  }
  const auto distance = [time_ns](const Record& r) {
    return r.time_ns > time_ns ? r.time_ns - time_ns : time_ns - r.time_ns;
  };
  while (p.records.size() >= 2 && distance(p.records[1]) <= distance(p.records[0])) {
    p.records.pop_front();
  }
  std::optional<Record> match;
  if (!p.records.empty() && distance(p.records.front()) <= kMatchWindowNs) {
    match = p.records.front();
    p.records.pop_front();
  } else if (!p.records.empty() && p.records.front().time_ns < time_ns) {
    p.records.pop_front();  // too old for this sample and every later one
  }
  p.taken = match;
  p.taken_for = time_ns;
  if (!match.has_value() || !match->ok) {
    return std::nullopt;
  }
  return match->value;
}

}  // namespace kwatch::core::kernel
