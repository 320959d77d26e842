#include "core/store/args_json.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace kwatch::core::store {
namespace {

void AppendQuoted(absl::string_view s, std::string* out) {
  static constexpr absl::string_view kHex = "0123456789abcdef";
  out->push_back('"');
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out->append("\\u00");
          out->push_back(kHex[u >> 4]);
          out->push_back(kHex[u & 0xf]);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// A cursor over the JSON text; every method fails (returns false) rather than reading past
// the end.
class Parser {
 public:
  explicit Parser(absl::string_view s) : s_(s) {}

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == s_.size();
  }
  size_t pos() const { return pos_; }

  bool String(std::string* out) {
    if (!Consume('"')) {
      return false;
    }
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') {
        return true;
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) {
        return false;
      }
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) {
            return false;
          }
          if (cp >= 0xd800 && cp < 0xdc00 && pos_ + 1 < s_.size() && s_[pos_] == '\\' &&
              s_[pos_ + 1] == 'u') {
            const size_t save = pos_;
            pos_ += 2;
            uint32_t lo = 0;
            if (Hex4(&lo) && lo >= 0xdc00 && lo < 0xe000) {
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else {
              pos_ = save;
            }
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }

 private:
  bool Hex4(uint32_t* out) {
    if (s_.size() - pos_ < 4) {
      return false;
    }
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return false;
      }
    }
    *out = v;
    return true;
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

std::string EncodeArgsJson(const ProbeArgs& args) {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : args) {
    if (!first) {
      out.push_back(',');
    }
    first = false;
    AppendQuoted(name, &out);
    out.push_back(':');
    AppendQuoted(value, &out);
  }
  out.push_back('}');
  return out;
}

absl::StatusOr<ProbeArgs> DecodeArgsJson(absl::string_view json) {
  Parser p(json);
  ProbeArgs args;
  auto bad = [&p] {
    return absl::InvalidArgumentError(absl::StrCat(
        "probe arguments are not a flat JSON object of strings (at byte ", p.pos(), ")"));
  };
  if (!p.Consume('{')) {
    return bad();
  }
  if (!p.Consume('}')) {
    do {
      std::string name;
      std::string value;
      if (!p.String(&name) || !p.Consume(':') || !p.String(&value)) {
        return bad();
      }
      args.emplace_back(std::move(name), std::move(value));
    } while (p.Consume(','));
    if (!p.Consume('}')) {
      return bad();
    }
  }
  if (!p.AtEnd()) {
    return bad();
  }
  return args;
}

}  // namespace kwatch::core::store
