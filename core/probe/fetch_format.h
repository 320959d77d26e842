#pragma once

// How a probe argument's value is shown, once its bytes are known: the one set of rules
// (perf's text) behind core::Evaluate (which reads the target as it goes) and the in-process
// agent's records (core/probe/agent_fetch.h, whose bytes were copied at the hit).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/probe/fetch.h"

namespace kwatch::core::probe {

// What an argument shows when the memory it needs cannot be read, as perf shows it.
inline constexpr absl::string_view kFetchFault = "(fault)";

// `s` between double quotes, '"' and '\\' escaped, \n and \t as such, other bytes outside
// 0x20..0x7e as \xNN; `cut` appends "..." after the closing quote.
std::string QuoteFetchString(absl::string_view s, bool cut);

// The inverse of QuoteFetchString: the bytes of a shown string ("..." with escapes; a cut one
// keeps its "..." after the bytes). False when `shown` is not a quoted string ((fault), a
// number).
bool UnquoteFetchString(absl::string_view shown, std::string& out);

// An integer or float of `arg`'s type (and bitfield) from the little-endian `raw`: decimal
// for u/s, %g for floats, 0x.. for x.
std::string FormatFetchScalar(const CompiledArg& arg, uint64_t raw);

// A string read from memory: `bytes` are those before its NUL, or the first
// kMaxFetchString + 1 bytes when none had a NUL (shown cut at kMaxFetchString, with "..."),
// or those before memory that could not be read (`faulted`: shown as they are, kFetchFault
// when there are none).
std::string FormatFetchString(absl::string_view bytes, bool faulted);

// `bytes` from `offset` on: an offset step of `arg` on a value that is not in memory.
// FailedPrecondition (naming the argument) when the offset leaves the bytes.
absl::StatusOr<std::span<const uint8_t>> FetchBytesAt(const CompiledArg& arg,
                                                      std::span<const uint8_t> bytes,
                                                      int64_t offset);

// The value of `arg` whose place, after its steps before `first_step`, is the bytes `bytes`
// (a register's, a constant's, or the memory its final read copied): the steps from
// `first_step` on (offsets within the bytes, no dereference) and the final read.
// FailedPrecondition as FetchBytesAt; Internal when a dereference is left.
absl::StatusOr<std::string> FormatFetchBytes(const CompiledArg& arg, std::span<const uint8_t> bytes,
                                             size_t first_step);

// The text an argument shows for an evaluation that failed: "<error: MESSAGE>".
std::string FetchErrorText(const absl::Status& status);

}  // namespace kwatch::core::probe
