#include "core/symbols/expr.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/symbols/type_names.h"

namespace kwatch::core::symbols {
namespace {

// Parentheses nest at most this deep (the parser recurses once per level).
constexpr int kMaxNesting = 32;

bool IsIdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_';
}
bool IsIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// Words that can only start a type (C's type specifiers and qualifiers).
bool IsTypeKeyword(absl::string_view w) {
  static constexpr std::array<absl::string_view, 18> kWords = {
      "struct", "union", "class", "enum",  "const",  "volatile", "unsigned", "signed", "int",
      "char",   "short", "long",  "float", "double", "void",     "_Bool",    "bool",   "__int128"};
  return std::any_of(kWords.begin(), kWords.end(), [w](absl::string_view k) { return w == k; });
}

// Characters a template argument list may hold besides names, numbers, spaces and '<>'.
bool IsTemplatePunct(char c) {
  switch (c) {
    case ',':
    case '*':
    case '&':
    case ':':
    case '-':
    case '(':
    case ')':
    case '[':
    case ']':
      return true;
    default:
      return false;
  }
}

// Describes the character at `pos` for messages ("'x'" or "the end").
std::string Describe(absl::string_view text, size_t pos) {
  if (pos >= text.size()) {
    return "the end";
  }
  return absl::StrCat("'", text.substr(pos, 1), "'");
}

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Expr> Parse();

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_])) != 0) {
      ++pos_;
    }
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  bool AtHex() const { return Peek() == '0' && (Peek(1) == 'x' || Peek(1) == 'X'); }
  // The word (identifier characters) at `at`, "" when none starts there.
  absl::string_view WordAt(size_t at) const {
    size_t end = at;
    while (end < text_.size() && IsIdentChar(text_[end])) {
      ++end;
    }
    return text_.substr(at, end - at);
  }

  absl::Status Error(absl::string_view what, size_t at) const {
    return ExprError(absl::StatusCode::kInvalidArgument, text_, what, at);
  }

  // An identifier, with `::` separators allowed between parts (C++ names). `symbol` (the
  // expression's variable) also takes template argument lists (`Box<int, 2>::value`) and
  // GCC's numeric suffixes of renamed statics (`initialized.5`).
  absl::StatusOr<std::string> Identifier(absl::string_view after, bool symbol);
  // A template argument list starting at the '<' under pos_, appended to `name` as written.
  absl::Status TemplateArguments(std::string* name);
  // A number: decimal, or hex with 0x. Sets `value`; `allow_negative` accepts a leading '-'.
  absl::Status Number(bool allow_negative, absl::string_view what, int64_t* value,
                      uint64_t* uvalue);
  // Leading '*'s, then a cast or a postfix expression; the '*'s apply last.
  absl::Status Unary(Expr* expr, int depth);
  // A primary expression and its '.field', '->field' and '[index]' steps.
  absl::Status Postfix(Expr* expr, int depth);
  absl::Status Primary(Expr* expr, int depth);
  // Whether the '(' under pos_ opens a cast rather than a parenthesised expression.
  bool AtCast() const;
  // (TYPE)0xADDR, from the '(' under pos_.
  absl::Status Cast(Expr* expr);
  absl::StatusOr<ExprType> Type();
  // The steps that follow an absolute address or a cast are refused with advice.
  absl::Status NoStepsAfterAddress() const;

  absl::string_view text_;
  size_t pos_ = 0;
  bool have_primary_ = false;
};

absl::Status Parser::TemplateArguments(std::string* name) {
  const size_t open = pos_;
  int depth = 0;
  while (!AtEnd()) {
    const char c = Peek();
    if (c == '<') {
      ++depth;
    } else if (c == '>') {
      --depth;
    } else if (!IsIdentChar(c) && std::isspace(static_cast<unsigned char>(c)) == 0 &&
               !IsTemplatePunct(c)) {
      return Error(
          absl::StrCat("unexpected ", Describe(text_, pos_), " in a template argument list"), pos_);
    }
    name->push_back(c);
    ++pos_;
    if (depth == 0) {
      return absl::OkStatus();
    }
  }
  return Error("unterminated template argument list: expected '>'", open);
}

