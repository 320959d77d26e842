#include "watch/condition.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "agent/int_ops.h"
#include "core/base/status_macros.h"

namespace kwatch::watch {
namespace {

using Op = Condition::Op;
using Insn = Condition::Insn;

// Parentheses and unary operators nest at most this deep (the parser recurses on them).
constexpr int kMaxNesting = 200;

// The integer semantics the agent's filter programs share (agent/int_ops.h).
using agent::int_ops::DivSigned;
using agent::int_ops::LessSigned;
using agent::int_ops::ModSigned;
using agent::int_ops::Negate;
using agent::int_ops::Shl;
using agent::int_ops::ShrS;
using agent::int_ops::ShrU;

// Applies a binary operator; false for a division by zero.
inline bool ApplyBinary(Op op, uint64_t a, uint64_t b, uint64_t* out) {
  switch (op) {
    case Op::kMul:
      *out = a * b;
      return true;
    case Op::kDivU:
      if (b == 0) {
        return false;
      }
      *out = a / b;
      return true;
    case Op::kDivS:
      if (b == 0) {
        return false;
      }
      *out = DivSigned(a, b);
      return true;
    case Op::kModU:
      if (b == 0) {
        return false;
      }
      *out = a % b;
      return true;
    case Op::kModS:
      if (b == 0) {
        return false;
      }
      *out = ModSigned(a, b);
      return true;
    case Op::kAdd:
      *out = a + b;
      return true;
    case Op::kSub:
      *out = a - b;
      return true;
    case Op::kShl:
      *out = Shl(a, b);
      return true;
    case Op::kShrU:
      *out = ShrU(a, b);
      return true;
    case Op::kShrS:
      *out = ShrS(a, b);
      return true;
    case Op::kLtU:
      *out = static_cast<uint64_t>(a < b);
      return true;
    case Op::kLtS:
      *out = static_cast<uint64_t>(LessSigned(a, b));
      return true;
    case Op::kLeU:
      *out = static_cast<uint64_t>(a <= b);
      return true;
    case Op::kLeS:
      *out = static_cast<uint64_t>(!LessSigned(b, a));
      return true;
    case Op::kGtU:
      *out = static_cast<uint64_t>(a > b);
      return true;
    case Op::kGtS:
      *out = static_cast<uint64_t>(LessSigned(b, a));
      return true;
    case Op::kGeU:
      *out = static_cast<uint64_t>(a >= b);
      return true;
    case Op::kGeS:
      *out = static_cast<uint64_t>(!LessSigned(a, b));
      return true;
    case Op::kEq:
      *out = static_cast<uint64_t>(a == b);
      return true;
    case Op::kNe:
      *out = static_cast<uint64_t>(a != b);
      return true;
    case Op::kAnd:
      *out = a & b;
      return true;
    case Op::kXor:
      *out = a ^ b;
      return true;
    case Op::kOr:
      *out = a | b;
      return true;
    default:
      KW_CHECK(false && "not a binary operator");
  }
  return false;
}

inline uint64_t ApplyUnary(Op op, uint64_t a) {
  switch (op) {
    case Op::kNeg:
      return Negate(a);
    case Op::kNot:
      return static_cast<uint64_t>(a == 0);
    case Op::kBitNot:
      return ~a;
    default:
      KW_CHECK(false && "not a unary operator");
  }
  return 0;
}

const char* OpName(Op op) {
  static constexpr std::array<const char*, 40> kNames = {
      "const",  "new", "old",  "tid",  "pid",  "cpu",  "len",  "addr", "neg",   "not",
      "bitnot", "mul", "divu", "divs", "modu", "mods", "add",  "sub",  "shl",   "shru",
      "shrs",   "ltu", "lts",  "leu",  "les",  "gtu",  "gts",  "geu",  "ges",   "eq",
      "ne",     "and", "xor",  "or",   "jz",   "jnz",  "bool", "var",  "streq", "strne"};
  const auto i = static_cast<size_t>(op);
  return i < kNames.size() ? kNames[i] : "?";
}

enum class Tok : uint8_t { kEnd, kNumber, kName, kPunct, kString };

struct Token {
  Tok kind = Tok::kEnd;
  size_t pos = 0;          // byte offset in the text
  absl::string_view text;  // the token's spelling
  uint64_t value = 0;      // kNumber
  std::string str;         // kString: the literal's bytes, escapes decoded
};

struct BinaryOp {
  absl::string_view spelling;
  int precedence = 0;  // higher binds tighter
  Op unsigned_op = Op::kAdd;
  Op signed_op = Op::kAdd;
};

// C's binary operators, from the loosest; && and || are compiled as jumps.
constexpr std::array<BinaryOp, 18> kBinaryOps = {{
    {"||", 1, Op::kJumpIfNonZero, Op::kJumpIfNonZero},
    {"&&", 2, Op::kJumpIfZero, Op::kJumpIfZero},
    {"|", 3, Op::kOr, Op::kOr},
    {"^", 4, Op::kXor, Op::kXor},
    {"&", 5, Op::kAnd, Op::kAnd},
    {"==", 6, Op::kEq, Op::kEq},
    {"!=", 6, Op::kNe, Op::kNe},
    {"<", 7, Op::kLtU, Op::kLtS},
    {"<=", 7, Op::kLeU, Op::kLeS},
    {">", 7, Op::kGtU, Op::kGtS},
    {">=", 7, Op::kGeU, Op::kGeS},
    {"<<", 8, Op::kShl, Op::kShl},
    {">>", 8, Op::kShrU, Op::kShrS},
    {"+", 9, Op::kAdd, Op::kAdd},
    {"-", 9, Op::kSub, Op::kSub},
    {"*", 10, Op::kMul, Op::kMul},
    {"/", 10, Op::kDivU, Op::kDivS},
    {"%", 10, Op::kModU, Op::kModS},
}};

struct Name {
  absl::string_view spelling;
  Op op = Op::kNew;
};
constexpr std::array<Name, 7> kNames = {{{"new", Op::kNew},
                                         {"old", Op::kOld},
                                         {"tid", Op::kTid},
                                         {"pid", Op::kPid},
                                         {"cpu", Op::kCpu},
                                         {"len", Op::kLen},
                                         {"addr", Op::kAddr}}};
// The built-in names a probe condition keeps.
bool IsProbeBuiltin(Op op) {
  return op == Op::kTid || op == Op::kPid || op == Op::kCpu;
}

bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) {
  return IsNameStart(c) || IsDigit(c);
}
int HexDigit(char c) {
  if (IsDigit(c)) {
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

// Recursive-descent parser (precedence climbing) that emits bytecode as it goes.
class Compiler {
 public:
  Compiler(absl::string_view text, bool signed_values, const ConditionOptions& opts)
      : text_(text), signed_(signed_values), opts_(opts), used_(opts.variables.size(), false) {}

  absl::Status Run() {
    KW_RETURN_IF_ERROR(Advance());
    KW_RETURN_IF_ERROR(Expression(0, 0));
    if (tok_.kind != Tok::kEnd) {
      return Error(tok_.pos, absl::StrCat("expected an operator before '", tok_.text, "'"));
    }
    return absl::OkStatus();
  }

  std::vector<Insn> TakeCode() { return std::move(code_); }
  bool UsesNew() const { return uses_new_; }
  bool UsesOld() const { return uses_old_; }
  const std::vector<bool>& Used() const { return used_; }
  std::vector<std::pair<size_t, std::string>> TakeStringTests() { return std::move(string_tests_); }
  // Reads the next token into tok_ (public for NamesIn).
  absl::Status Next() { return Advance(); }
  const Token& Current() const { return tok_; }

 private:
  absl::Status Error(size_t pos, absl::string_view what) const {
    const bool in_context = !opts_.context.empty();
    const absl::string_view shown = in_context ? absl::string_view(opts_.context) : text_;
    const size_t at = (in_context ? opts_.context_offset : 0) + pos;
    std::string caret;
    for (size_t i = 0; i < at && i < shown.size(); ++i) {
      caret.push_back(shown[i] == '\t' ? '\t' : ' ');
    }
    return absl::InvalidArgumentError(absl::StrCat(in_context ? "probe '" : "--if '", shown,
                                                   "': ", what, " at column ", at + 1, "\n  ",
                                                   shown, "\n  ", caret, "^"));
  }

  // Reads the next token into tok_.
  absl::Status Advance() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
    tok_ = Token{};
    tok_.pos = pos_;
    if (pos_ == text_.size()) {
      tok_.kind = Tok::kEnd;
      return absl::OkStatus();
    }
    const char c = text_[pos_];
    if (IsDigit(c)) {
      return Number();
    }
    if (c == '"' && !opts_.access_names) {
      return StringLiteral();
    }
    if (IsNameStart(c) || (c == '$' && !opts_.access_names)) {
      size_t end = pos_ + 1;
      while (end < text_.size() && IsNameChar(text_[end])) {
        ++end;
      }
      if (!opts_.access_names) {
        end = PathEnd(end);
      }
      tok_.kind = Tok::kName;
      tok_.text = text_.substr(pos_, end - pos_);
      pos_ = end;
      return absl::OkStatus();
    }
    static constexpr std::array<absl::string_view, 8> kTwo = {
        "<<", ">>", "<=", ">=", "==", "!=", "&&", "||"};
    for (absl::string_view two : kTwo) {
      if (text_.substr(pos_, 2) == two) {
        tok_.kind = Tok::kPunct;
        tok_.text = two;
        pos_ += 2;
        return absl::OkStatus();
      }
    }
    static constexpr absl::string_view kOne = "*/%+-&^|<>!~()";
    if (absl::StrContains(kOne, c)) {
      tok_.kind = Tok::kPunct;
      tok_.text = text_.substr(pos_, 1);
      ++pos_;
      return absl::OkStatus();
    }
    if (c == '=') {
      return Error(pos_, "'=' is not a comparison (use '==')");
    }
    if (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f) {
      return Error(pos_, absl::StrCat("unexpected character '", absl::string_view(&c, 1), "'"));
    }
    return Error(pos_, absl::StrCat("unexpected byte 0x",
                                    absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2)));
  }

  // The end of a path in perf's argument syntax that starts with a name ending at `end`:
  // members (->f, .f) and subscripts ([N]) follow.
  size_t PathEnd(size_t end) const {
    for (;;) {
      size_t next = end;
      if (text_.substr(next, 2) == "->") {
        next += 2;
      } else if (next < text_.size() && text_[next] == '.') {
        next += 1;
      } else if (next < text_.size() && text_[next] == '[') {
        size_t close = next + 1;
        while (close < text_.size() && IsDigit(text_[close])) {
          ++close;
        }
        if (close == next + 1 || close >= text_.size() || text_[close] != ']') {
          return end;
        }
        end = close + 1;
        continue;
      } else {
        return end;
      }
      if (next >= text_.size() || !IsNameStart(text_[next])) {
        return end;
      }
      while (next < text_.size() && IsNameChar(text_[next])) {
        ++next;
      }
      end = next;
    }
  }

  // A "..." literal: \" \\ \n \t and \xNN escapes.
  absl::Status StringLiteral() {
    const size_t start = pos_;
    std::string bytes;
    size_t i = pos_ + 1;
    for (; i < text_.size() && text_[i] != '"'; ++i) {
      if (text_[i] != '\\') {
        bytes.push_back(text_[i]);
        continue;
      }
      if (++i == text_.size()) {
        break;
      }
      switch (text_[i]) {
        case 'n':
          bytes.push_back('\n');
          break;
        case 't':
          bytes.push_back('\t');
          break;
        case 'x': {
          const int hi = i + 1 < text_.size() ? HexDigit(text_[i + 1]) : -1;
          const int lo = i + 2 < text_.size() ? HexDigit(text_[i + 2]) : -1;
          if (hi < 0 || lo < 0) {
            return Error(i - 1, "\\x needs two hexadecimal digits");
          }
          bytes.push_back(static_cast<char>((hi << 4) | lo));
          i += 2;
          break;
        }
        default:
          bytes.push_back(text_[i]);
      }
    }
    if (i >= text_.size()) {
      return Error(start, "string literal without its closing '\"'");
    }
    pos_ = i + 1;
    tok_.kind = Tok::kString;
    tok_.text = text_.substr(start, pos_ - start);
    tok_.str = std::move(bytes);
    return absl::OkStatus();
  }

  absl::Status Number() {
    const size_t start = pos_;
    uint64_t value = 0;
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    if (text_.substr(pos_, 2) == "0x" || text_.substr(pos_, 2) == "0X") {
      pos_ += 2;
      const size_t digits = pos_;
      for (; pos_ < text_.size() && HexDigit(text_[pos_]) >= 0; ++pos_) {
        if (value > (kMax >> 4)) {
          return Error(start, "integer literal does not fit in 64 bits");
        }
        value = (value << 4) | static_cast<uint64_t>(HexDigit(text_[pos_]));
      }
      if (pos_ == digits) {
        return Error(start, "hexadecimal literal without digits");
      }
    } else {
      if (text_[pos_] == '0' && pos_ + 1 < text_.size() && IsDigit(text_[pos_ + 1])) {
        return Error(start, "octal literals are not supported (write 0x... or decimal)");
      }
      for (; pos_ < text_.size() && IsDigit(text_[pos_]); ++pos_) {
        const auto d = static_cast<uint64_t>(text_[pos_] - '0');
        if (value > (kMax - d) / 10) {
          return Error(start, "integer literal does not fit in 64 bits");
        }
        value = value * 10 + d;
      }
    }
    if (pos_ < text_.size() && IsNameChar(text_[pos_])) {
      return Error(pos_, "invalid character in integer literal");
    }
    tok_.kind = Tok::kNumber;
    tok_.text = text_.substr(start, pos_ - start);
    tok_.value = value;
    return absl::OkStatus();
  }

  bool IsPunct(absl::string_view p) const { return tok_.kind == Tok::kPunct && tok_.text == p; }

  const BinaryOp* CurrentBinary() const {
    if (tok_.kind != Tok::kPunct) {
      return nullptr;
    }
    for (const BinaryOp& b : kBinaryOps) {
      if (b.spelling == tok_.text) {
        return &b;
      }
    }
    return nullptr;
  }

  absl::Status Emit(Op op, uint64_t arg, size_t pos) {
    code_.push_back(Insn{op, arg});
    depth_ += 1;
    if (depth_ > Condition::kMaxStack) {
      return Error(pos, absl::StrCat("condition too complex (more than ", Condition::kMaxStack,
                                     " pending values)"));
    }
    return absl::OkStatus();
  }

  void EmitUnary(Op op) {
    if (!code_.empty() && code_.back().op == Op::kConst) {
      // Constant folding. A jump landing on that constant pushes the folded value instead,
      // which is what it would have computed.
      code_.back().arg = ApplyUnary(op, code_.back().arg);
      return;
    }
    code_.push_back(Insn{op, 0});
  }

  void EmitBinary(Op op) {
    const size_t n = code_.size();
    uint64_t folded = 0;
    if (n >= 2 && code_[n - 1].op == Op::kConst && code_[n - 2].op == Op::kConst &&
        ApplyBinary(op, code_[n - 2].arg, code_[n - 1].arg, &folded)) {
      // Constant folding (a division by zero is left to run time, where it is counted).
      // No jump lands on n-1 (jumps land after a kToBool); one landing on n-2 now pushes the
      // folded value, which is what it would have computed.
      code_.pop_back();
      code_.back().arg = folded;
    } else {
      code_.push_back(Insn{op, 0});
    }
    depth_ -= 1;
  }

  absl::Status Expression(int min_precedence, int nesting) {
    KW_RETURN_IF_ERROR(Unary(nesting));
    for (const BinaryOp* b = CurrentBinary(); b != nullptr && b->precedence >= min_precedence;
         b = CurrentBinary()) {
      const BinaryOp op = *b;
      KW_RETURN_IF_ERROR(Advance());
      if (op.unsigned_op == Op::kJumpIfZero || op.unsigned_op == Op::kJumpIfNonZero) {
        const size_t jump = code_.size();
        code_.push_back(Insn{op.unsigned_op, 0});
        depth_ -= 1;  // falls through with the left operand popped
        KW_RETURN_IF_ERROR(Expression(op.precedence + 1, nesting));
        code_.push_back(Insn{Op::kToBool, 0});
        code_[jump].arg = code_.size();
        continue;
      }
      KW_RETURN_IF_ERROR(Expression(op.precedence + 1, nesting));
      EmitBinary(signed_ ? op.signed_op : op.unsigned_op);
    }
    return absl::OkStatus();
  }

  absl::Status Unary(int nesting) {
    if (nesting > kMaxNesting) {
      return Error(tok_.pos, absl::StrCat("nested more than ", kMaxNesting, " levels deep"));
    }
    const size_t pos = tok_.pos;
    switch (tok_.kind) {
      case Tok::kNumber: {
        const uint64_t value = tok_.value;
        KW_RETURN_IF_ERROR(Emit(Op::kConst, value, pos));
        return Advance();
      }
      case Tok::kName: {
        for (size_t i = 0; i < opts_.variables.size(); ++i) {
          const ConditionVariable& v = opts_.variables[i];
          if (v.name != tok_.text && (v.alias.empty() || v.alias != tok_.text)) {
            continue;
          }
          used_[i] = true;
          if (opts_.variables[i].kind == ConditionVariable::Kind::kString) {
            return StringTest(i, pos);
          }
          KW_RETURN_IF_ERROR(Emit(Op::kVar, i, pos));
          return Advance();
        }
        std::string known;
        for (const Name& n : kNames) {
          if (!opts_.access_names && !IsProbeBuiltin(n.op)) {
            continue;
          }
          absl::StrAppend(&known, known.empty() ? "" : ", ", n.spelling);
          if (n.spelling == tok_.text) {
            uses_new_ |= n.op == Op::kNew;
            uses_old_ |= n.op == Op::kOld;
            KW_RETURN_IF_ERROR(Emit(n.op, 0, pos));
            return Advance();
          }
        }
        for (const ConditionVariable& v : opts_.variables) {
          absl::StrAppend(&known, ", ", v.name);
        }
        return Error(pos, absl::StrCat("unknown name '", tok_.text, "' (known: ", known, ")"));
      }
      case Tok::kString: {
        // "text" == NAME
        const size_t literal_pos = pos;
        std::string literal = tok_.str;
        KW_RETURN_IF_ERROR(Advance());
        const bool eq = IsPunct("==");
        if (!eq && !IsPunct("!=")) {
          return Error(tok_.pos, "a string literal is only compared with == or != to a string");
        }
        KW_RETURN_IF_ERROR(Advance());
        for (size_t i = 0; tok_.kind == Tok::kName && i < opts_.variables.size(); ++i) {
          const ConditionVariable& v = opts_.variables[i];
          if ((v.name == tok_.text || (!v.alias.empty() && v.alias == tok_.text)) &&
              v.kind == ConditionVariable::Kind::kString) {
            used_[i] = true;
            string_tests_.emplace_back(i, std::move(literal));
            KW_RETURN_IF_ERROR(
                Emit(eq ? Op::kStrEq : Op::kStrNe, string_tests_.size() - 1, literal_pos));
            return Advance();
          }
        }
        return Error(tok_.pos, "expected a string name (e.g. comm) to compare the literal with");
      }
      case Tok::kPunct:
        if (IsPunct("(")) {
          KW_RETURN_IF_ERROR(Advance());
          KW_RETURN_IF_ERROR(Expression(0, nesting + 1));
          if (!IsPunct(")")) {
            return Error(tok_.pos,
                         absl::StrCat("expected ')' to match the '(' of column ", pos + 1));
          }
          return Advance();
        }
        if (IsPunct("-") || IsPunct("!") || IsPunct("~") || IsPunct("+")) {
          const char c = tok_.text[0];
          KW_RETURN_IF_ERROR(Advance());
          KW_RETURN_IF_ERROR(Unary(nesting + 1));
          if (c != '+') {
            EmitUnary(c == '-' ? Op::kNeg : c == '!' ? Op::kNot : Op::kBitNot);
          }
          return absl::OkStatus();
        }
        return Error(pos, absl::StrCat("expected an operand before '", tok_.text, "'"));
      case Tok::kEnd:
        break;
    }
    return Error(pos, "expected an operand");
  }

  // NAME == "text" or NAME != "text", NAME the string variable `index` (tok_ is NAME).
  absl::Status StringTest(size_t index, size_t pos) {
    const std::string name(tok_.text);
    KW_RETURN_IF_ERROR(Advance());
    const bool eq = IsPunct("==");
    if (!eq && !IsPunct("!=")) {
      return Error(pos, absl::StrCat("'", name,
                                     "' is a string: compare it with == or != to a "
                                     "\"literal\""));
    }
    KW_RETURN_IF_ERROR(Advance());
    if (tok_.kind != Tok::kString) {
      return Error(tok_.pos, absl::StrCat("expected a \"literal\" to compare '", name, "' with"));
    }
    string_tests_.emplace_back(index, tok_.str);
    KW_RETURN_IF_ERROR(Emit(eq ? Op::kStrEq : Op::kStrNe, string_tests_.size() - 1, pos));
    return Advance();
  }

  absl::string_view text_;
  bool signed_;
  const ConditionOptions& opts_;
  size_t pos_ = 0;
  Token tok_;
  std::vector<Insn> code_;
  size_t depth_ = 0;
  bool uses_new_ = false;
  bool uses_old_ = false;
  std::vector<bool> used_;
  std::vector<std::pair<size_t, std::string>> string_tests_;
};

// The accessed bytes as the condition sees them: `width` bytes (1..8; 0 means 8),
// zero- or sign-extended.
inline uint64_t Extend(uint64_t raw, uint32_t width, bool is_signed) {
  if (width == 0 || width >= 8) {
    return raw;
  }
  const unsigned bits = width * 8;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  raw &= mask;
  if (is_signed && (raw >> (bits - 1)) != 0) {
    raw |= ~mask;
  }
  return raw;
}

}  // namespace

