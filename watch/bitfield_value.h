#pragma once

#include <cstdint>
#include <optional>

#include "core/event.h"
#include "core/symbols/symbols.h"

namespace kwatch::watch {

// Where a watched bitfield's bits are: bits [bit_offset, bit_offset + bit_size) of the
// little-endian storage unit that starts at `addr`.
struct BitfieldPlace {
  uint64_t addr = 0;
  uint32_t bit_offset = 0;
  uint32_t bit_size = 0;
  bool is_signed = false;  // its C type is signed: values are sign-extended from bit_size
};

// The bitfield a watch is on (`s.mode`: the target's layout is one leaf field with
// bit_size > 0); nullopt for anything else.
std::optional<BitfieldPlace> WatchedBitfield(const core::symbols::ResolvedExpr& target);

// The bitfield's value in `raw`, the little-endian bytes of an access of `size` bytes at
// `access_addr` (at most the low 8 bytes are in `raw`), sign-extended to 64 bits when the
// bitfield is signed; nullopt when the access does not hold all of its bits.
std::optional<uint64_t> BitfieldIn(const BitfieldPlace& b, uint64_t access_addr, uint32_t size,
                                   uint64_t raw);

// What an event's value and old value mean for a watch on a bitfield: the bitfield's bits of
// the accessed bytes (the hardware reports the whole store, e.g. `0 -> 9` for a byte holding
// `mode : 3` = 1 and the next bitfield). Unchanged for other watches, and when the access
// does not hold all of the bitfield's bits (`decoded` false then).
struct EventValues {
  std::optional<uint64_t> value;
  std::optional<uint64_t> old_value;
  bool decoded = false;  // bitfield values; print them as is (already sign-extended)
  uint32_t width = 0;    // bytes of the raw values when not decoded
  // The one whole field the access is (AccessedField), whose type says how its values read
  // (FieldValueText); null when unknown. Set by the caller.
  const core::symbols::FieldLayout* field = nullptr;
};
EventValues ValuesOf(const std::optional<BitfieldPlace>& bitfield, const core::AccessEvent& ev);

// The field of `target`'s layout that `ev` accessed exactly, whole (the watched variable
// itself, a member of a watched structure, a union as one: core::symbols::CountedFields); null
// when the access covers several fields or part of one, or a bitfield (see ValuesOf).
const core::symbols::FieldLayout* AccessedField(const core::symbols::ResolvedExpr& target,
                                                const core::AccessEvent& ev);

}  // namespace kwatch::watch
