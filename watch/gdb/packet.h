#pragma once

// The GDB remote serial protocol's framing: `$payload#cs` packets (cs: two hex digits, the
// payload's byte sum modulo 256), `}` escapes (the next byte XOR 0x20), `*` run-length
// encoding (the previous character repeated `n - 29` more times), `+`/`-` acknowledgements
// and the interrupt byte 0x03. Pure functions and a streaming decoder; no I/O.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kwatch::watch::gdb {

// `$payload#cs` with '$', '#', '}' and '*' in `payload` escaped (binary-safe; no run-length).
std::string EncodePacket(absl::string_view payload);

// One thing the decoder found in the byte stream.
struct Frame {
  enum class Kind : uint8_t {
    kPacket,       // `payload`: unescaped, run-length expanded
    kBadChecksum,  // a packet whose checksum did not match (answer '-'); `payload` as read
    kMalformed,    // a packet that cannot be decoded (a `*` with nothing before it, a lone
                   // escape, a bad checksum digit); answer '-'
    kAck,          // '+'
    kNack,         // '-': resend the last packet
    kInterrupt,    // 0x03 outside a packet: stop the target
  };
  Kind kind = Kind::kPacket;
  std::string payload;
};

// Splits a byte stream into frames. Bytes outside packets other than '+', '-' and 0x03 are
// ignored (as gdb does). A packet longer than `max_packet` bytes is dropped as malformed.
// Not thread-safe.
class PacketDecoder {
 public:
  explicit PacketDecoder(size_t max_packet = 1 << 20) : max_packet_(max_packet) {}

  // Appends what Feed found in `bytes` to `out`, in stream order; a packet split across calls
  // is completed by the later call.
  void Feed(absl::string_view bytes, std::vector<Frame>& out);

 private:
  enum class State : uint8_t { kIdle, kPayload, kChecksum1, kChecksum2 };
  void Finish(std::vector<Frame>& out);

  size_t max_packet_;
  State state_ = State::kIdle;
  std::string raw_;       // the payload as sent (escaped), for the checksum
  std::string checksum_;  // its two digits
  bool overflow_ = false;
};

// Decodes escapes and run-length encoding of a raw payload. InvalidArgument for a `*` with no
// character before it or a count below 3 (29 + 3 = ' '), or a payload ending in `}`.
absl::StatusOr<std::string> UnescapePayload(absl::string_view raw);

// Lower-case hex of `bytes`, two digits each.
std::string ToHex(std::span<const uint8_t> bytes);
std::string ToHex(absl::string_view bytes);
// Bytes of an even-length hex string; InvalidArgument otherwise.
absl::StatusOr<std::vector<uint8_t>> FromHex(absl::string_view hex);
// A big-endian hex number (1 to 16 digits), as addresses and lengths are sent.
absl::StatusOr<uint64_t> ParseHexNumber(absl::string_view hex);
// `value` as hex without leading zeros ("0" for zero).
std::string HexNumber(uint64_t value);

}  // namespace kwatch::watch::gdb
