#include "core/symbols/unwind.h"

#include <elfutils/libdwfl.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/symbols/process_elf.h"

namespace kwatch::core::symbols {
namespace {

absl::Status DwflError(absl::string_view call) {
  return absl::InternalError(absl::StrCat(call, ": ", dwfl_errmsg(-1)));
}

Unwinder* Self(void* dwfl_arg) {
  return static_cast<Unwinder*>(dwfl_arg);
}

pid_t NextThreadCb(Dwfl* /*dwfl*/, void* dwfl_arg, void** thread_argp) {
  return Self(dwfl_arg)->NextThread(thread_argp);
}

bool GetThreadCb(Dwfl* /*dwfl*/, pid_t tid, void* dwfl_arg, void** thread_argp) {
  *thread_argp = dwfl_arg;
  return Self(dwfl_arg)->GetThread(tid);
}

bool MemoryReadCb(Dwfl* /*dwfl*/, Dwarf_Addr addr, Dwarf_Word* result, void* dwfl_arg) {
  uint64_t word = 0;
  if (!Self(dwfl_arg)->ReadWord(addr, &word)) {
    return false;
  }
  *result = word;
  return true;
}

bool SetInitialRegistersCb(Dwfl_Thread* thread, void* thread_arg) {
  return Self(thread_arg)->SetInitialRegisters(thread);
}

constexpr Dwfl_Thread_Callbacks kThreadCallbacks = {
    .next_thread = NextThreadCb,
    .get_thread = GetThreadCb,
    .memory_read = MemoryReadCb,
    .set_initial_registers = SetInitialRegistersCb,
    .detach = nullptr,
    .thread_detach = nullptr,
};

struct FrameCollector {
  std::vector<RemoteAddr>* frames;
  size_t max_frames;
};

int CollectFrame(Dwfl_Frame* frame, void* arg) {
  auto* c = static_cast<FrameCollector*>(arg);
  Dwarf_Addr pc = 0;
  if (!dwfl_frame_pc(frame, &pc, nullptr)) {
    return -1;  // ends the walk; dwfl_errno says why
  }
  c->frames->push_back(RemoteAddr{pc});
  return c->frames->size() >= c->max_frames ? DWARF_CB_ABORT : DWARF_CB_OK;
}

}  // namespace

void Unwinder::DwflDeleter::operator()(Dwfl* dwfl) const {
  dwfl_end(dwfl);
}

Unwinder::Unwinder(pid_t pid, MemoryReader read) : pid_(pid), read_(std::move(read)) {}

Unwinder::~Unwinder() = default;

absl::StatusOr<std::unique_ptr<Unwinder>> Unwinder::ForProcess(pid_t pid, MemoryReader read) {
  std::unique_ptr<Unwinder> u(new Unwinder(pid, std::move(read)));
  u->finder_ = std::make_unique<ProcessElfFinder>(pid);
  KW_ASSIGN_OR_RETURN(u->dwfl_, u->Report(*u->finder_));
  return u;
}

absl::Status Unwinder::Refresh() {
  auto finder = std::make_unique<ProcessElfFinder>(pid_);
  KW_ASSIGN_OR_RETURN(DwflHandle fresh, Report(*finder));
  dwfl_.reset();  // before the finder it uses
  finder_ = std::move(finder);
  dwfl_ = std::move(fresh);
  return absl::OkStatus();
}

absl::StatusOr<Unwinder::DwflHandle> Unwinder::Report(ProcessElfFinder& finder) {
  DwflHandle dwfl(dwfl_begin(finder.callbacks()));
  if (dwfl == nullptr) {
    return DwflError("dwfl_begin");
  }
  dwfl_report_begin(dwfl.get());
  const int r = dwfl_linux_proc_report(dwfl.get(), pid_);
  if (r > 0) {
    return absl::ErrnoToStatus(
        r, absl::StrCat("dwfl_linux_proc_report(", pid_, "): reading /proc/", pid_, "/maps"));
  }
  if (r < 0) {
    return DwflError(absl::StrCat("dwfl_linux_proc_report(", pid_, ")"));
  }
  if (dwfl_report_end(dwfl.get(), nullptr, nullptr) != 0) {
    return DwflError("dwfl_report_end");
  }
  finder.Adopt(dwfl.get());
  // The architecture comes from the first module whose ELF opens (elf == nullptr).
  if (!dwfl_attach_state(dwfl.get(), nullptr, pid_, &kThreadCallbacks, this)) {
    return DwflError(absl::StrCat("dwfl_attach_state(", pid_, ")"));
  }
  return dwfl;
}

pid_t Unwinder::NextThread(void** thread_arg) {
  if (thread_listed_ || tid_ == 0) {
    return 0;
  }
  thread_listed_ = true;
  *thread_arg = this;
  return tid_;
}

bool Unwinder::GetThread(pid_t tid) const {
  return tid_ != 0 && tid == tid_;
}

bool Unwinder::ReadWord(uint64_t addr, uint64_t* out) {
  const uint64_t base = addr & ~(kPageSize - 1);
  const uint64_t off = addr - base;
  if (off + sizeof(uint64_t) <= kPageSize) {
    for (const Page& p : pages_) {
      if (p.valid && p.base == base) {
        std::memcpy(out, p.bytes.data() + off, sizeof(uint64_t));
        return true;
      }
    }
    Page& p = pages_[next_page_];
    next_page_ = (next_page_ + 1) % kCachedPages;
    ++memory_reads_;
    p.valid = read_(RemoteAddr{base}, std::span<uint8_t>(p.bytes)).ok();
    if (p.valid) {
      p.base = base;
      std::memcpy(out, p.bytes.data() + off, sizeof(uint64_t));
      return true;
    }
  }
  // A word across two pages, or a page that does not read whole: the 8 bytes alone.
  std::array<uint8_t, sizeof(uint64_t)> word{};
  ++memory_reads_;
  absl::Status s = read_(RemoteAddr{addr}, std::span<uint8_t>(word));
  if (!s.ok()) {
    read_error_ = std::move(s);
    return false;
  }
  std::memcpy(out, word.data(), sizeof(uint64_t));
  return true;
}

bool Unwinder::SetInitialRegisters(void* thread) {
  const user_regs_struct& r = *regs_;
  // DWARF register numbers of x86-64 (System V psABI, figure 3.36): 0-16.
  const std::array<Dwarf_Word, 17> dwarf_regs = {
      r.rax, r.rdx, r.rcx, r.rbx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8,
      r.r9,  r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rip,
  };
  return dwfl_thread_state_registers(static_cast<Dwfl_Thread*>(thread), 0, dwarf_regs.size(),
                                     dwarf_regs.data());
}

absl::StatusOr<std::vector<RemoteAddr>> Unwinder::Unwind(pid_t tid, const user_regs_struct& regs,
                                                         size_t max_frames) {
  std::vector<RemoteAddr> frames;
  if (max_frames == 0) {
    return frames;
  }
  frames.reserve(max_frames < 64 ? max_frames : 64);
  tid_ = tid;
  regs_ = &regs;
  thread_listed_ = false;
  for (Page& p : pages_) {
    p.valid = false;
  }
  read_error_ = absl::OkStatus();
  FrameCollector collector{&frames, max_frames};
  const int r = dwfl_getthread_frames(dwfl_.get(), tid, CollectFrame, &collector);
  const std::string why = r == -1 ? dwfl_errmsg(-1) : "";
  tid_ = 0;
  regs_ = nullptr;
  if (frames.empty()) {
    if (!read_error_.ok()) {
      return absl::Status(
          read_error_.code(),
          absl::StrCat("unwinding thread ", tid, ": reading its stack: ", read_error_.message()));
    }
    return absl::InternalError(
        absl::StrCat("dwfl_getthread_frames(", tid, "): ", why.empty() ? "no frame" : why));
  }
  return frames;
}

}  // namespace kwatch::core::symbols
