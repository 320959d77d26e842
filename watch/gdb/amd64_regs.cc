#include "watch/gdb/amd64_regs.h"

#include <sys/ptrace.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/thread_regs.h"

namespace kwatch::watch::gdb {

namespace {

// FXSAVE layout (user_fpregs_struct): offsets of what gdb's x87 control registers read.
constexpr size_t kFcw = 0;
constexpr size_t kFsw = 2;
constexpr size_t kFtw = 4;
constexpr size_t kFop = 6;
constexpr size_t kFip = 8;
constexpr size_t kFdp = 16;
constexpr size_t kMxcsr = 24;
constexpr size_t kSt = 32;        // 8 registers, 16 bytes apart, 10 used
constexpr size_t kXmm = 160;      // 16 registers, 16 bytes each
constexpr size_t kRegBytes = 16;  // per x87 and SSE register in FXSAVE

constexpr int kFirstSt = 24;
constexpr int kFirstFpCtl = 32;
constexpr int kFirstXmm = 40;
constexpr int kMxcsrReg = 56;
constexpr int kOrigRax = 57;
constexpr int kFsBase = 58;
constexpr int kGsBase = 59;

// The 64-bit general registers 0-16 (rip included), in gdb's order.
unsigned long long* GpField(user_regs_struct& r, int regno) {  // NOLINT(google-runtime-int)
  switch (regno) {
    case 0:
      return &r.rax;
    case 1:
      return &r.rbx;
    case 2:
      return &r.rcx;
    case 3:
      return &r.rdx;
    case 4:
      return &r.rsi;
    case 5:
      return &r.rdi;
    case 6:
      return &r.rbp;
    case 7:
      return &r.rsp;
    case 8:
      return &r.r8;
    case 9:
      return &r.r9;
    case 10:
      return &r.r10;
    case 11:
      return &r.r11;
    case 12:
      return &r.r12;
    case 13:
      return &r.r13;
    case 14:
      return &r.r14;
    case 15:
      return &r.r15;
    case 16:
      return &r.rip;
    case 17:
      return &r.eflags;
    case 18:
      return &r.cs;
    case 19:
      return &r.ss;
    case 20:
      return &r.ds;
    case 21:
      return &r.es;
    case 22:
      return &r.fs;
    case 23:
      return &r.gs;
    case kOrigRax:
      return &r.orig_rax;
    case kFsBase:
      return &r.fs_base;
    case kGsBase:
      return &r.gs_base;
    default:
      return nullptr;
  }
}

uint8_t* FpBytes(user_fpregs_struct& fp) {
  return reinterpret_cast<uint8_t*>(&fp);
}
const uint8_t* FpBytes(const user_fpregs_struct& fp) {
  return reinterpret_cast<const uint8_t*>(&fp);
}

uint32_t Load32(const uint8_t* p, size_t n) {
  uint32_t v = 0;
  std::memcpy(&v, p, n);
  return v;
}

// The full x87 tag word gdb shows, from FXSAVE's abridged one (a bit per register: empty or
// not) and the registers' contents, as the FSAVE format would hold it.
uint32_t FullTag(const user_fpregs_struct& fp) {
  const uint8_t* b = FpBytes(fp);
  const uint32_t abridged = b[kFtw];
  const uint32_t top = (Load32(b + kFsw, 2) >> 11) & 7;
  uint32_t tag = 0;
  for (uint32_t phys = 0; phys < 8; ++phys) {
    uint32_t t = 3;  // empty
    if ((abridged & (1U << phys)) != 0) {
      const uint8_t* st = b + kSt + size_t{16} * ((phys - top) & 7);
      uint64_t mantissa = 0;
      std::memcpy(&mantissa, st, 8);
      const uint32_t exponent = Load32(st + 8, 2) & 0x7fff;
      if (exponent == 0x7fff) {
        t = 2;
      } else if (exponent == 0) {
        t = mantissa == 0 ? 1 : 2;
      } else {
        t = (mantissa >> 63) != 0 ? 0 : 2;
      }
    }
    tag |= t << (2 * phys);
  }
  return tag;
}

void SetFullTag(user_fpregs_struct& fp, uint32_t tag) {
  uint8_t abridged = 0;
  for (uint32_t phys = 0; phys < 8; ++phys) {
    if (((tag >> (2 * phys)) & 3) != 3) {
      abridged = static_cast<uint8_t>(abridged | (1U << phys));
    }
  }
  FpBytes(fp)[kFtw] = abridged;
  FpBytes(fp)[kFtw + 1] = 0;
}

// Where x87 control register `i` (0-7: fctrl ... fop) lives in FXSAVE, and how many bytes;
// ftag (2) is computed.
struct FpCtl {
  size_t offset;
  size_t size;
};
constexpr std::array<FpCtl, 8> kFpCtl = {{
    {kFcw, 2},      // fctrl
    {kFsw, 2},      // fstat
    {kFtw, 2},      // ftag (computed)
    {kFip + 4, 4},  // fiseg: the instruction pointer's upper half in the 64-bit format
    {kFip, 4},      // fioff
    {kFdp + 4, 4},  // foseg
    {kFdp, 4},      // fooff
    {kFop, 2},      // fop
}};

}  // namespace

const std::string& Amd64TargetXml() {
  static const std::string* const kXml = [] {
    auto reg = [](absl::string_view name, int bits, absl::string_view type,
                  absl::string_view group = "") {
      return absl::StrFormat(R"(<reg name="%s" bitsize="%d" type="%s"%s/>)"
                             "\n",
                             name, bits, type,
                             group.empty() ? "" : absl::StrCat(R"( group=")", group, R"(")"));
    };
    std::string x = R"(<?xml version="1.0"?>
<!DOCTYPE target SYSTEM "gdb-target.dtd">
<target version="1.0">
<architecture>i386:x86-64</architecture>
<osabi>GNU/Linux</osabi>
<feature name="org.gnu.gdb.i386.core">
<flags id="i386_eflags" size="4">)";
    static constexpr std::array<std::pair<const char*, int>, 17> kFlags = {{
        {"CF", 0},
        {"", 1},
        {"PF", 2},
        {"AF", 4},
        {"ZF", 6},
        {"SF", 7},
        {"TF", 8},
        {"IF", 9},
        {"DF", 10},
        {"OF", 11},
        {"NT", 14},
        {"RF", 16},
        {"VM", 17},
        {"AC", 18},
        {"VIF", 19},
        {"VIP", 20},
        {"ID", 21},
    }};
    for (const auto& [name, bit] : kFlags) {
      absl::StrAppendFormat(&x, R"(<field name="%s" start="%d" end="%d"/>)", name, bit, bit);
    }
    x += "</flags>\n";
    static constexpr std::array<const char*, 16> kGp = {"rax", "rbx", "rcx", "rdx", "rsi", "rdi",
                                                        "rbp", "rsp", "r8",  "r9",  "r10", "r11",
                                                        "r12", "r13", "r14", "r15"};
    for (const char* name : kGp) {
      const absl::string_view n = name;
      x += reg(name, 64, n == "rbp" || n == "rsp" ? "data_ptr" : "int64");
    }
    x += reg("rip", 64, "code_ptr");
    x += reg("eflags", 32, "i386_eflags");
    for (const char* seg : {"cs", "ss", "ds", "es", "fs", "gs"}) {
      x += reg(seg, 32, "int32");
    }
    for (int i = 0; i < 8; ++i) {
      x += reg(absl::StrCat("st", i), 80, "i387_ext");
    }
    for (const char* ctl : {"fctrl", "fstat", "ftag", "fiseg", "fioff", "foseg", "fooff", "fop"}) {
      x += reg(ctl, 32, "int", "float");
    }
    x += R"(</feature>
<feature name="org.gnu.gdb.i386.sse">
<vector id="v8bf16" type="bfloat16" count="8"/>
<vector id="v4f" type="ieee_single" count="4"/>
<vector id="v2d" type="ieee_double" count="2"/>
<vector id="v16i8" type="int8" count="16"/>
<vector id="v8i16" type="int16" count="8"/>
<vector id="v4i32" type="int32" count="4"/>
<vector id="v2i64" type="int64" count="2"/>
<union id="vec128"><field name="v8_bfloat16" type="v8bf16"/><field name="v4_float" type="v4f"/><field name="v2_double" type="v2d"/><field name="v16_int8" type="v16i8"/><field name="v8_int16" type="v8i16"/><field name="v4_int32" type="v4i32"/><field name="v2_int64" type="v2i64"/><field name="uint128" type="uint128"/></union>
)";
    for (int i = 0; i < 16; ++i) {
      x += reg(absl::StrCat("xmm", i), 128, "vec128");
    }
    x += reg("mxcsr", 32, "int", "vector");
    x += "</feature>\n<feature name=\"org.gnu.gdb.i386.linux\">\n";
    x += reg("orig_rax", 64, "int", "system");
    x += "</feature>\n<feature name=\"org.gnu.gdb.i386.segments\">\n";
    x += reg("fs_base", 64, "int");
    x += reg("gs_base", 64, "int");
    x += "</feature>\n</target>\n";
    return new std::string(std::move(x));
  }();
  return *kXml;
}

