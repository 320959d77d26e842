#include "core/probe/probe_spec.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/base/status_macros.h"
#include "core/probe/x86_regs.h"
#include "core/symbols/symbol_match.h"

namespace kwatch::core::probe {
namespace {

constexpr absl::string_view kTypeList = "u8 u16 u32 u64 s8 s16 s32 s64 x8 x16 x32 x64 string";
constexpr absl::string_view kFetchForms =
    "expected %REG, @ADDR, @SYM, $stackN, $stack, $retval, $comm, $params, $vars, +OFF(ARG) "
    "or a variable name";

bool IsIdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_';
}
bool IsIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}
bool IsIdentifier(absl::string_view s) {
  return !s.empty() && IsIdentStart(s[0]) && std::all_of(s.begin(), s.end(), IsIdentChar);
}

std::string Str(absl::string_view s) {
  return {s.data(), s.size()};
}

// A whole string as a number: decimal, or hexadecimal with 0x.
std::optional<uint64_t> ParseNumber(absl::string_view s) {
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s.remove_prefix(2);
  }
  if (s.empty()) {
    return std::nullopt;
  }
  uint64_t v = 0;
  const auto res = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (res.ec != std::errc() || res.ptr != s.data() + s.size()) {
    return std::nullopt;
  }
  return v;
}

std::string NotANumber(absl::string_view s) {
  return absl::StrCat("'", s, "' is not a number (decimal or 0x hexadecimal)");
}

absl::Status PointError(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad probe point '", text, "': ", why));
}

absl::Status ArgError(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad argument '", text, "': ", why));
}

// The site after FUNC: [@SRC] then one of +OFF, %return, :RELLINE.
absl::Status ParseFunctionSuffix(absl::string_view text, absl::string_view rest,
                                 ProbePoint* point) {
  if (absl::ConsumePrefix(&rest, "@")) {
    const size_t end = rest.find_first_of(":+%");
    point->file = Str(rest.substr(0, end));
    if (point->file.empty()) {
      return PointError(text, "'@' must be followed by a source file name (FUNC@SRC)");
    }
    rest = end == absl::string_view::npos ? absl::string_view() : rest.substr(end);
  }
  if (rest.empty()) {
    return absl::OkStatus();
  }
  const char kind = rest[0];
  rest.remove_prefix(1);
  if (kind == '%') {
    if (rest != "return") {
      return PointError(text, absl::StrCat("unknown suffix '%", rest,
                                           "': the only one is '%return' (a return probe)"));
    }
    point->is_return = true;
    return absl::OkStatus();
  }
  if (kind == '+') {
    const size_t pct = rest.find('%');
    if (pct != absl::string_view::npos) {
      return PointError(text, "a return probe takes no offset: write FUNC%return");
    }
    const std::optional<uint64_t> off = ParseNumber(rest);
    if (!off.has_value()) {
      return PointError(text, NotANumber(rest));
    }
    point->offset = *off;
    return absl::OkStatus();
  }
  // ':'
  const std::optional<uint64_t> line = ParseNumber(rest);
  if (!line.has_value() || *line > 1000000) {
    return PointError(text, absl::StrCat("'", rest,
                                         "' is not a line number (FUNC:RELLINE counts lines "
                                         "from the function's first line, 0 being that line)"));
  }
  point->line = static_cast<int>(*line);
  return absl::OkStatus();
}

// Most +OFF(...) wrappers one argument may nest: the parser recurses once per wrapper, and
// a deeper one (a 20000-level argument fits in one shell word) overflowed the stack.
constexpr size_t kMaxDerefDepth = 64;

