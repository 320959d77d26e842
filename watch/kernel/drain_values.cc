#include "watch/kernel/drain_values.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"

namespace kwatch::watch::kernel {

void DrainValues::NewBatch() {
  std::fill(values_.begin(), values_.end(), std::nullopt);
}

DrainValues::Value DrainValues::Get(size_t i, const KernelWatch& w) {
  Value out;
  if (!Enabled()) {
    return out;
  }
  if (!values_[i].has_value()) {
    std::array<uint8_t, 8> buf{};
    const std::span<uint8_t> bytes = std::span<uint8_t>(buf).first(std::min<size_t>(w.len, 8));
    const absl::Status st =
        memory_ != nullptr ? memory_->Read(w.addr, bytes) : bpf_->Read(w.addr, bytes);
    if (st.ok()) {
      uint64_t v = 0;
      std::memcpy(&v, buf.data(), buf.size());  // x86-64: little-endian
      values_[i] = v;
    } else {
      values_[i] = std::optional<uint64_t>();
      if (!failed_[i]) {
        failed_[i] = true;
        out.first_failure = st;
      }
    }
  }
  out.value = *values_[i];
  return out;
}

absl::StatusOr<OpenedDrainValues> OpenDrainValues(const std::string& kcore, bool needed,
                                                  std::span<const KernelWatch> watches) {
  OpenedDrainValues out;
  if (!needed) {
    out.values = std::make_unique<DrainValues>(nullptr, watches.size());
    return out;
  }
  const std::string path = kcore.empty() ? std::string{kProcKcore} : kcore;
  absl::StatusOr<std::unique_ptr<core::kernel::KernelMemory>> memory =
      core::kernel::KernelMemory::Open(path);
  if (!memory.ok()) {
    if (!kcore.empty()) {
      return memory.status();
    }
    std::string why(memory.status().message());
    if (absl::IsNotFound(memory.status())) {
      why = "this kernel has no /proc/kcore (built without CONFIG_PROC_KCORE)";
    } else if (absl::IsPermissionDenied(memory.status())) {
      absl::StrAppend(&why,
                      ": reading kernel memory needs CAP_SYS_RAWIO (root), and a kernel in "
                      "lockdown mode (Secure Boot) refuses it to everyone");
    }
    // Without kcore: BPF.
    absl::StatusOr<std::unique_ptr<core::kernel::BpfKernelReader>> bpf =
        core::kernel::BpfKernelReader::Open();
    if (!bpf.ok()) {
      out.why_none = absl::Status(memory.status().code(),
                                  absl::StrCat(why, "; nor through BPF: ", bpf.status().message()));
      out.values = std::make_unique<DrainValues>(nullptr, watches.size());
      return out;
    }
    out.source = "kernel memory through BPF (bpf_probe_read_kernel; no /proc/kcore here)";
    out.values = std::make_unique<DrainValues>(*std::move(bpf), watches.size());
  } else {
    out.source = path;
    out.values = std::make_unique<DrainValues>(*std::move(memory), watches.size());
  }
  for (size_t i = 0; i < watches.size(); ++i) {
    if (absl::Status st = out.values->Get(i, watches[i]).first_failure; !st.ok()) {
      out.unreadable.emplace_back(i, std::move(st));
    }
  }
  out.values->NewBatch();
  return out;
}

}  // namespace kwatch::watch::kernel