absl::StatusOr<Condition> Condition::Parse(std::string_view text, const ConditionOptions& opts) {
  const absl::string_view view(text.data(), text.size());
  bool is_signed = opts.signed_values;
  if (!opts.access_names) {
    // As C: signed unless an unsigned value takes part (decided by a first pass).
    Compiler first(view, /*signed_values=*/true, opts);
    KW_RETURN_IF_ERROR(first.Run());
    is_signed = true;
    for (size_t i = 0; i < opts.variables.size(); ++i) {
      if (first.Used()[i] && opts.variables[i].kind == ConditionVariable::Kind::kUnsigned) {
        is_signed = false;
      }
    }
  }
  Compiler compiler(view, is_signed, opts);
  KW_RETURN_IF_ERROR(compiler.Run());
  Condition c;
  c.text_ = std::string(text);
  c.opts_ = opts;
  c.opts_.signed_values = is_signed;
  c.code_ = compiler.TakeCode();
  c.uses_new_ = compiler.UsesNew();
  c.uses_old_ = compiler.UsesOld();
  c.used_variables_ = compiler.Used();
  for (auto& [variable, literal] : compiler.TakeStringTests()) {
    c.string_tests_.push_back(StringTest{variable, std::move(literal)});
  }
  return c;
}

std::vector<std::string> Condition::NamesIn(std::string_view text) {
  ConditionOptions opts;
  opts.access_names = false;
  Compiler lexer(absl::string_view(text.data(), text.size()), true, opts);
  std::vector<std::string> names;
  for (absl::Status s = lexer.Next(); s.ok() && lexer.Current().kind != Tok::kEnd;
       s = lexer.Next()) {
    if (lexer.Current().kind != Tok::kName) {
      continue;
    }
    std::string name(lexer.Current().text);
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  }
  return names;
}

