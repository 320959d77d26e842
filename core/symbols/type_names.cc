#include "core/symbols/type_names.h"

#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kwatch::core::symbols {
namespace {

struct Token {
  bool word = false;  // an identifier, a keyword or a number (else punctuation)
  std::string text;
};

bool IsWordChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

bool IsIntegerWord(std::string_view w) {
  return w == "signed" || w == "unsigned" || w == "short" || w == "long" || w == "int" ||
         w == "char" || w == "double" || w == "__int128";
}

// "long unsigned int" -> "unsigned long": the words of one integer (or long double) type.
std::string IntegerType(const std::vector<std::string>& words) {
  int longs = 0;
  bool is_unsigned = false;
  bool is_signed = false;
  bool is_short = false;
  bool is_char = false;
  bool is_double = false;
  bool is_int128 = false;
  for (const std::string& w : words) {
    longs += static_cast<int>(w == "long");
    is_unsigned = is_unsigned || w == "unsigned";
    is_signed = is_signed || w == "signed";
    is_short = is_short || w == "short";
    is_char = is_char || w == "char";
    is_double = is_double || w == "double";
    is_int128 = is_int128 || w == "__int128";
  }
  if (is_double) {
    return longs > 0 ? "long double" : "double";
  }
  if (is_char) {
    return is_unsigned ? "unsigned char" : is_signed ? "signed char" : "char";
  }
  std::string base = is_int128   ? "__int128"
                     : is_short  ? "short"
                     : longs > 1 ? "long long"
                     : longs > 0 ? "long"
                                 : "int";
  return is_unsigned ? "unsigned " + base : base;
}

// "3u", "0x10UL": an integer literal without its suffix.
std::string WithoutSuffix(std::string number) {
  size_t end = number.size();
  while (end > 1 && (number[end - 1] == 'u' || number[end - 1] == 'U' || number[end - 1] == 'l' ||
                     number[end - 1] == 'L')) {
    --end;
  }
  for (size_t i = 0; i < end; ++i) {
    if (std::isxdigit(static_cast<unsigned char>(number[i])) == 0 &&
        !(i == 1 && (number[i] == 'x' || number[i] == 'X'))) {
      return number;  // not an integer literal (1.5f, 1e3)
    }
  }
  number.resize(end);
  return number;
}

std::vector<Token> Tokenize(std::string_view name) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < name.size()) {
    const char c = name[i];
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      ++i;
    } else if (IsWordChar(c)) {
      size_t end = i;
      while (end < name.size() && IsWordChar(name[end])) {
        ++end;
      }
      std::string text(name.substr(i, end - i));
      if (std::isdigit(static_cast<unsigned char>(c)) != 0) {
        text = WithoutSuffix(std::move(text));
      }
      tokens.push_back(Token{true, std::move(text)});
      i = end;
    } else if (c == ':' && i + 1 < name.size() && name[i + 1] == ':') {
      tokens.push_back(Token{false, "::"});
      i += 2;
    } else {
      tokens.push_back(Token{false, std::string(1, c)});
      ++i;
    }
  }
  return tokens;
}

// Merges each run of integer words into one token spelled canonically.
std::vector<Token> MergeIntegerWords(const std::vector<Token>& in) {
  std::vector<Token> out;
  for (size_t i = 0; i < in.size();) {
    if (!in[i].word || !IsIntegerWord(in[i].text)) {
      out.push_back(in[i++]);
      continue;
    }
    std::vector<std::string> words;
    while (i < in.size() && in[i].word && IsIntegerWord(in[i].text)) {
      words.push_back(in[i++].text);
    }
    out.push_back(Token{true, IntegerType(words)});
  }
  return out;
}

// The index of the last token of the type name starting at `i` (a word, `::` parts and
// template argument lists), or `i` - 1 when none starts there.
size_t TypeNameEnd(const std::vector<Token>& t, size_t i) {
  if (i >= t.size() || !t[i].word) {
    return i - 1;
  }
  size_t end = i;
  while (true) {
    if (end + 1 < t.size() && t[end + 1].text == "<") {
      int depth = 0;
      size_t j = end + 1;
      for (; j < t.size(); ++j) {
        depth += t[j].text == "<" ? 1 : t[j].text == ">" ? -1 : 0;
        if (depth == 0) {
          break;
        }
      }
      if (j == t.size()) {
        return end;  // unbalanced: leave it
      }
      end = j;
    }
    if (end + 2 < t.size() && t[end + 1].text == "::" && t[end + 2].word) {
      end += 2;
      continue;
    }
    return end;
  }
}

// `const T` at the start of the name or of a template argument becomes `T const`.
void MoveQualifiersAfter(std::vector<Token>* t) {
  for (size_t i = 0; i < t->size(); ++i) {
    const Token& q = (*t)[i];
    if (!q.word || (q.text != "const" && q.text != "volatile")) {
      continue;
    }
    if (i > 0 && (*t)[i - 1].text != "<" && (*t)[i - 1].text != ",") {
      continue;
    }
    const size_t end = TypeNameEnd(*t, i + 1);
    if (end <= i) {
      continue;
    }
    Token moved = q;
    t->erase(t->begin() + static_cast<std::ptrdiff_t>(i));
    t->insert(t->begin() + static_cast<std::ptrdiff_t>(end), std::move(moved));
  }
}

}  // namespace

std::string CanonicalTypeName(std::string_view name) {
  std::vector<Token> tokens = MergeIntegerWords(Tokenize(name));
  MoveQualifiersAfter(&tokens);
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) {
      const Token& prev = tokens[i - 1];
      if ((prev.word && tokens[i].word) || prev.text == "," ||
          (prev.text == ">" && (tokens[i].text == ">" || tokens[i].word))) {
        out.push_back(' ');
      }
    }
    out += tokens[i].text;
  }
  return out;
}

}  // namespace kwatch::core::symbols