size_t RegisterSize(int regno) {
  if (regno < 0 || regno >= kNumRegisters) {
    return 0;
  }
  if (regno <= kRipRegister || regno >= kOrigRax) {
    return 8;
  }
  if (regno < kFirstSt) {
    return 4;  // eflags, segment selectors
  }
  if (regno < kFirstFpCtl) {
    return 10;
  }
  if (regno < kFirstXmm) {
    return 4;
  }
  if (regno < kMxcsrReg) {
    return 16;
  }
  return 4;  // mxcsr
}

absl::StatusOr<ThreadRegisters> ThreadRegisters::Read(pid_t tid) {
  ThreadRegisters r;
  KW_ASSIGN_OR_RETURN(r.gp, core::ptrace::ReadGeneralRegs(tid));
  if (::ptrace(PTRACE_GETFPREGS, tid, nullptr, &r.fp) != 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("ptrace(PTRACE_GETFPREGS, ", tid, ")"));
  }
  return r;
}

absl::Status ThreadRegisters::Write(pid_t tid) const {
  KW_RETURN_IF_ERROR(core::ptrace::WriteGeneralRegs(tid, gp));
  if (::ptrace(PTRACE_SETFPREGS, tid, nullptr, &fp) != 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("ptrace(PTRACE_SETFPREGS, ", tid, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> ThreadRegisters::Get(int regno) const {
  const size_t size = RegisterSize(regno);
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("no register ", regno));
  }
  std::vector<uint8_t> out(size);
  auto& self = const_cast<ThreadRegisters&>(*this);  // the accessors are shared with Set
  if (unsigned long long* f = GpField(self.gp, regno);
      f != nullptr) {  // NOLINT(google-runtime-int)
    std::memcpy(out.data(), f, size);
  } else if (regno < kFirstFpCtl) {
    std::memcpy(out.data(), FpBytes(fp) + kSt + kRegBytes * static_cast<size_t>(regno - kFirstSt),
                size);
  } else if (regno < kFirstXmm) {
    const FpCtl& c = kFpCtl[regno - kFirstFpCtl];
    uint32_t v = regno == kFirstFpCtl + 2 ? FullTag(fp) : Load32(FpBytes(fp) + c.offset, c.size);
    if (regno == kFirstFpCtl + 7) {
      v &= 0x7ff;  // fop: 11 bits
    }
    std::memcpy(out.data(), &v, 4);
  } else if (regno < kMxcsrReg) {
    std::memcpy(out.data(), FpBytes(fp) + kXmm + kRegBytes * static_cast<size_t>(regno - kFirstXmm),
                size);
  } else {
    std::memcpy(out.data(), FpBytes(fp) + kMxcsr, size);
  }
  return out;
}

absl::Status ThreadRegisters::Set(int regno, std::span<const uint8_t> bytes) {
  const size_t size = RegisterSize(regno);
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("no register ", regno));
  }
  if (bytes.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("register ", regno, " has ", size, " bytes, not ", bytes.size()));
  }
  if (unsigned long long* f = GpField(gp, regno); f != nullptr) {  // NOLINT(google-runtime-int)
    *f = 0;
    std::memcpy(f, bytes.data(), size);
  } else if (regno < kFirstFpCtl) {
    std::memcpy(FpBytes(fp) + kSt + kRegBytes * static_cast<size_t>(regno - kFirstSt), bytes.data(),
                size);
  } else if (regno < kFirstXmm) {
    const FpCtl& c = kFpCtl[regno - kFirstFpCtl];
    uint32_t v = 0;
    std::memcpy(&v, bytes.data(), 4);
    if (regno == kFirstFpCtl + 2) {
      SetFullTag(fp, v);
    } else {
      std::memcpy(FpBytes(fp) + c.offset, &v, c.size);
    }
  } else if (regno < kMxcsrReg) {
    std::memcpy(FpBytes(fp) + kXmm + kRegBytes * static_cast<size_t>(regno - kFirstXmm),
                bytes.data(), size);
  } else {
    std::memcpy(FpBytes(fp) + kMxcsr, bytes.data(), size);
  }
  return absl::OkStatus();
}

std::vector<uint8_t> ThreadRegisters::All() const {
  std::vector<uint8_t> out;
  for (int r = 0; r < kNumRegisters; ++r) {
    absl::StatusOr<std::vector<uint8_t>> b = Get(r);
    out.insert(out.end(), b->begin(), b->end());
  }
  return out;
}

absl::Status ThreadRegisters::SetAll(std::span<const uint8_t> bytes) {
  size_t total = 0;
  for (int r = 0; r < kNumRegisters; ++r) {
    total += RegisterSize(r);
  }
  if (bytes.size() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("G packet has ", bytes.size(), " bytes of registers, not ", total));
  }
  ThreadRegisters next = *this;
  size_t off = 0;
  for (int r = 0; r < kNumRegisters; ++r) {
    const size_t n = RegisterSize(r);
    KW_RETURN_IF_ERROR(next.Set(r, bytes.subspan(off, n)));
    off += n;
  }
  *this = next;
  return absl::OkStatus();
}

}  // namespace kwatch::watch::gdb
