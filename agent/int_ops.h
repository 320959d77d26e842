#pragma once

// The integer semantics of conditions, in one place for the two machines that run them:
// watch::Condition in kwatch (watch/condition.cc) and the agent's filter programs in the target
// (agent/filter.cc). 64-bit words; signed operators read them as two's complement; no
// implementation-defined conversion, no undefined behaviour for any operand. Header-only, no
// library: the agent includes it.

#include <cstdint>

namespace kwatch::agent::int_ops {

inline constexpr uint64_t kSignBit = uint64_t{1} << 63;

constexpr bool Negative(uint64_t a) {
  return (a & kSignBit) != 0;
}
constexpr uint64_t Negate(uint64_t a) {
  return ~a + 1;
}
constexpr uint64_t Magnitude(uint64_t a) {
  return Negative(a) ? Negate(a) : a;
}
// Signed order: flipping the sign bit maps int64 order onto uint64 order.
constexpr bool LessSigned(uint64_t a, uint64_t b) {
  return (a ^ kSignBit) < (b ^ kSignBit);
}
// Truncating towards zero; INT64_MIN / -1 wraps to INT64_MIN. b != 0.
constexpr uint64_t DivSigned(uint64_t a, uint64_t b) {
  const uint64_t q = Magnitude(a) / Magnitude(b);
  return Negative(a) != Negative(b) ? Negate(q) : q;
}
// The remainder has the dividend's sign (C99). b != 0.
constexpr uint64_t ModSigned(uint64_t a, uint64_t b) {
  const uint64_t r = Magnitude(a) % Magnitude(b);
  return Negative(a) ? Negate(r) : r;
}
// Shifts by 64 or more give 0 (or all ones for a negative value's arithmetic shift).
constexpr uint64_t Shl(uint64_t a, uint64_t n) {
  return n >= 64 ? 0 : a << n;
}
constexpr uint64_t ShrU(uint64_t a, uint64_t n) {
  return n >= 64 ? 0 : a >> n;
}
constexpr uint64_t ShrS(uint64_t a, uint64_t n) {
  if (n >= 64) {
    return Negative(a) ? ~uint64_t{0} : 0;
  }
  const uint64_t shifted = a >> n;
  return Negative(a) && n > 0 ? shifted | ~(~uint64_t{0} >> n) : shifted;
}

static_assert(DivSigned(Negate(7), 2) == Negate(3));
static_assert(ModSigned(Negate(7), 2) == Negate(1));
static_assert(DivSigned(kSignBit, ~uint64_t{0}) == kSignBit);
static_assert(ShrS(Negate(8), 1) == Negate(4));
static_assert(ShrS(Negate(1), 64) == ~uint64_t{0});

}  // namespace kwatch::agent::int_ops