absl::StatusOr<std::string> Parser::Identifier(absl::string_view after, bool symbol) {
  SkipSpace();
  if (!IsIdentStart(Peek())) {
    return Error(absl::StrCat("expected ", after, ", found ", Describe(text_, pos_)), pos_);
  }
  std::string name;
  bool templated = false;
  while (true) {
    while (IsIdentChar(Peek())) {
      name.push_back(Peek());
      ++pos_;
    }
    if (symbol) {
      // GCC's local statics: `calls.0`. No member name starts with a digit.
      while (Peek() == '.' && std::isdigit(static_cast<unsigned char>(Peek(1))) != 0) {
        name.push_back('.');
        ++pos_;
        while (std::isdigit(static_cast<unsigned char>(Peek())) != 0) {
          name.push_back(Peek());
          ++pos_;
        }
        if (IsIdentChar(Peek())) {
          return Error(absl::StrCat("unexpected ", Describe(text_, pos_),
                                    " after a symbol's numeric suffix"),
                       pos_);
        }
      }
      SkipSpace();
      if (Peek() == '<') {
        if (absl::Status s = TemplateArguments(&name); !s.ok()) {
          return s;
        }
        templated = true;
        SkipSpace();
      }
    }
    if (Peek() == ':' && Peek(1) == ':') {
      pos_ += 2;
      if (symbol) {
        SkipSpace();
      }
      if (!IsIdentStart(Peek())) {
        return Error("expected a name after '::'", pos_);
      }
      name += "::";
      continue;
    }
    break;
  }
  return templated ? CanonicalTypeName(name) : name;
}

absl::Status Parser::Number(bool allow_negative, absl::string_view what, int64_t* value,
                            uint64_t* uvalue) {
  SkipSpace();
  const size_t start = pos_;
  bool negative = false;
  if (Peek() == '-') {
    if (!allow_negative) {
      return Error(absl::StrCat(what, " cannot be negative"), pos_);
    }
    negative = true;
    ++pos_;
  }
  int base = 10;
  if (AtHex()) {
    base = 16;
    pos_ += 2;
  }
  const size_t digits = pos_;
  while (std::isxdigit(static_cast<unsigned char>(Peek())) != 0) {
    if (base == 10 && std::isdigit(static_cast<unsigned char>(Peek())) == 0) {
      break;
    }
    ++pos_;
  }
  if (pos_ == digits) {
    return Error(
        absl::StrCat("expected ", what, " (decimal or 0x hex), found ", Describe(text_, pos_)),
        pos_);
  }
  if (IsIdentChar(Peek())) {
    return Error(absl::StrCat("unexpected ", Describe(text_, pos_), " in ", what), pos_);
  }
  uint64_t magnitude = 0;
  const auto res = std::from_chars(text_.data() + digits, text_.data() + pos_, magnitude, base);
  if (res.ec != std::errc()) {
    return Error(absl::StrCat(what, " is too large"), start);
  }
  if (uvalue != nullptr) {
    *uvalue = magnitude;
  }
  if (value != nullptr) {
    if (magnitude > static_cast<uint64_t>(INT64_MAX)) {
      return Error(absl::StrCat(what, " is too large"), start);
    }
    *value = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
  }
  return absl::OkStatus();
}

bool Parser::AtCast() const {
  size_t at = pos_ + 1;
  while (at < text_.size() && std::isspace(static_cast<unsigned char>(text_[at])) != 0) {
    ++at;
  }
  const absl::string_view word = WordAt(at);
  if (word.empty() || !IsIdentStart(word[0])) {
    return false;  // (*p), ((T *)0x10), (0x10)
  }
  if (IsTypeKeyword(word)) {
    return true;
  }
  // A name: a type when a '*' follows it (kwatch has no multiplication), or when something to
  // cast follows its ')': (T *)0x10, (T)0x10; (p)->f and (p).f are parenthesised names.
  at += word.size();
  int depth = 0;  // template argument lists and '::' parts belong to the name
  for (; at < text_.size(); ++at) {
    const char c = text_[at];
    if (c == '<') {
      ++depth;
    } else if (c == '>') {
      --depth;
    } else if (depth == 0 && (c == '*' || c == ')')) {
      break;
    } else if (depth == 0 && !IsIdentChar(c) && c != ':' &&
               std::isspace(static_cast<unsigned char>(c)) == 0) {
      return false;
    }
  }
  if (at >= text_.size()) {
    return false;
  }
  if (text_[at] == '*') {
    return true;
  }
  ++at;
  while (at < text_.size() && std::isspace(static_cast<unsigned char>(text_[at])) != 0) {
    ++at;
  }
  return at < text_.size() && (IsIdentChar(text_[at]) || text_[at] == '(' || text_[at] == '\'');
}

