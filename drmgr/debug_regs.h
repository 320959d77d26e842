#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/base/remote_addr.h"

namespace kwatch::drmgr {

// DR7 R/W field encodings (Intel SDM vol. 3, 17.2.4). x86 has no read-only breakpoint:
// reads are watched as read-write and filtered in software.
enum class DrKind : uint8_t { kExec = 0, kWrite = 1, kReadWrite = 3 };

// DR7 LEN field encodings: the length of a data breakpoint.
enum class DrLen : uint8_t { k1 = 0, k2 = 1, k8 = 2, k4 = 3 };

inline constexpr int kNumDebugRegisters = 4;

absl::string_view DrKindName(DrKind kind);

// Whether one debug register can cover [addr, addr+len): len is 1, 2, 4 or 8 and addr is
// aligned to len (for execute breakpoints, len must be 1). On failure: InvalidArgument
// saying which rule was broken and what would work (the aligned ranges that cover it).
absl::Status CheckHardwareRange(core::RemoteAddr addr, uint64_t len, DrKind kind);

// The DR7 LEN encoding of a valid length.
DrLen EncodeLen(uint64_t len);

}  // namespace kwatch::drmgr
