#include "watch/bitfield_value.h"

#include <algorithm>

#include "watch/condition.h"

namespace kwatch::watch {

std::optional<BitfieldPlace> WatchedBitfield(const core::symbols::ResolvedExpr& target) {
  if (!target.layout.has_value()) {
    return std::nullopt;
  }
  const core::symbols::FieldLayout* leaf = nullptr;
  for (const core::symbols::FieldLayout& f : target.layout->fields) {
    if (!f.is_leaf) {
      continue;
    }
    if (leaf != nullptr) {
      return std::nullopt;  // a structure: its fields are labelled, not decoded
    }
    leaf = &f;
  }
  if (leaf == nullptr || leaf->bit_size == 0 || leaf->bit_size > 64) {
    return std::nullopt;
  }
  return BitfieldPlace{target.addr.value + leaf->offset, leaf->bit_offset, leaf->bit_size,
                       IsSignedType(leaf->type_name)};
}

std::optional<uint64_t> BitfieldIn(const BitfieldPlace& b, uint64_t access_addr, uint32_t size,
                                   uint64_t raw) {
  const uint64_t first_bit = b.addr * 8 + b.bit_offset;  // in bits from address 0
  const uint64_t access_bits = uint64_t{std::min<uint32_t>(size, 8)} * 8;
  if (first_bit < access_addr * 8 || first_bit + b.bit_size > access_addr * 8 + access_bits) {
    return std::nullopt;
  }
  const uint64_t shift = first_bit - access_addr * 8;
  uint64_t v = raw >> shift;
  if (b.bit_size < 64) {
    v &= (uint64_t{1} << b.bit_size) - 1;
    if (b.is_signed && (v >> (b.bit_size - 1)) != 0) {
      v |= ~((uint64_t{1} << b.bit_size) - 1);
    }
  }
  return v;
}

EventValues ValuesOf(const std::optional<BitfieldPlace>& bitfield, const core::AccessEvent& ev) {
  const uint32_t size = ev.access_size != 0 ? ev.access_size : ev.len;
  const uint64_t at = ev.access_size != 0 ? ev.access_addr.value : ev.addr.value;
  EventValues out{ev.value, ev.old_value, false, std::min<uint32_t>(size, 8)};
  if (!bitfield.has_value() || !ev.value.has_value()) {
    return out;
  }
  const std::optional<uint64_t> value = BitfieldIn(*bitfield, at, size, *ev.value);
  if (!value.has_value()) {
    return out;
  }
  out.value = value;
  out.old_value =
      ev.old_value.has_value() ? BitfieldIn(*bitfield, at, size, *ev.old_value) : std::nullopt;
  out.decoded = true;
  return out;
}

bool AccessesAPointer(const core::symbols::ResolvedExpr& target, const core::AccessEvent& ev) {
  if (!target.layout.has_value()) {
    return false;
  }
  const uint64_t addr = ev.access_size > 0 ? ev.access_addr.value : ev.addr.value;
  const uint32_t size = ev.access_size > 0 ? ev.access_size : ev.len;
  if (addr < target.addr.value) {
    return false;
  }
  const core::symbols::FieldLayout* leaf = target.layout->LeafAt(addr - target.addr.value);
  if (leaf == nullptr || leaf->offset != addr - target.addr.value || leaf->size != size ||
      leaf->bit_size != 0) {
    return false;
  }
  return UnqualifiedType(leaf->type_name).ends_with('*');
}

}  // namespace kwatch::watch