absl::StatusOr<ExprType> Parser::Type() {
  ExprType type;
  SkipSpace();
  type.column = pos_;
  std::string words;  // base type words, as written
  bool named = false;
  while (true) {
    SkipSpace();
    if (!IsIdentStart(Peek())) {
      break;
    }
    const size_t at = pos_;
    const absl::string_view word = WordAt(pos_);
    if (word == "const" || word == "volatile") {
      pos_ += word.size();
      continue;
    }
    if (named) {
      return Error(absl::StrCat("unexpected '", word, "' after the type name ", type.name), at);
    }
    if (word == "struct" || word == "union" || word == "class" || word == "enum") {
      if (type.tag != ExprType::Tag::kNone || !words.empty()) {
        return Error(absl::StrCat("unexpected '", word, "' in a type name"), at);
      }
      type.tag = word == "struct"  ? ExprType::Tag::kStruct
                 : word == "union" ? ExprType::Tag::kUnion
                 : word == "class" ? ExprType::Tag::kClass
                                   : ExprType::Tag::kEnum;
      pos_ += word.size();
      SkipSpace();
      auto tag_name = Identifier(absl::StrCat("a name after '", word, "'"), true);
      if (!tag_name.ok()) {
        return tag_name.status();
      }
      type.name = *std::move(tag_name);
      named = true;
      continue;
    }
    if (IsTypeKeyword(word)) {
      if (type.tag != ExprType::Tag::kNone) {
        return Error(absl::StrCat("unexpected '", word, "' after the type name ", type.name), at);
      }
      absl::StrAppend(&words, words.empty() ? "" : " ", word);
      pos_ += word.size();
      continue;
    }
    if (!words.empty()) {
      return Error(absl::StrCat("unexpected '", word, "' after '", words, "'"), at);
    }
    auto name = Identifier("a type name", true);
    if (!name.ok()) {
      return name.status();
    }
    type.name = *std::move(name);
    named = true;
  }
  if (!words.empty()) {
    type.name = CanonicalTypeName(words);
  } else if (!named) {
    return Error(absl::StrCat("expected a type name, found ", Describe(text_, pos_)), pos_);
  }
  while (true) {
    SkipSpace();
    if (Peek() == '*') {
      ++type.pointers;
      ++pos_;
      continue;
    }
    const absl::string_view word = WordAt(pos_);
    if (type.pointers > 0 && (word == "const" || word == "volatile" || word == "restrict")) {
      pos_ += word.size();
      continue;
    }
    break;
  }
  return type;
}

absl::Status Parser::Cast(Expr* expr) {
  const size_t open = pos_;
  ++pos_;
  auto type = Type();
  if (!type.ok()) {
    return type.status();
  }
  SkipSpace();
  if (Peek() != ')') {
    return Error(absl::StrCat("expected ')' after the type ", type->Spelling(), ", found ",
                              Describe(text_, pos_)),
                 pos_);
  }
  ++pos_;
  SkipSpace();
  if (!AtHex()) {
    return Error(absl::StrCat("kwatch casts addresses only: write (", type->Spelling(),
                              ")0xADDR with the object's address in hex"),
                 pos_);
  }
  uint64_t addr = 0;
  if (absl::Status s = Number(false, "an address", nullptr, &addr); !s.ok()) {
    return s;
  }
  SkipSpace();
  if (Peek() == ':') {
    return Error(absl::StrCat("a cast gives the length (the size of ", type->Spelling(),
                              "'s object): drop ':LEN'"),
                 pos_);
  }
  if (Peek() == '.' || (Peek() == '-' && Peek(1) == '>') || Peek() == '[') {
    const absl::string_view op = Peek() == '-' ? "->" : Peek() == '.' ? "." : "[";
    return Error(absl::StrCat("'", op, "' would apply to the address, not to the cast: write ((",
                              type->Spelling(), ")0x...)", op, "..."),
                 pos_);
  }
  expr->address = addr;
  expr->cast = *std::move(type);
  expr->cast_column = open;
  return absl::OkStatus();
}

