#include "core/probe/fetch_format.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace kwatch::core::probe {

std::string QuoteFetchString(absl::string_view s, bool cut) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", absl::string_view(&c, 1));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u >= 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", u));
    } else {
      out.push_back(c);
    }
  }
  out += "\"";
  if (cut) {
    out += "...";
  }
  return out;
}

bool UnquoteFetchString(absl::string_view shown, std::string& out) {
  absl::string_view s = shown;
  bool cut = absl::ConsumeSuffix(&s, "...");
  if (s.size() < 2 || s.front() != '"' || s.back() != '"') {
    return false;
  }
  s = s.substr(1, s.size() - 2);
  out.clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    if (e == 'n') {
      out += '\n';
    } else if (e == 't') {
      out += '\t';
    } else if (int v = 0;
               e == 'x' && i + 2 < s.size() && absl::SimpleHexAtoi(s.substr(i + 1, 2), &v)) {
      out += static_cast<char>(v);
      i += 2;
    } else {
      out += e;
    }
  }
  if (cut) {
    out += "...";
  }
  return true;
}

std::string FormatFetchScalar(const CompiledArg& arg, uint64_t raw) {
  uint64_t v = raw;
  unsigned bits = arg.type.bits;
  if (arg.bit_size != 0) {
    bits = arg.bit_size;
    v = (raw >> arg.bit_offset) & (bits >= 64 ? ~0ULL : ((1ULL << bits) - 1));
  } else if (bits < 64) {
    v &= (1ULL << bits) - 1;
  }
  switch (arg.type.kind) {
    case ArgType::Kind::kSigned: {
      if (bits < 64 && (v >> (bits - 1)) != 0) {
        v |= ~((1ULL << bits) - 1);
      }
      return absl::StrCat(static_cast<int64_t>(v));
    }
    case ArgType::Kind::kUnsigned:
      return absl::StrCat(v);
    case ArgType::Kind::kFloat:
      if (arg.type.bits == 32) {
        float f = 0;
        const auto u32 = static_cast<uint32_t>(v);
        std::memcpy(&f, &u32, sizeof(f));
        return absl::StrFormat("%g", f);
      } else {
        double d = 0;
        std::memcpy(&d, &v, sizeof(d));
        return absl::StrFormat("%g", d);
      }
    case ArgType::Kind::kHex:
    case ArgType::Kind::kString:
      break;
  }
  return absl::StrFormat("0x%x", v);
}

std::string FormatFetchString(absl::string_view bytes, bool faulted) {
  if (bytes.size() > kMaxFetchString) {
    return QuoteFetchString(bytes.substr(0, kMaxFetchString), true);
  }
  if (faulted && bytes.empty()) {
    return std::string{kFetchFault};
  }
  return QuoteFetchString(bytes, false);
}

absl::StatusOr<std::span<const uint8_t>> FetchBytesAt(const CompiledArg& arg,
                                                      std::span<const uint8_t> bytes,
                                                      int64_t offset) {
  if (offset < 0 || static_cast<size_t>(offset) >= bytes.size()) {
    return absl::FailedPreconditionError(absl::StrCat("'", arg.text, "': offset ", offset,
                                                      " is outside the value's ", bytes.size(),
                                                      " bytes (it is not in memory)"));
  }
  return bytes.subspan(static_cast<size_t>(offset));
}

absl::StatusOr<std::string> FormatFetchBytes(const CompiledArg& arg, std::span<const uint8_t> bytes,
                                             size_t first_step) {
  for (size_t i = first_step; i < arg.steps.size(); ++i) {
    const FetchStep& step = arg.steps[i];
    if (step.kind != FetchStep::Kind::kOffset) {
      return absl::InternalError(
          absl::StrCat("'", arg.text, "': a dereference is left after step ", first_step));
    }
    absl::StatusOr<std::span<const uint8_t>> at = FetchBytesAt(arg, bytes, step.offset);
    if (!at.ok()) {
      return at.status();
    }
    bytes = *at;
  }
  if (arg.type.kind == ArgType::Kind::kString) {
    const auto nul = std::find(bytes.begin(), bytes.end(), 0);
    return QuoteFetchString(std::string(bytes.begin(), nul), false);
  }
  uint64_t raw = 0;
  std::memcpy(&raw, bytes.data(), std::min<size_t>({arg.size, 8, bytes.size()}));
  return FormatFetchScalar(arg, raw);
}

std::string FetchErrorText(const absl::Status& status) {
  return absl::StrCat("<error: ", status.message(), ">");
}

}  // namespace kwatch::core::probe
