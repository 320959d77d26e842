#include "drmgr/debug_regs.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace kwatch::drmgr {

absl::string_view DrKindName(DrKind kind) {
  switch (kind) {
    case DrKind::kExec:
      return "execute";
    case DrKind::kWrite:
      return "write";
    case DrKind::kReadWrite:
      return "read-write";
  }
  return "?";
}

namespace {

// Greedy aligned cover of [addr, addr+len) with 1/2/4/8-byte chunks, for advice text.
std::string DescribeCover(uint64_t addr, uint64_t len) {
  std::string out;
  int chunks = 0;
  uint64_t a = addr;
  const uint64_t end = addr + len;
  while (a < end && chunks < 8) {
    uint64_t size = 8;
    while (size > 1 && ((a % size) != 0 || a + size > end)) {
      size /= 2;
    }
    absl::StrAppend(&out, chunks == 0 ? "" : ", ", absl::StrFormat("0x%x:%d", a, size));
    a += size;
    ++chunks;
  }
  if (a < end) {
    absl::StrAppend(&out, ", ...");
  }
  return out;
}

}  // namespace

absl::Status CheckHardwareRange(core::RemoteAddr addr, uint64_t len, DrKind kind) {
  if (kind == DrKind::kExec) {
    if (len != 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "an execute breakpoint covers one instruction start; length %d is not possible", len));
    }
    return absl::OkStatus();
  }
  if (len != 1 && len != 2 && len != 4 && len != 8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d bytes at 0x%x cannot be watched by one debug register: x86 watches 1, 2, 4 or 8 "
        "bytes; this range needs these aligned pieces: %s (watch one with 0xADDR:LEN or a "
        "smaller field)",
        len, addr.value, DescribeCover(addr.value, len)));
  }
  if (addr.value % len != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "0x%x is not aligned to %d bytes: a %d-byte debug register must start at a multiple of "
        "%d; this range needs these aligned pieces: %s",
        addr.value, len, len, len, DescribeCover(addr.value, len)));
  }
  return absl::OkStatus();
}

DrLen EncodeLen(uint64_t len) {
  switch (len) {
    case 2:
      return DrLen::k2;
    case 4:
      return DrLen::k4;
    case 8:
      return DrLen::k8;
    default:
      return DrLen::k1;
  }
}

}  // namespace kwatch::drmgr