bool Condition::uses_variable(size_t index) const {
  return index < used_variables_.size() && used_variables_[index];
}

// Every value a condition's bytecode may push.
struct Condition::Inputs {
  uint64_t new_value = 0;
  uint64_t old_value = 0;
  uint64_t tid = 0;
  uint64_t pid = 0;
  uint64_t cpu = 0;
  uint64_t len = 0;
  uint64_t addr = 0;
  std::span<const std::optional<uint64_t>> numbers;
  std::span<const std::optional<std::string_view>> strings;
};

bool Condition::Matches(const core::AccessEvent& event) {
  ++stats_.evaluated;
  const uint32_t width = event.access_size != 0 ? event.access_size : event.len;
  Inputs in;
  if (opts_.bitfield.has_value() && (uses_new_ || uses_old_)) {
    const EventValues v = ValuesOf(opts_.bitfield, event);
    if (uses_new_ && (!v.decoded || !v.value.has_value())) {
      ++stats_.missing_new;
      return false;
    }
    if (uses_old_ && (!v.decoded || !v.old_value.has_value())) {
      ++stats_.missing_old;
      return false;
    }
    in.new_value = v.value.value_or(0);
    in.old_value = v.old_value.value_or(0);
  } else {
    if (uses_new_ && !event.value.has_value()) {
      ++stats_.missing_new;
      return false;
    }
    if (uses_old_ && !event.old_value.has_value()) {
      ++stats_.missing_old;
      return false;
    }
    in.new_value = uses_new_ ? Extend(*event.value, width, opts_.signed_values) : 0;
    in.old_value = uses_old_ ? Extend(*event.old_value, width, opts_.signed_values) : 0;
  }
  in.tid = static_cast<uint64_t>(static_cast<int64_t>(event.tid));
  in.pid = static_cast<uint64_t>(static_cast<int64_t>(event.pid));
  in.cpu = event.cpu;
  in.len = width;
  in.addr = event.access_addr.value;
  return Run(in);
}

