#include "watch/uprobe_event.h"

#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "watch/perf_util.h"

namespace kwatch::watch {

namespace {

constexpr absl::string_view kPmuDir = "/sys/bus/event_source/devices/uprobe";

template <typename T>
T Load(const uint8_t* p) {
  T v{};
  std::memcpy(&v, p, sizeof(v));
  return v;
}

absl::StatusOr<uint32_t> ReadPmuNumber(const std::string& path, absl::string_view prefix) {
  const std::string text = ReadSmallFile(path.c_str());
  absl::string_view v = text;
  if (!prefix.empty() && !absl::ConsumePrefix(&v, prefix)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": unexpected contents '", text, "'"));
  }
  uint32_t n = 0;
  if (!absl::SimpleAtoi(v, &n)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": unexpected contents '", text, "'"));
  }
  return n;
}

}  // namespace

uint64_t UprobeSampleRegsMask() {
  return PerfUserRegsMaskAll();
}

absl::StatusOr<UprobePmu> FindUprobePmu() {
  const std::string type_path = absl::StrCat(kPmuDir, "/type");
  if (::access(type_path.c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "this kernel has no uprobe PMU (", kPmuDir,
        " is missing: needs CONFIG_UPROBE_EVENTS and Linux >= 4.17); use --backend=ptrace"));
  }
  UprobePmu pmu;
  KW_ASSIGN_OR_RETURN(pmu.type, ReadPmuNumber(type_path, ""));
  KW_ASSIGN_OR_RETURN(pmu.retprobe_bit,
                      ReadPmuNumber(absl::StrCat(kPmuDir, "/format/retprobe"), "config:"));
  return pmu;
}