// The fetch part of an argument (no NAME=, no :TYPE), inside `depth` +OFF(...) wrappers.
absl::Status ParseFetch(absl::string_view text, absl::string_view body, ProbeArgSpec* arg,
                        size_t depth = 0) {
  if (body.empty()) {
    return ArgError(text, kFetchForms);
  }
  const char c = body[0];
  if (c == '%') {
    const absl::string_view name = body.substr(1);
    const std::optional<X86Register> reg = FindX86Register(name);
    if (!reg.has_value()) {
      std::string why = absl::StrCat("unknown register '", body, "'");
      const std::vector<std::string> near =
          symbols::NearMatches(std::string_view(name.data(), name.size()), X86RegisterNames(), 1);
      if (!near.empty()) {
        absl::StrAppend(&why, "; did you mean '%", near[0], "'?");
      }
      absl::StrAppend(&why, " (x86-64: %ax..%r15 as kprobe names them, %rax..%r15, %eax..%r15d)");
      return ArgError(text, why);
    }
    arg->kind = ProbeArgSpec::Kind::kRegister;
    arg->reg = Str(name);
    return absl::OkStatus();
  }
  if (c == '@') {
    absl::string_view rest = body.substr(1);
    if (rest.empty()) {
      return ArgError(text, "'@' must be followed by an address or a symbol (@0x4010, @g_count)");
    }
    if (std::isdigit(static_cast<unsigned char>(rest[0])) != 0) {
      const std::optional<uint64_t> addr = ParseNumber(rest);
      if (!addr.has_value()) {
        return ArgError(text, NotANumber(rest));
      }
      arg->kind = ProbeArgSpec::Kind::kAddress;
      arg->address = *addr;
      return absl::OkStatus();
    }
    const size_t sign = rest.find_first_of("+-");
    arg->kind = ProbeArgSpec::Kind::kSymbol;
    arg->symbol = Str(rest.substr(0, sign));
    if (arg->symbol.empty()) {
      return ArgError(text, "'@' must be followed by an address or a symbol (@0x4010, @g_count)");
    }
    if (sign != absl::string_view::npos) {
      const absl::string_view num = rest.substr(sign + 1);
      const std::optional<uint64_t> off = ParseNumber(num);
      if (!off.has_value() || *off > static_cast<uint64_t>(INT64_MAX)) {
        return ArgError(text, NotANumber(num));
      }
      arg->symbol_offset =
          rest[sign] == '-' ? -static_cast<int64_t>(*off) : static_cast<int64_t>(*off);
    }
    return absl::OkStatus();
  }
  if (c == '$') {
    if (body == "$retval") {
      arg->kind = ProbeArgSpec::Kind::kRetval;
    } else if (body == "$comm") {
      arg->kind = ProbeArgSpec::Kind::kComm;
    } else if (body == "$params") {
      arg->kind = ProbeArgSpec::Kind::kParams;
    } else if (body == "$vars") {
      arg->kind = ProbeArgSpec::Kind::kVars;
    } else if (body == "$stack") {
      arg->kind = ProbeArgSpec::Kind::kStackPointer;
    } else if (absl::StartsWith(body, "$stack") && body.size() > 6 &&
               std::isdigit(static_cast<unsigned char>(body[6])) != 0) {
      const std::optional<uint64_t> n = ParseNumber(body.substr(6));
      if (!n.has_value() || *n > (1U << 20)) {
        return ArgError(text, absl::StrCat("'", body.substr(6), "' is not a stack slot number"));
      }
      arg->kind = ProbeArgSpec::Kind::kStackSlot;
      arg->stack_index = *n;
    } else {
      return ArgError(text, absl::StrCat("unknown special variable '", body,
                                         "' (special variables: $stackN, $stack, $retval, "
                                         "$comm, $params, $vars)"));
    }
    return absl::OkStatus();
  }
  if (c == '+' || c == '-' || std::isdigit(static_cast<unsigned char>(c)) != 0) {
    const size_t open = body.find('(');
    if (open == absl::string_view::npos || body.back() != ')') {
      return ArgError(text, absl::StrCat("'", body,
                                         "' is not a dereference: write +OFF(ARG), e.g. "
                                         "+8(%di)"));
    }
    const bool negative = c == '-';
    absl::string_view num = body.substr(0, open);
    if (c == '+' || c == '-') {
      num.remove_prefix(1);
    }
    const std::optional<uint64_t> off = ParseNumber(num);
    if (!off.has_value() || *off > static_cast<uint64_t>(INT64_MAX)) {
      return ArgError(text, NotANumber(num));
    }
    if (depth >= kMaxDerefDepth) {
      return ArgError(text,
                      absl::StrCat("more than ", kMaxDerefDepth, " nested dereferences +OFF(...)"));
    }
    const absl::string_view inner = body.substr(open + 1, body.size() - open - 2);
    KW_RETURN_IF_ERROR(ParseFetch(text, inner, arg, depth + 1));
    if (arg->kind == ProbeArgSpec::Kind::kComm || arg->kind == ProbeArgSpec::Kind::kParams ||
        arg->kind == ProbeArgSpec::Kind::kVars) {
      return ArgError(text, absl::StrCat("'", inner, "' cannot be dereferenced"));
    }
    arg->derefs.push_back(negative ? -static_cast<int64_t>(*off) : static_cast<int64_t>(*off));
    return absl::OkStatus();
  }
  if (IsIdentStart(c)) {
    absl::StatusOr<symbols::Expr> expr =
        symbols::ParseExpr(std::string_view(body.data(), body.size()));
    if (!expr.ok()) {
      return ArgError(text, expr.status().message());
    }
    if (expr->address_of || expr->address.has_value()) {
      return ArgError(text, kFetchForms);
    }
    arg->kind = ProbeArgSpec::Kind::kVariable;
    arg->variable = *std::move(expr);
    return absl::OkStatus();
  }
  return ArgError(text, absl::StrCat("'", body, "': ", kFetchForms));
}

}  // namespace