bool Condition::Matches(const ConditionInputs& inputs) {
  ++stats_.evaluated;
  Inputs in;
  in.tid = static_cast<uint64_t>(inputs.tid);
  in.pid = static_cast<uint64_t>(inputs.pid);
  in.cpu = inputs.cpu;
  in.numbers = inputs.numbers;
  in.strings = inputs.strings;
  return Run(in);
}

bool Condition::Run(const Inputs& in) {
  std::array<uint64_t, kMaxStack> stack;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  size_t sp = 0;                          // next free slot
  const Insn* code = code_.data();
  const size_t n = code_.size();
  for (size_t pc = 0; pc < n; ++pc) {
    const Insn& ins = code[pc];
    switch (ins.op) {
      case Op::kConst:
        stack[sp++] = ins.arg;
        break;
      case Op::kNew:
        stack[sp++] = in.new_value;
        break;
      case Op::kOld:
        stack[sp++] = in.old_value;
        break;
      case Op::kTid:
        stack[sp++] = in.tid;
        break;
      case Op::kPid:
        stack[sp++] = in.pid;
        break;
      case Op::kCpu:
        stack[sp++] = in.cpu;
        break;
      case Op::kLen:
        stack[sp++] = in.len;
        break;
      case Op::kAddr:
        stack[sp++] = in.addr;
        break;
      case Op::kVar:
        if (ins.arg >= in.numbers.size() || !in.numbers[ins.arg].has_value()) {
          ++stats_.missing_value;
          return false;
        }
        stack[sp++] = *in.numbers[ins.arg];
        break;
      case Op::kStrEq:
      case Op::kStrNe: {
        const StringTest& t = string_tests_[ins.arg];
        if (t.variable >= in.strings.size() || !in.strings[t.variable].has_value()) {
          ++stats_.missing_value;
          return false;
        }
        const bool equal = *in.strings[t.variable] == t.literal;
        stack[sp++] = static_cast<uint64_t>(ins.op == Op::kStrEq ? equal : !equal);
        break;
      }
      case Op::kNeg:
      case Op::kNot:
      case Op::kBitNot:
        stack[sp - 1] = ApplyUnary(ins.op, stack[sp - 1]);
        break;
      case Op::kJumpIfZero:
        if (stack[sp - 1] == 0) {
          pc = ins.arg - 1;
        } else {
          --sp;
        }
        break;
      case Op::kJumpIfNonZero:
        if (stack[sp - 1] != 0) {
          stack[sp - 1] = 1;
          pc = ins.arg - 1;
        } else {
          --sp;
        }
        break;
      case Op::kToBool:
        stack[sp - 1] = static_cast<uint64_t>(stack[sp - 1] != 0);
        break;
      default:
        --sp;
        if (!ApplyBinary(ins.op, stack[sp - 1], stack[sp], &stack[sp - 1])) {
          ++stats_.division_by_zero;
          return false;
        }
        break;
    }
  }
  KW_CHECK(sp == 1);
  const bool matched = stack[0] != 0;
  stats_.matched += static_cast<uint64_t>(matched);
  return matched;
}

