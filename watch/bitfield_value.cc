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

const core::symbols::FieldLayout* AccessedField(const core::symbols::ResolvedExpr& target,
                                                const core::AccessEvent& ev) {
  if (!target.layout.has_value()) {
    return nullptr;
  }
  const uint64_t addr = ev.access_size > 0 ? ev.access_addr.value : ev.addr.value;
  const uint32_t size = ev.access_size > 0 ? ev.access_size : ev.len;
  if (addr < target.addr.value) {
    return nullptr;
  }
  const uint64_t offset = addr - target.addr.value;
  const std::vector<core::symbols::FieldLayout>& fields = target.layout->fields;
  for (const size_t c : core::symbols::CountedFields(fields)) {
    const core::symbols::FieldLayout& f = fields[c];
    if (f.offset == offset && f.size == size && f.bit_size == 0) {
      return &f;
    }
  }
  return nullptr;
}

}  // namespace kwatch::watch