std::string ArgType::Name() const {
  switch (kind) {
    case Kind::kUnsigned:
      return absl::StrCat("u", bits);
    case Kind::kSigned:
      return absl::StrCat("s", bits);
    case Kind::kHex:
      return absl::StrCat("x", bits);
    case Kind::kString:
      return "string";
    case Kind::kFloat:
      return absl::StrCat("f", bits);
  }
  return "?";
}

absl::StatusOr<ArgType> ParseArgType(absl::string_view text) {
  if (text == "string" || text == "ustring") {
    return ArgType{ArgType::Kind::kString, 0};
  }
  if (text.size() >= 2) {
    ArgType t;
    bool known = true;
    switch (text[0]) {
      case 'u':
        t.kind = ArgType::Kind::kUnsigned;
        break;
      case 's':
        t.kind = ArgType::Kind::kSigned;
        break;
      case 'x':
        t.kind = ArgType::Kind::kHex;
        break;
      default:
        known = false;
    }
    const absl::string_view bits = text.substr(1);
    if (known && (bits == "8" || bits == "16" || bits == "32" || bits == "64")) {
      t.bits = static_cast<uint8_t>(ParseNumber(bits).value_or(64));
      return t;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown type '", text, "' (types: ", kTypeList, ")"));
}

absl::StatusOr<ProbePoint> ParseProbePoint(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  ProbePoint point;
  point.text = Str(text);
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "empty probe point: give FUNC, FUNC+OFF, FUNC%return, FUNC:RELLINE, SRC:LINE or 0xADDR");
  }
  absl::string_view body = text;
  if (const size_t special = text.find_first_of(";=@+%");
      special != absl::string_view::npos && text[special] == '=') {
    absl::string_view head = text.substr(0, special);
    body = text.substr(special + 1);
    if (const size_t colon = head.find(':'); colon != absl::string_view::npos) {
      point.group = Str(head.substr(0, colon));
      head = head.substr(colon + 1);
      if (!IsIdentifier(point.group)) {
        return PointError(text, absl::StrCat("'", point.group,
                                             "' is not a valid group name (letters, digits, "
                                             "'_', not starting with a digit)"));
      }
    }
    point.event = Str(head);
    if (!IsIdentifier(point.event)) {
      return PointError(text, absl::StrCat("'", point.event,
                                           "' is not a valid event name (letters, digits, '_', "
                                           "not starting with a digit)"));
    }
    if (body.empty()) {
      return PointError(text, "nothing after 'EVENT=': give the probe site");
    }
  }
  if (absl::StartsWithIgnoreCase(body, "0x")) {
    const std::optional<uint64_t> addr = ParseNumber(body);
    if (!addr.has_value()) {
      return PointError(text, NotANumber(body));
    }
    point.kind = ProbePoint::Kind::kAddress;
    point.address = *addr;
    return point;
  }
  if (const size_t semi = body.find(';'); semi != absl::string_view::npos) {
    point.pattern = Str(absl::StripAsciiWhitespace(body.substr(semi + 1)));
    body = body.substr(0, semi);
    if (point.pattern.empty()) {
      return PointError(text, "empty pattern after ';'");
    }
  }
  const size_t end = body.find_first_of("@:+%");
  const absl::string_view name = body.substr(0, end);
  const absl::string_view rest =
      end == absl::string_view::npos ? absl::string_view() : body.substr(end);
  if (name.empty()) {
    return PointError(text, "missing the function or source file name");
  }
  if (absl::StrContains(name, '.')) {
    point.kind = ProbePoint::Kind::kSourceLine;
    point.file = Str(name);
    if (rest.empty()) {
      if (point.pattern.empty()) {
        return PointError(text, absl::StrCat("'", name, "' is a source file: give a line ('", name,
                                             ":42') or a pattern ('", name, ";count++')"));
      }
      return point;
    }
    if (rest[0] != ':') {
      return PointError(
          text, absl::StrCat("a source file takes ':LINE' or ';PATTERN', not '", rest, "'"));
    }
    if (!point.pattern.empty()) {
      return PointError(text, "give either ':LINE' or ';PATTERN', not both");
    }
    const std::optional<uint64_t> line = ParseNumber(rest.substr(1));
    if (!line.has_value() || *line == 0 || *line > 100000000) {
      return PointError(
          text, absl::StrCat("'", rest.substr(1), "' is not a line number (lines start at 1)"));
    }
    point.line = static_cast<int>(*line);
    return point;
  }
  for (const char c : name) {
    if (!IsIdentChar(c)) {
      return PointError(text, absl::StrCat("'", name,
                                           "' is not a function name (letters, digits, '_'; a "
                                           "source file name has a '.')"));
    }
  }
  point.kind = ProbePoint::Kind::kFunction;
  point.function = Str(name);
  KW_RETURN_IF_ERROR(ParseFunctionSuffix(text, rest, &point));
  if (!point.pattern.empty() && (point.is_return || point.offset != 0 || point.line.has_value())) {
    return PointError(text, "';PATTERN' cannot be combined with '+OFF', '%return' or ':LINE'");
  }
  return point;
}

