#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kwatch::core::symbols {

// Levenshtein distance (insertions, deletions, substitutions; each costs 1).
size_t EditDistance(std::string_view a, std::string_view b);

// Up to `max` names of `names` close to `word` by edit distance (at most 1 for words of up
// to 4 characters, 2 up to 8, 3 beyond), nearest first, then alphabetical. A name that
// differs from `word` only in case counts as distance 0. `word` itself is never returned.
std::vector<std::string> NearMatches(std::string_view word, const std::vector<std::string>& names,
                                     size_t max);

}  // namespace kwatch::core::symbols
