#include "core/store/event_blocks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/store/varint.h"
#include "core/store/zstd_block.h"

namespace kwatch::core::store {
namespace {

constexpr uint8_t kFormat = 1;
// Decompressed bytes per event at most: 13 varints of at most 10 bytes and a flags byte.
constexpr size_t kMaxEventBytes = 160;

constexpr uint8_t kHasValue = 4;
constexpr uint8_t kHasOld = 8;
constexpr uint8_t kExact = 16;

void PutU(std::string& s, uint64_t v) {
  PutVarint(s, v);
}

using Cursor = VarintReader;

uint8_t Flags(const AccessEvent& e) {
  return static_cast<uint8_t>(static_cast<uint8_t>(e.kind) | (e.value ? kHasValue : 0) |
                              (e.old_value ? kHasOld : 0) | (e.value_exact ? kExact : 0));
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("an event block ", what));
}

}  // namespace

std::string EncodeEventBlock(absl::Span<const AccessEvent> events) {
  std::string raw;
  raw.reserve(events.size() * 24);
  raw.push_back(static_cast<char>(kFormat));
  uint64_t prev = 0;
  for (const AccessEvent& e : events) {
    PutDelta(raw, e.time_ns, prev);
    prev = e.time_ns;
  }
  prev = 0;
  for (const AccessEvent& e : events) {
    PutDelta(raw, static_cast<uint64_t>(static_cast<int64_t>(e.pid)), prev);
    prev = static_cast<uint64_t>(static_cast<int64_t>(e.pid));
  }
  for (const AccessEvent& e : events) {
    PutDelta(raw, static_cast<uint64_t>(static_cast<int64_t>(e.tid)),
             static_cast<uint64_t>(static_cast<int64_t>(e.pid)));
  }
  for (const AccessEvent& e : events) {
    PutU(raw, e.cpu == kUnknownCpu ? 0 : uint64_t{e.cpu} + 1);
  }
  for (const AccessEvent& e : events) {
    PutU(raw, e.watch_id);
  }
  prev = 0;
  for (const AccessEvent& e : events) {
    PutDelta(raw, e.ip.value, prev);
    prev = e.ip.value;
  }
  for (const AccessEvent& e : events) {
    PutDelta(raw, e.trap_ip.value, e.ip.value);
  }
  prev = 0;
  for (const AccessEvent& e : events) {
    PutDelta(raw, e.addr.value, prev);
    prev = e.addr.value;
  }
  for (const AccessEvent& e : events) {
    PutU(raw, e.len);
  }
  for (const AccessEvent& e : events) {
    PutDelta(raw, e.access_addr.value, e.addr.value);
  }
  for (const AccessEvent& e : events) {
    PutU(raw, e.access_size);
  }
  for (const AccessEvent& e : events) {
    raw.push_back(static_cast<char>(Flags(e)));
  }
  prev = 0;
  for (const AccessEvent& e : events) {
    if (e.value) {
      PutDelta(raw, *e.value, prev);
      prev = *e.value;
    }
  }
  for (const AccessEvent& e : events) {
    if (e.old_value) {
      PutDelta(raw, *e.old_value, e.value.value_or(0));
    }
  }
  return ZstdCompress(raw);
}

absl::Status DecodeEventBlock(absl::string_view data, uint64_t count,
                              std::vector<AccessEvent>* out) {
  if (count == 0 || count > kMaxBlockEvents) {
    return Bad(
        absl::StrCat("says it holds ", count, " events; a block holds 1 to ", kMaxBlockEvents));
  }
  std::string raw;
  if (absl::Status st = ZstdDecompress(data, count * kMaxEventBytes + 1, "an event block", &raw);
      !st.ok()) {
    return st;
  }
  Cursor c(raw);
  uint8_t format = 0;
  if (!c.Byte(&format) || format != kFormat) {
    return Bad(absl::StrCat("has format ", format, "; this kwatch reads ", kFormat));
  }
  const size_t base = out->size();
  out->resize(base + count);
  const absl::Span<AccessEvent> ev = absl::MakeSpan(*out).subspan(base);
  bool ok = true;
  uint64_t prev = 0;
  uint64_t v = 0;
  for (AccessEvent& e : ev) {
    ok = ok && c.Delta(prev, &e.time_ns);
    prev = e.time_ns;
  }
  prev = 0;
  for (AccessEvent& e : ev) {
    ok = ok && c.Delta(prev, &v);
    prev = v;
    e.pid = static_cast<pid_t>(static_cast<int64_t>(v));
  }
  for (AccessEvent& e : ev) {
    ok = ok && c.Delta(static_cast<uint64_t>(static_cast<int64_t>(e.pid)), &v);
    e.tid = static_cast<pid_t>(static_cast<int64_t>(v));
  }
  for (AccessEvent& e : ev) {
    ok = ok && c.U(&v) && v <= 0xffffffffULL;
    e.cpu = v == 0 ? kUnknownCpu : static_cast<uint32_t>(v - 1);
  }
  for (AccessEvent& e : ev) {
    ok = ok && c.U(&v) && v <= 0xffffffffULL;
    e.watch_id = static_cast<uint32_t>(v);
  }
  prev = 0;
  for (AccessEvent& e : ev) {
    ok = ok && c.Delta(prev, &e.ip.value);
    prev = e.ip.value;
  }
  for (AccessEvent& e : ev) {
    ok = ok && c.Delta(e.ip.value, &e.trap_ip.value);
  }
  prev = 0;
  for (AccessEvent& e : ev) {
    ok = ok && c.Delta(prev, &e.addr.value);
    prev = e.addr.value;
  }
  for (AccessEvent& e : ev) {
    ok = ok && c.U(&v) && v <= 0xffffffffULL;
    e.len = static_cast<uint32_t>(v);
  }
  for (AccessEvent& e : ev) {
    ok = ok && c.Delta(e.addr.value, &e.access_addr.value);
  }
  for (AccessEvent& e : ev) {
    ok = ok && c.U(&v) && v <= 0xffffffffULL;
    e.access_size = static_cast<uint32_t>(v);
  }
  std::vector<uint8_t> flags(count);
  for (size_t i = 0; i < count; ++i) {
    ok = ok && c.Byte(&flags[i]) && (flags[i] & 3) <= 2 && flags[i] < 32;
    ev[i].kind = static_cast<AccessKind>(flags[i] & 3);
    ev[i].value_exact = (flags[i] & kExact) != 0;
  }
  if (!ok) {
    out->resize(base);
    return Bad("is truncated or damaged");
  }
  prev = 0;
  for (size_t i = 0; i < count; ++i) {
    ev[i].value.reset();
    if ((flags[i] & kHasValue) != 0) {
      ok = ok && c.Delta(prev, &v);
      prev = v;
      ev[i].value = v;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    ev[i].old_value.reset();
    if ((flags[i] & kHasOld) != 0) {
      ok = ok && c.Delta(ev[i].value.value_or(0), &v);
      ev[i].old_value = v;
    }
  }
  if (!ok || !c.done()) {
    out->resize(base);
    return Bad("is truncated or damaged");
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::store
