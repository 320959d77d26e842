#include "watch/gdb/packet.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kwatch::watch::gdb {

namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

uint8_t Checksum(absl::string_view s) {
  unsigned sum = 0;
  for (const char c : s) {
    sum += static_cast<uint8_t>(c);
  }
  return static_cast<uint8_t>(sum & 0xff);
}

}  // namespace

std::string EncodePacket(absl::string_view payload) {
  std::string body;
  body.reserve(payload.size() + 8);
  for (const char c : payload) {
    if (c == '$' || c == '#' || c == '}' || c == '*') {
      body += '}';
      body += static_cast<char>(c ^ 0x20);
    } else {
      body += c;
    }
  }
  return absl::StrFormat("$%s#%02x", body, Checksum(body));
}

absl::StatusOr<std::string> UnescapePayload(absl::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    if (c == '}') {
      if (i + 1 >= raw.size()) {
        return absl::InvalidArgumentError("packet ends inside an escape ('}')");
      }
      out += static_cast<char>(raw[++i] ^ 0x20);
    } else if (c == '*') {
      if (out.empty() || i + 1 >= raw.size()) {
        return absl::InvalidArgumentError("run-length '*' without a character to repeat");
      }
      const int n = static_cast<uint8_t>(raw[++i]) - 29;
      if (n < 3 || n > 97) {
        return absl::InvalidArgumentError(
            absl::StrFormat("run-length count %d out of range (3 to 97)", n));
      }
      out.append(static_cast<size_t>(n), out.back());
    } else {
      out += c;
    }
  }
  return out;
}

void PacketDecoder::Finish(std::vector<Frame>& out) {
  const int hi = HexDigit(checksum_[0]);
  const int lo = HexDigit(checksum_[1]);
  state_ = State::kIdle;
  Frame f{Frame::Kind::kMalformed, {}};
  if (!overflow_ && hi >= 0 && lo >= 0) {
    if (Checksum(raw_) != hi * 16 + lo) {
      f.kind = Frame::Kind::kBadChecksum;
    } else if (absl::StatusOr<std::string> p = UnescapePayload(raw_); p.ok()) {
      f = {Frame::Kind::kPacket, *std::move(p)};
    }
  }
  if (f.kind != Frame::Kind::kPacket) {
    f.payload = std::move(raw_);
  }
  out.push_back(std::move(f));
  raw_.clear();
  checksum_.clear();
  overflow_ = false;
}

void PacketDecoder::Feed(absl::string_view bytes, std::vector<Frame>& out) {
  for (const char c : bytes) {
    switch (state_) {
      case State::kIdle:
        if (c == '$') {
          state_ = State::kPayload;
          raw_.clear();
          overflow_ = false;
        } else if (c == '+') {
          out.push_back({Frame::Kind::kAck, {}});
        } else if (c == '-') {
          out.push_back({Frame::Kind::kNack, {}});
        } else if (c == '\x03') {
          out.push_back({Frame::Kind::kInterrupt, {}});
        }
        break;
      case State::kPayload:
        if (c == '#') {
          state_ = State::kChecksum1;
        } else if (c == '$') {
          // A new packet before the end of this one: the first was cut short.
          out.push_back({Frame::Kind::kMalformed, std::move(raw_)});
          raw_.clear();
          overflow_ = false;
        } else if (raw_.size() >= max_packet_) {
          overflow_ = true;
        } else {
          raw_ += c;
        }
        break;
      case State::kChecksum1:
        checksum_.assign(1, c);
        state_ = State::kChecksum2;
        break;
      case State::kChecksum2:
        checksum_ += c;
        Finish(out);
        break;
    }
  }
}

std::string ToHex(std::span<const uint8_t> bytes) {
  static constexpr absl::string_view kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

std::string ToHex(absl::string_view bytes) {
  return ToHex(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

absl::StatusOr<std::vector<uint8_t>> FromHex(absl::string_view hex) {
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("odd number of hex digits: '", hex, "'"));
  }
  std::vector<uint8_t> out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = HexDigit(hex[i]);
    const int lo = HexDigit(hex[i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("not hex: '", hex.substr(i, 2), "'"));
    }
    out.push_back(static_cast<uint8_t>(hi * 16 + lo));
  }
  return out;
}

absl::StatusOr<uint64_t> ParseHexNumber(absl::string_view hex) {
  if (hex.empty() || hex.size() > 16) {
    return absl::InvalidArgumentError(absl::StrCat("not a hex number: '", hex, "'"));
  }
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
  if (ec != std::errc() || end != hex.data() + hex.size()) {
    return absl::InvalidArgumentError(absl::StrCat("not a hex number: '", hex, "'"));
  }
  return v;
}

std::string HexNumber(uint64_t value) {
  return absl::StrFormat("%x", value);
}

}  // namespace kwatch::watch::gdb
