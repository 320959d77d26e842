#include "core/store/hit_blocks.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/store/recording_limits.h"
#include "core/store/varint.h"
#include "core/store/zstd_block.h"

namespace kwatch::core::store {
namespace {

constexpr uint8_t kFormat = 1;
constexpr uint8_t kReturn = 1;
// Bytes of a hit's fixed columns at most: 8 varints of at most 10 bytes and a flags byte.
constexpr size_t kFixedBytes = 81;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("a hit block ", what));
}

uint64_t Signed(pid_t v) {
  return static_cast<uint64_t>(static_cast<int64_t>(v));
}

}  // namespace

size_t HitBlockBytes(const HitRecord& h) {
  size_t n = kFixedBytes;
  for (const auto& [name, value] : h.args) {
    n += name.size() + value.size() + 20;
  }
  return n;
}

std::string EncodeHitBlock(absl::Span<const HitRecord> hits) {
  std::string raw;
  raw.reserve(hits.size() * 16);
  raw.push_back(static_cast<char>(kFormat));
  uint64_t prev = 0;
  for (const HitRecord& h : hits) {
    PutDelta(raw, h.time_ns, prev);
    prev = h.time_ns;
  }
  prev = 0;
  for (const HitRecord& h : hits) {
    PutDelta(raw, Signed(h.pid), prev);
    prev = Signed(h.pid);
  }
  for (const HitRecord& h : hits) {
    PutDelta(raw, Signed(h.tid), Signed(h.pid));
  }
  for (const HitRecord& h : hits) {
    PutVarint(raw, h.cpu == kUnknownCpu ? 0 : uint64_t{h.cpu} + 1);
  }
  for (const HitRecord& h : hits) {
    PutVarint(raw, h.probe_id);
  }
  prev = 0;
  for (const HitRecord& h : hits) {
    PutDelta(raw, h.ip.value, prev);
    prev = h.ip.value;
  }
  for (const HitRecord& h : hits) {
    raw.push_back(static_cast<char>(h.is_return ? kReturn : 0));
  }
  for (const HitRecord& h : hits) {
    PutVarint(raw, h.stack_id);
  }
  for (const HitRecord& h : hits) {
    PutVarint(raw, h.args.size());
  }
  // Argument names: the index of one seen before in this block, or the next index followed by
  // the new name.
  absl::flat_hash_map<absl::string_view, uint64_t> names;
  for (const HitRecord& h : hits) {
    for (const auto& arg : h.args) {
      const auto [it, added] = names.try_emplace(arg.first, names.size());
      PutVarint(raw, it->second);
      if (added) {
        PutBytes(raw, arg.first);
      }
    }
  }
  for (const HitRecord& h : hits) {
    for (const auto& arg : h.args) {
      PutBytes(raw, arg.second);
    }
  }
  return ZstdCompress(raw);
}

absl::Status DecodeHitBlock(absl::string_view data, uint64_t count, std::vector<HitRecord>* out) {
  if (count == 0 || count > kMaxBlockHits) {
    return Bad(absl::StrCat("says it holds ", count, " hits; a block holds 1 to ", kMaxBlockHits));
  }
  std::string raw;
  if (absl::Status st = ZstdDecompress(data, kMaxHitBlockBytes, "a hit block", &raw); !st.ok()) {
    return st;
  }
  VarintReader c(raw);
  uint8_t format = 0;
  if (!c.Byte(&format) || format != kFormat) {
    return Bad(absl::StrCat("has format ", format, "; this kwatch reads ", kFormat));
  }
  const size_t base = out->size();
  out->resize(base + count);
  const absl::Span<HitRecord> hits = absl::MakeSpan(*out).subspan(base);
  bool ok = true;
  uint64_t prev = 0;
  uint64_t v = 0;
  for (HitRecord& h : hits) {
    ok = ok && c.Delta(prev, &h.time_ns);
    prev = h.time_ns;
  }
  prev = 0;
  for (HitRecord& h : hits) {
    ok = ok && c.Delta(prev, &v);
    prev = v;
    h.pid = static_cast<pid_t>(static_cast<int64_t>(v));
  }
  for (HitRecord& h : hits) {
    ok = ok && c.Delta(Signed(h.pid), &v);
    h.tid = static_cast<pid_t>(static_cast<int64_t>(v));
  }
  for (HitRecord& h : hits) {
    ok = ok && c.U(&v) && v <= 0xffffffffULL;
    h.cpu = v == 0 ? kUnknownCpu : static_cast<uint32_t>(v - 1);
  }
  for (HitRecord& h : hits) {
    ok = ok && c.U(&v) && v <= 0xffffffffULL;
    h.probe_id = static_cast<uint32_t>(v);
  }
  prev = 0;
  for (HitRecord& h : hits) {
    ok = ok && c.Delta(prev, &h.ip.value);
    prev = h.ip.value;
  }
  for (HitRecord& h : hits) {
    uint8_t flags = 0;
    ok = ok && c.Byte(&flags) && flags <= kReturn;
    h.is_return = flags == kReturn;
  }
  for (HitRecord& h : hits) {
    ok = ok && c.U(&v) && v <= 0xffffffffULL;
    h.stack_id = static_cast<uint32_t>(v);
  }
  // Every argument takes at least two bytes (its name's index, its value's length): a count
  // beyond what is left is damage, found before anything is allocated for it.
  uint64_t total_args = 0;
  for (HitRecord& h : hits) {
    ok = ok && c.U(&v) && v <= c.remaining() / 2;
    if (ok) {
      total_args += v;
      ok = total_args <= c.remaining() / 2;
      h.args.resize(static_cast<size_t>(v));
    }
  }
  std::vector<absl::string_view> names;
  absl::string_view bytes;
  for (HitRecord& h : hits) {
    for (size_t i = 0; ok && i < h.args.size(); ++i) {
      ok = c.U(&v) && v <= names.size();
      if (ok && v == names.size()) {
        ok = c.Bytes(&bytes) && bytes.size() <= kMaxRecordedText;
        names.push_back(bytes);
      }
      if (ok) {
        const absl::string_view name = names[static_cast<size_t>(v)];
        h.args[i].first.assign(name.data(), name.size());
      }
    }
  }
  for (HitRecord& h : hits) {
    size_t hit_bytes = 0;
    for (size_t i = 0; ok && i < h.args.size(); ++i) {
      ok = c.Bytes(&bytes);
      hit_bytes += bytes.size() + h.args[i].first.size();
      ok = ok && hit_bytes <= kMaxRecordedArgs;
      if (ok) {
        h.args[i].second.assign(bytes.data(), bytes.size());
      }
    }
  }
  if (!ok || !c.done()) {
    out->resize(base);
    return Bad("is truncated or damaged");
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::store
