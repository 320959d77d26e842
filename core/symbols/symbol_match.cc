#include "core/symbols/symbol_match.h"

#include <algorithm>
#include <cctype>
#include <utility>

namespace kwatch::core::symbols {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

}  // namespace

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1);
  std::vector<size_t> cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    prev[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<std::string> NearMatches(std::string_view word, const std::vector<std::string>& names,
                                     size_t max) {
  const size_t threshold = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : 3;
  const std::string lower_word = Lower(word);
  std::vector<std::pair<size_t, const std::string*>> scored;
  for (const std::string& name : names) {
    if (name == word) {
      continue;
    }
    const size_t len_diff =
        name.size() > word.size() ? name.size() - word.size() : word.size() - name.size();
    if (len_diff > threshold) {
      continue;
    }
    const std::string lower_name = Lower(name);
    const size_t d = lower_name == lower_word ? 0 : EditDistance(word, name);
    if (d <= threshold) {
      scored.emplace_back(d, &name);
    }
  }
  std::sort(scored.begin(), scored.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first < y.first : *x.second < *y.second;
  });
  std::vector<std::string> out;
  for (const auto& [d, name] : scored) {
    if (out.size() == max) {
      break;
    }
    if (std::find(out.begin(), out.end(), *name) == out.end()) {
      out.push_back(*name);
    }
  }
  return out;
}

}  // namespace kwatch::core::symbols