absl::StatusOr<ProbeArgSpec> ParseProbeArg(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  ProbeArgSpec arg;
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("empty argument: ", kFetchForms));
  }
  absl::string_view body = text;
  // NAME= (the fetch part never contains '=').
  if (const size_t eq = body.find('='); eq != absl::string_view::npos) {
    const absl::string_view name = body.substr(0, eq);
    if (!IsIdentifier(name)) {
      return ArgError(text, absl::StrCat("'", name,
                                         "' is not a valid argument name (letters, digits, '_', "
                                         "not starting with a digit)"));
    }
    arg.name = Str(name);
    body = body.substr(eq + 1);
  }
  // :TYPE is after the last single ':' ("a::b" is a C++ name).
  for (size_t i = body.size(); i-- > 0;) {
    if (body[i] != ':') {
      continue;
    }
    if ((i > 0 && body[i - 1] == ':') || (i + 1 < body.size() && body[i + 1] == ':')) {
      break;
    }
    absl::StatusOr<ArgType> type = ParseArgType(body.substr(i + 1));
    if (!type.ok()) {
      return ArgError(text, type.status().message());
    }
    arg.type = *type;
    body = body.substr(0, i);
    break;
  }
  arg.text = Str(body);
  KW_RETURN_IF_ERROR(ParseFetch(text, body, &arg));
  if (arg.type.has_value()) {
    if (arg.kind == ProbeArgSpec::Kind::kParams || arg.kind == ProbeArgSpec::Kind::kVars) {
      return ArgError(text, absl::StrCat("'", body, "' takes no type: each variable has its own"));
    }
    if (arg.kind == ProbeArgSpec::Kind::kComm && arg.type->kind != ArgType::Kind::kString) {
      return ArgError(text, "$comm is a string: it takes no other type");
    }
  }
  if (!arg.name.empty() &&
      (arg.kind == ProbeArgSpec::Kind::kParams || arg.kind == ProbeArgSpec::Kind::kVars)) {
    return ArgError(text,
                    absl::StrCat("'", body, "' stands for several arguments: it takes no name"));
  }
  return arg;
}

absl::StatusOr<ProbeSpec> ParseProbeSpec(absl::string_view text) {
  const std::vector<absl::string_view> words =
      absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  if (words.empty()) {
    return absl::InvalidArgumentError(
        "empty probe: give a probe point (FUNC, FUNC+OFF, FUNC%return, SRC:LINE, 0xADDR) and "
        "optional arguments");
  }
  ProbeSpec spec;
  KW_ASSIGN_OR_RETURN(spec.point, ParseProbePoint(words[0]));
  for (size_t i = 1; i < words.size(); ++i) {
    KW_ASSIGN_OR_RETURN(ProbeArgSpec arg, ParseProbeArg(words[i]));
    spec.args.push_back(std::move(arg));
  }
  return spec;
}

}  // namespace kwatch::core::probe
