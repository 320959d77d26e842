#include "core/symbols/expr.h"

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

namespace kwatch::core::symbols {
namespace {

bool IsIdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_';
}
bool IsIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
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

  // InvalidArgument "<what> at column N" with the text and a caret under `at`.
  absl::Status Error(absl::string_view what, size_t at) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at column ", at + 1, "\n  ", text_,
                                                   "\n  ", std::string(at, ' '), "^"));
  }

  // An identifier, with `::` separators allowed between parts (C++ names).
  absl::StatusOr<std::string> Identifier(absl::string_view after);
  // A number: decimal, or hex with 0x. Sets `value`; `allow_negative` accepts a leading '-'.
  absl::Status Number(bool allow_negative, absl::string_view what, int64_t* value,
                      uint64_t* uvalue);

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<std::string> Parser::Identifier(absl::string_view after) {
  SkipSpace();
  if (!IsIdentStart(Peek())) {
    return Error(absl::StrCat("expected ", after, ", found ", Describe(text_, pos_)), pos_);
  }
  std::string name;
  while (true) {
    while (IsIdentChar(Peek())) {
      name.push_back(Peek());
      ++pos_;
    }
    if (Peek() == ':' && Peek(1) == ':') {
      if (!IsIdentStart(Peek(2))) {
        return Error("expected a name after '::'", pos_ + 2);
      }
      name += "::";
      pos_ += 2;
      continue;
    }
    break;
  }
  return name;
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
  if (Peek() == '0' && (Peek(1) == 'x' || Peek(1) == 'X')) {
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
    SkipSpace();
  }
  // Leading '*'s bind looser than the postfix steps (C precedence): applied last.
  std::vector<size_t> derefs;
  while (Peek() == '*') {
    derefs.push_back(pos_);
    ++pos_;
    SkipSpace();
  }

  if (Peek() == '0' && (Peek(1) == 'x' || Peek(1) == 'X')) {
    uint64_t addr = 0;
    if (absl::Status s = Number(false, "an address", nullptr, &addr); !s.ok()) {
      return s;
    }
    expr.address = addr;
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
      expr.length = len;
    }
    SkipSpace();
    if (!derefs.empty()) {
      return Error("'*' applies to pointer variables, not to an absolute address", derefs[0]);
    }
    if (!AtEnd()) {
      return Error(absl::StrCat("unexpected ", Describe(text_, pos_),
                                " after an absolute address (use 0xADDR or 0xADDR:LEN)"),
                   pos_);
    }
    return expr;
  }
  if (std::isdigit(static_cast<unsigned char>(Peek())) != 0) {
    return Error("expected a variable name or a 0x-prefixed address", pos_);
  }
  // gdb's file scope: 'thread.c'::initialized, the static of that source file.
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
    file_scope = absl::StrCat(text_.substr(open, close - open + 1), "::");
    pos_ = close + 1;
    if (Peek() != ':' || Peek(1) != ':') {
      return Error("expected '::' and a variable name after the file name", pos_);
    }
    pos_ += 2;
  }
  if (!IsIdentStart(Peek())) {
    return Error(absl::StrCat("expected a variable name or 0xADDR, found ", Describe(text_, pos_)),
                 pos_);
  }
  auto base = Identifier("a variable name");
  if (!base.ok()) {
    return base.status();
  }
  expr.base = absl::StrCat(file_scope, *base);

  while (true) {
    SkipSpace();
    if (AtEnd()) {
      break;
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
      auto name = Identifier("a member name after '.'");
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
      auto name = Identifier("a member name after '->'");
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
    expr.steps.push_back(std::move(step));
  }
  // Innermost '*' first, by index: clang 14 (the fuzz build) cannot compile libstdc++ 12's
  // <ranges> (std::views::reverse).
  for (size_t i = derefs.size(); i-- > 0;) {
    ExprStep step;
    step.kind = ExprStep::Kind::kDeref;
    step.column = derefs[i];
    expr.steps.push_back(std::move(step));
  }
  return expr;
}

}  // namespace

absl::StatusOr<Expr> ParseExpr(std::string_view text) {
  return Parser(absl::string_view(text.data(), text.size())).Parse();
}

}  // namespace kwatch::core::symbols