absl::Status Parser::NoStepsAfterAddress() const {
  return Error(absl::StrCat("unexpected ", Describe(text_, pos_),
                            " after an absolute address (use 0xADDR or 0xADDR:LEN, or a cast "
                            "such as ((struct T *)0xADDR)->field)"),
               pos_);
}

absl::Status Parser::Primary(Expr* expr, int depth) {
  SkipSpace();
  if (AtEnd()) {
    return Error(have_primary_ ? "expected an expression"
                               : "empty expression: expected a variable name or 0xADDR",
                 pos_);
  }
  if (Peek() == '(') {
    const size_t open = pos_;
    if (depth >= kMaxNesting) {
      return Error(absl::StrCat("more than ", kMaxNesting, " nested parentheses"), open);
    }
    ++pos_;
    if (absl::Status s = Unary(expr, depth + 1); !s.ok()) {
      return s;
    }
    SkipSpace();
    if (Peek() != ')') {
      return Error(absl::StrCat("expected ')' to close the '(' at column ", open + 1, ", found ",
                                Describe(text_, pos_)),
                   pos_);
    }
    ++pos_;
    return absl::OkStatus();
  }
  have_primary_ = true;
  if (AtHex()) {
    uint64_t addr = 0;
    if (absl::Status s = Number(false, "an address", nullptr, &addr); !s.ok()) {
      return s;
    }
    expr->address = addr;
    SkipSpace();
    if (Peek() == ':') {
      ++pos_;
      SkipSpace();
      const size_t len_at = pos_;
      uint64_t len = 0;
      if (absl::Status s = Number(false, "a length", nullptr, &len); !s.ok()) {
        return s;
      }
      if (len == 0) {
        return Error("the length must be at least 1 byte", len_at);
      }
      expr->length = len;
    }
    return absl::OkStatus();
  }
  if (std::isdigit(static_cast<unsigned char>(Peek())) != 0) {
    return Error("expected a variable name or a 0x-prefixed address", pos_);
  }
  std::string file_scope;
  if (Peek() == '\'') {
    const size_t open = pos_;
    const size_t close = text_.find('\'', open + 1);
    if (close == absl::string_view::npos) {
      return Error("unterminated file name: write 'FILE'::NAME", open);
    }
    if (close == open + 1) {
      return Error("empty file name: write 'FILE'::NAME", open);
    }
    pos_ = close + 1;
    if (Peek() != ':' || Peek(1) != ':') {
      // gdb's quoted symbol: 'initialized.5', a symbol table name taken as is.
      SkipSpace();
      if (AtEnd() || Peek() == ')' || Peek() == '[' || (Peek() == '-' && Peek(1) == '>')) {
        expr->base.assign(text_.data() + open + 1, close - open - 1);
        if (expr->base.find_first_of(" \t'") != std::string::npos) {
          return Error("a quoted symbol name has no spaces: write 'FILE'::NAME or 'NAME'", open);
        }
        return absl::OkStatus();
      }
      return Error("expected '::' and a variable name after the file name", pos_);
    }
    file_scope = absl::StrCat(text_.substr(open, close - open + 1), "::");
    pos_ += 2;
  }
  if (!IsIdentStart(Peek())) {
    return Error(absl::StrCat("expected a variable name or 0xADDR, found ", Describe(text_, pos_)),
                 pos_);
  }
  auto base = Identifier("a variable name", true);
  if (!base.ok()) {
    return base.status();
  }
  expr->base = absl::StrCat(file_scope, *base);
  return absl::OkStatus();
}