std::string Condition::Disassemble() const {
  std::string out;
  for (size_t i = 0; i < code_.size(); ++i) {
    const Insn& in = code_[i];
    absl::StrAppend(&out, i, ": ", OpName(in.op));
    if (in.op == Op::kConst) {
      absl::StrAppend(&out, " 0x", absl::Hex(in.arg));
    } else if (in.op == Op::kVar) {
      absl::StrAppend(&out, " ", opts_.variables[in.arg].name);
    } else if (in.op == Op::kStrEq || in.op == Op::kStrNe) {
      absl::StrAppend(&out, " ", opts_.variables[string_tests_[in.arg].variable].name, " \"",
                      absl::CEscape(string_tests_[in.arg].literal), "\"");
    } else if (in.op == Op::kJumpIfZero || in.op == Op::kJumpIfNonZero) {
      absl::StrAppend(&out, " ", in.arg);
    }
    out.push_back('\n');
  }
  return out;
}

std::string_view UnqualifiedType(std::string_view type_name) {
  std::string_view t = type_name;
  for (bool again = true; again;) {
    again = false;
    for (std::string_view q : {"volatile ", "const "}) {
      if (t.substr(0, q.size()) == q) {
        t.remove_prefix(q.size());
        again = true;
      }
    }
    // A pointer's own qualifiers follow its '*': "struct handle *volatile", "char * const".
    for (std::string_view q : {"volatile", "const", "restrict"}) {
      if (t.size() > q.size() && t.substr(t.size() - q.size()) == q &&
          (t[t.size() - q.size() - 1] == ' ' || t[t.size() - q.size() - 1] == '*')) {
        t.remove_suffix(q.size());
        while (!t.empty() && t.back() == ' ') {
          t.remove_suffix(1);
        }
        again = true;
      }
    }
  }
  return t;
}

bool IsSignedType(std::string_view type_name) {
  const std::string_view t = UnqualifiedType(type_name);
  static constexpr auto kSigned = std::to_array<std::string_view>(
      {"char",    "signed char", "short",     "short int",     "int",    "signed",  "signed int",
       "long",    "long int",    "long long", "long long int", "int8_t", "int16_t", "int32_t",
       "int64_t", "ssize_t",     "intptr_t",  "ptrdiff_t",     "off_t",  "pid_t",   "time_t"});
  return std::ranges::find(kSigned, t) != kSigned.end();
}

}  // namespace kwatch::watch
