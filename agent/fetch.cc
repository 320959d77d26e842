// The fetch interpreter (agent/abi.h "Fetch programs"): one pass over a probe's KwFetchOps,
// writing KwArgHeader + bytes per argument straight into the ring's reserved space. Every
// read of the target's memory goes through the safe routines (safe.S); no libc call.

#include <linux/prctl.h>

#include <array>
#include <cstdint>

#include "agent/agent.h"
#include "agent/sys.h"

namespace kwatch::agent {

namespace {

constexpr uint16_t kStatusOk = 0;
constexpr uint16_t kStatusFault = 1;
constexpr uint16_t kStatusCut = 2;
constexpr uint16_t kStatusInvalid = 3;

constexpr uint16_t kRecordFaulted = 1;
constexpr uint16_t kRecordCut = 2;

constexpr uint64_t kPageSize = 4096;

inline uint32_t RoundUp8(uint32_t n) {
  return (n + 7U) & ~7U;
}

using Xmm = std::array<uint8_t, 16>;

// %xmm<i>'s 16 bytes as they are now (the jump path: nothing in the agent touches them).
void ReadLiveXmm(uint32_t i, Xmm& out) {
  switch (i) {
#define KW_XMM(n)                                                            \
  case n:                                                                    \
    asm volatile("movdqu %%xmm" #n ", (%0)" : : "r"(out.data()) : "memory"); \
    break;
    KW_XMM(0)
    KW_XMM(1)
    KW_XMM(2)
    KW_XMM(3)
    KW_XMM(4)
    KW_XMM(5)
    KW_XMM(6)
    KW_XMM(7)
    KW_XMM(8)
    KW_XMM(9)
    KW_XMM(10)
    KW_XMM(11)
    KW_XMM(12)
    KW_XMM(13)
    KW_XMM(14)
    KW_XMM(15)
#undef KW_XMM
    default:
      break;
  }
}

// The argument being written and the space left.
class Writer {
 public:
  Writer(uint8_t* out, uint32_t limit) : out_(out), limit_(limit & ~7U) {}

  bool Begin(uint16_t arg) {
    Close();
    if (used_ + sizeof(KwArgHeader) > limit_) {
      cut_ = true;
      return false;
    }
    header_ = reinterpret_cast<KwArgHeader*>(out_ + used_);
    header_->arg = arg;
    header_->status = kStatusOk;
    header_->len = 0;
    used_ += sizeof(KwArgHeader);
    return true;
  }
  bool Open() const { return header_ != nullptr; }
  uint8_t* Cursor() { return out_ + used_; }
  uint32_t Space() const { return limit_ - used_; }
  void Advance(uint32_t n) {
    used_ += n;
    header_->len += n;
  }
  void Status(uint16_t status) { header_->status = status; }
  void Cut() {
    header_->status = kStatusCut;
    cut_ = true;
  }
  bool IsCut() const { return cut_; }
  // Ends the argument: zero padding to 8 bytes.
  void Close() {
    if (header_ == nullptr) {
      return;
    }
    const uint32_t end = RoundUp8(used_);
    while (used_ < end) {
      out_[used_++] = 0;
    }
    header_ = nullptr;
  }
  uint32_t Used() const { return used_; }

 private:
  uint8_t* out_;
  uint32_t limit_;
  uint32_t used_ = 0;
  KwArgHeader* header_ = nullptr;
  bool cut_ = false;
};

// The calling thread's name (16 bytes, NUL-terminated): the one system call a fetch program
// makes, only for $comm (tests/agent/agent_test.cc allows it here and nowhere else).
__attribute__((noinline)) bool ThreadName(std::array<char, 16>& name) {
  return Sys(SYS_prctl, PR_GET_NAME, reinterpret_cast<long>(name.data())) == 0;
}

uint64_t RegValue(const KwRegs& regs, uint32_t index) {
  const auto* words = reinterpret_cast<const uint64_t*>(&regs);
  return words[index];
}

uint64_t ZeroExtend(uint64_t v, uint32_t bytes) {
  return bytes >= 8 ? v : v & ((uint64_t{1} << (bytes * 8)) - 1);
}

}  // namespace

AccStep StepAcc(const KwFetchOp& op, const KwRegs& regs, uint64_t& acc) {
  switch (op.op) {
    case kKwOpReg:
      if (op.a >= kKwRegCount || op.b == 0 || op.b > 8) {
        return AccStep::kInvalid;
      }
      acc = ZeroExtend(RegValue(regs, op.a), op.b);
      return AccStep::kDone;
    case kKwOpImm:
      acc = static_cast<uint64_t>(op.imm);
      return AccStep::kDone;
    case kKwOpAdd:
      acc += static_cast<uint64_t>(op.imm);
      return AccStep::kDone;
    case kKwOpDeref: {
      const uint32_t n = op.b == 0 ? 8 : op.b;
      if (n > 8) {
        return AccStep::kInvalid;
      }
      uint64_t v = 0;
      if (!(n == 8 ? SafeRead8(acc, &v) : SafeRead(acc, &v, n))) {
        return AccStep::kFault;
      }
      acc = v;  // little-endian: the n bytes, zero-extended
      return AccStep::kDone;
    }
    case kKwOpTls:
      acc = regs.fs_base;
      return AccStep::kDone;
    default:
      return AccStep::kNotAcc;
  }
}

uint32_t RunFetch(const Session& s, KwProbe& probe, const KwRegs& regs, const uint8_t* xmm,
                  uint8_t* out, uint32_t limit, uint16_t* flags) {
  const uint32_t first = probe.fetch_offset;
  const uint32_t count = probe.fetch_len;
  if (count == 0 || first > s.code_capacity || count > s.code_capacity - first) {
    return 0;
  }
  const KwFetchOp* ops = s.code + first;
  Writer w(out, limit);
  uint64_t acc = 0;
  bool skip = false;  // after a fault or an invalid op: until the next argument
  auto fail = [&](uint16_t status) {
    w.Status(status);
    skip = true;
    if (status == kStatusFault) {
      *flags |= kRecordFaulted;
      probe.faults.fetch_add(1, std::memory_order_relaxed);
    }
  };
  for (uint32_t i = 0; i < count && !w.IsCut(); ++i) {
    const KwFetchOp& op = ops[i];
    if (op.op == kKwOpEnd) {
      break;
    }
    if (op.op == kKwOpBeginArg) {
      if (!w.Begin(op.a)) {
        break;
      }
      skip = false;
      acc = 0;
      continue;
    }
    if (skip || !w.Open()) {
      continue;
    }
    switch (StepAcc(op, regs, acc)) {
      case AccStep::kDone:
        continue;
      case AccStep::kFault:
        fail(kStatusFault);
        continue;
      case AccStep::kInvalid:
        fail(kStatusInvalid);
        continue;
      case AccStep::kNotAcc:
        break;
    }
    switch (op.op) {
      case kKwOpComm: {
        // The name at the hit: the thread may be gone (and its /proc entry) by the drain.
        std::array<char, 16> name{};
        if (!ThreadName(name)) {
          fail(kStatusFault);
          break;
        }
        uint32_t n = 0;
        while (n < 15 && name[n] != 0) {
          ++n;
        }
        if (n > w.Space()) {
          w.Cut();
          break;
        }
        for (uint32_t k = 0; k < n; ++k) {
          w.Cursor()[k] = static_cast<uint8_t>(name[k]);
        }
        w.Advance(n);
        break;
      }
      case kKwOpRead: {
        uint32_t n = op.b;
        const bool cut = n > w.Space();
        if (cut) {
          n = w.Space();
        }
        if (!SafeRead(acc, w.Cursor(), n)) {
          fail(kStatusFault);
          break;
        }
        w.Advance(n);
        if (cut) {
          w.Cut();
        }
        break;
      }
      case kKwOpStack: {
        // A page at a time: the pages before the first unreadable one stay.
        uint32_t n = op.b;
        const bool cut = n > w.Space();
        if (cut) {
          n = w.Space();
        }
        uint64_t from = regs.rsp;
        bool faulted = false;
        while (n > 0) {
          const uint64_t to_page = kPageSize - (from & (kPageSize - 1));
          const uint32_t chunk = to_page < n ? static_cast<uint32_t>(to_page) : n;
          if (!SafeRead(from, w.Cursor(), chunk)) {
            faulted = true;
            break;
          }
          w.Advance(chunk);
          from += chunk;
          n -= chunk;
        }
        if (faulted) {
          fail(kStatusFault);
        } else if (cut) {
          w.Cut();
        }
        break;
      }
      case kKwOpReadStr: {
        const uint32_t room = op.b < w.Space() ? op.b : w.Space();
        const long n = PlausibleRange(acc, 1)
                           ? kw_safe_strcopy(w.Cursor(), reinterpret_cast<const void*>(acc), room)
                           : -1;
        if (n < 0) {
          w.Advance(static_cast<uint32_t>(~n));  // the bytes before the unreadable one stay
          fail(kStatusFault);
          break;
        }
        w.Advance(static_cast<uint32_t>(n));
        if (static_cast<uint32_t>(n) == room && room < op.b) {
          w.Cut();  // the record's space ended first
        } else if (static_cast<uint32_t>(n) == op.b) {
          w.Status(kStatusCut);  // no NUL within b bytes
        }
        break;
      }
      case kKwOpStoreAcc: {
        if (op.b == 0 || op.b > 8) {
          fail(kStatusInvalid);
          break;
        }
        if (op.b > w.Space()) {
          w.Cut();
          break;
        }
        uint8_t* c = w.Cursor();
        for (uint32_t k = 0; k < op.b; ++k) {
          c[k] = static_cast<uint8_t>(acc >> (8 * k));
        }
        w.Advance(op.b);
        break;
      }
      case kKwOpXmm: {
        if (op.a >= 16 || op.b == 0 || op.b > 16) {
          fail(kStatusInvalid);
          break;
        }
        if (op.b > w.Space()) {
          w.Cut();
          break;
        }
        Xmm v{};
        if (xmm != nullptr) {
          for (uint32_t k = 0; k < 16; ++k) {
            v[k] = xmm[op.a * 16 + k];
          }
        } else {
          ReadLiveXmm(op.a, v);
        }
        uint8_t* c = w.Cursor();
        for (uint32_t k = 0; k < op.b; ++k) {
          c[k] = v[k];
        }
        w.Advance(op.b);
        break;
      }
      case kKwOpRegsAll: {
        if (sizeof(KwRegs) > w.Space()) {
          w.Cut();
          break;
        }
        const auto* src = reinterpret_cast<const uint8_t*>(&regs);
        uint8_t* c = w.Cursor();
        for (uint32_t k = 0; k < sizeof(KwRegs); ++k) {
          c[k] = src[k];
        }
        w.Advance(sizeof(KwRegs));
        break;
      }
      default:
        fail(kStatusInvalid);
        break;
    }
  }
  w.Close();
  if (w.IsCut()) {
    *flags |= kRecordCut;
  }
  return w.Used();
}

}  // namespace kwatch::agent