absl::Status Parser::Postfix(Expr* expr, int depth) {
  if (absl::Status s = Primary(expr, depth); !s.ok()) {
    return s;
  }
  while (true) {
    SkipSpace();
    if (AtEnd() || Peek() == ')') {
      return absl::OkStatus();
    }
    if (expr->address.has_value() && !expr->cast.has_value()) {
      return NoStepsAfterAddress();
    }
    ExprStep step;
    step.column = pos_;
    const char c = Peek();
    if (c == '.') {
      ++pos_;
      SkipSpace();
      if (!IsIdentStart(Peek())) {
        return Error("expected a member name after '.'", pos_);
      }
      step.kind = ExprStep::Kind::kMember;
      auto name = Identifier("a member name after '.'", false);
      if (!name.ok()) {
        return name.status();
      }
      step.member = *std::move(name);
    } else if (c == '-' && Peek(1) == '>') {
      pos_ += 2;
      SkipSpace();
      if (!IsIdentStart(Peek())) {
        return Error("expected a member name after '->'", pos_);
      }
      step.kind = ExprStep::Kind::kArrow;
      auto name = Identifier("a member name after '->'", false);
      if (!name.ok()) {
        return name.status();
      }
      step.member = *std::move(name);
    } else if (c == '[') {
      ++pos_;
      SkipSpace();
      step.kind = ExprStep::Kind::kIndex;
      if (absl::Status s = Number(true, "an index", &step.index, nullptr); !s.ok()) {
        return s;
      }
      SkipSpace();
      if (Peek() != ']') {
        return Error(absl::StrCat("expected ']', found ", Describe(text_, pos_)), pos_);
      }
      ++pos_;
    } else {
      return Error(absl::StrCat("unexpected ", Describe(text_, pos_),
                                ": expected '.member', '->member' or '[index]'"),
                   pos_);
    }
    expr->steps.push_back(std::move(step));
  }
}

absl::Status Parser::Unary(Expr* expr, int depth) {
  SkipSpace();
  std::vector<size_t> derefs;
  while (Peek() == '*') {
    derefs.push_back(pos_);
    ++pos_;
    SkipSpace();
  }
  if (Peek() == '(' && AtCast()) {
    have_primary_ = true;
    if (absl::Status s = Cast(expr); !s.ok()) {
      return s;
    }
  } else if (absl::Status s = Postfix(expr, depth); !s.ok()) {
    return s;
  }
  if (!derefs.empty() && expr->address.has_value() && !expr->cast.has_value()) {
    return Error(
        "'*' applies to pointer variables, not to an absolute address: cast it, "
        "*(TYPE *)0xADDR",
        derefs[0]);
  }
  // Innermost '*' first, by index: clang 14 (the fuzz build) cannot compile libstdc++ 12's
  // <ranges> (std::views::reverse).
  for (size_t i = derefs.size(); i-- > 0;) {
    ExprStep step;
    step.kind = ExprStep::Kind::kDeref;
    step.column = derefs[i];
    expr->steps.push_back(std::move(step));
  }
  return absl::OkStatus();
}

absl::StatusOr<Expr> Parser::Parse() {
  Expr expr;
  expr.text.assign(text_.data(), text_.size());
  SkipSpace();
  if (AtEnd()) {
    return Error("empty expression: expected a variable name or 0xADDR", pos_);
  }
  if (Peek() == '&') {
    expr.address_of = true;
    ++pos_;
  }
  if (absl::Status s = Unary(&expr, 0); !s.ok()) {
    return s;
  }
  SkipSpace();
  if (!AtEnd()) {
    if (expr.address.has_value() && !expr.cast.has_value()) {
      return NoStepsAfterAddress();
    }
    return Error(absl::StrCat("unexpected ", Describe(text_, pos_),
                              Peek() == ')' ? ": no '(' to close" : ""),
                 pos_);
  }
  return expr;
}

}  // namespace

std::string ExprType::Spelling() const {
  static constexpr std::array<const char*, 5> kTags = {"", "struct ", "union ", "class ", "enum "};
  std::string out = absl::StrCat(kTags[static_cast<size_t>(tag)], name);
  if (pointers > 0) {
    absl::StrAppend(&out, " ", std::string(static_cast<size_t>(pointers), '*'));
  }
  return out;
}

absl::Status ExprError(absl::StatusCode code, absl::string_view text, absl::string_view what,
                       size_t column) {
  return {code, absl::StrCat(what, " at column ", column + 1, "\n  ", text, "\n  ",
                             std::string(column, ' '), "^")};
}

absl::StatusOr<Expr> ParseExpr(std::string_view text) {
  return Parser(absl::string_view(text.data(), text.size())).Parse();
}

}  // namespace kwatch::core::symbols