bool ParseUprobeSample(std::span<const uint8_t> record, uint32_t stack_bytes, UprobeHit& hit) {
  const uint8_t* p = record.data();
  const uint8_t* const end = record.data() + record.size();
  auto need = [&](size_t n) { return static_cast<size_t>(end - p) >= n; };
  if (!need(sizeof(perf_event_header))) {
    return false;
  }
  p += sizeof(perf_event_header);
  if (!need(8 + 8 + 8 + 8 + 8)) {
    return false;
  }
  hit.ip = core::RemoteAddr{Load<uint64_t>(p)};
  hit.pid = static_cast<pid_t>(Load<uint32_t>(p + 8));
  hit.tid = static_cast<pid_t>(Load<uint32_t>(p + 12));
  hit.time_ns = Load<uint64_t>(p + 16);
  hit.cpu = Load<uint32_t>(p + 24);
  p += 32;
  const auto abi = Load<uint64_t>(p);
  p += 8;
  hit.regs = user_regs_struct{};
  if (abi != PERF_SAMPLE_REGS_ABI_NONE) {
    const uint64_t mask = UprobeSampleRegsMask();
    if (!LoadPerfUserRegs(std::span<const uint8_t>(p, static_cast<size_t>(end - p)), mask,
                          hit.regs)) {
      return false;
    }
    p += 8 * static_cast<size_t>(std::popcount(mask));
  }
  hit.stack = {};
  if (stack_bytes > 0) {
    if (!need(8)) {
      return false;
    }
    const auto size = Load<uint64_t>(p);
    p += 8;
    if (size > 0) {
      if (!need(size + 8)) {
        return false;
      }
      const auto dyn_size = Load<uint64_t>(p + size);
      hit.stack = std::span<const uint8_t>(p, dyn_size < size ? dyn_size : size);
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<UprobeEvent>> UprobeEvent::Open(const UprobeRequest& req) {
  KW_ASSIGN_OR_RETURN(const UprobePmu pmu, FindUprobePmu());
  if (::access(req.path.c_str(), R_OK) != 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("access(", req.path, ")"));
  }
  perf_event_attr attr{};
  attr.type = pmu.type;
  attr.size = sizeof(attr);
  attr.config = req.is_return ? (uint64_t{1} << pmu.retprobe_bit) : 0;
  attr.config1 = reinterpret_cast<uint64_t>(req.path.c_str());  // uprobe_path
  attr.config2 = req.file_offset;                               // probe_offset
  attr.sample_period = 1;
  attr.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU;
  if (req.ring_pages > 0) {
    attr.sample_type |= PERF_SAMPLE_REGS_USER;
    attr.sample_regs_user = UprobeSampleRegsMask();
    if (req.stack_bytes > 0) {
      attr.sample_type |= PERF_SAMPLE_STACK_USER;
      attr.sample_stack_user = (req.stack_bytes + 7) & ~7U;
    }
  }
  attr.inherit = (req.inherit && req.pid != -1) ? 1 : 0;
  attr.use_clockid = 1;
  attr.clockid = CLOCK_MONOTONIC;
  // Wake the reader when a quarter of a ring is full, not per hit: a wakeup per hit costs
  // the target a context switch to the reader (measured: +65% per hit). Readers poll with a
  // timeout so that a quiet probe is still drained promptly.
  attr.watermark = 1;
  attr.wakeup_watermark = static_cast<uint32_t>(req.ring_pages * 4096 / 4);
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;

  // Rings need one event per CPU (inherited per-task events cannot be mmapped; CPU-wide
  // events are per CPU anyway). A counting-only per-task event needs just one.
  std::vector<int> cpus;
  if (req.pid == -1 || req.ring_pages > 0) {
    cpus = OnlineCpus();
  } else {
    cpus.push_back(-1);
  }
  auto ev = std::unique_ptr<UprobeEvent>(new UprobeEvent(req));
  for (const int cpu : cpus) {
    perf_event_attr copy = attr;
    const int fd = static_cast<int>(
        ::syscall(SYS_perf_event_open, &copy, req.pid, cpu, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd < 0) {
      const int err = errno;
      const std::string call = absl::StrFormat(
          "perf_event_open(uprobe%s %s:0x%x, %s, cpu %d)", req.is_return ? " return" : "", req.path,
          req.file_offset,
          req.pid == -1 ? std::string("all processes") : absl::StrCat("pid ", req.pid), cpu);
      switch (err) {
        case EACCES:
        case EPERM:
          return core::SyscallError(err, call, PerfPermissionAdvice());
        case EINVAL:
          return core::SyscallError(
              err, call,
              "the offset must be the file offset of an instruction in an executable segment "
              "of the file");
        case ESRCH:
          return absl::NotFoundError(
              absl::StrCat(call, ": ", core::ErrnoText(err), "; process ", req.pid, " exited"));
        default:
          return core::SyscallError(err, call);
      }
    }
    ev->fds_.emplace_back(fd);
    if (req.ring_pages > 0) {
      KW_ASSIGN_OR_RETURN(PerfRing ring, PerfRing::Map(fd, req.ring_pages));
      if (ev->ring_.has_value()) {
        ev->ring_->Join(std::move(ring));
      } else {
        ev->ring_.emplace(std::move(ring));
      }
    }
  }
  return ev;
}

std::vector<int> UprobeEvent::fds() const {
  std::vector<int> out;
  out.reserve(fds_.size());
  for (const core::UniqueFd& fd : fds_) {
    out.push_back(fd.get());
  }
  return out;
}

size_t UprobeEvent::Drain(absl::FunctionRef<void(const UprobeHit&)> on_hit) {
  if (!ring_.has_value()) {
    return 0;
  }
  size_t hits = 0;
  UprobeHit hit;
  ring_->DrainRecords([&](std::span<const uint8_t> record) {
    if (record.size() < sizeof(perf_event_header) ||
        Load<perf_event_header>(record.data()).type != PERF_RECORD_SAMPLE) {
      return;
    }
    if (ParseUprobeSample(record, req_.stack_bytes, hit)) {
      on_hit(hit);
      ++hits;
    }
  });
  return hits;
}

absl::StatusOr<uint64_t> UprobeEvent::Count() const {
  uint64_t total = 0;
  for (const core::UniqueFd& fd : fds_) {
    uint64_t value = 0;
    const ssize_t n = ::read(fd.get(), &value, sizeof(value));
    if (n < 0) {
      const int err = errno;
      return core::SyscallError(err, "read(uprobe count)");
    }
    if (static_cast<size_t>(n) != sizeof(value)) {
      return absl::InternalError(absl::StrFormat("read(uprobe count): short read of %d", n));
    }
    total += value;
  }
  return total;
}

}  // namespace kwatch::watch
