#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Propagation helpers; Abseil ships none.

#define KW_INTERNAL_CONCAT_INNER(a, b) a##b
#define KW_INTERNAL_CONCAT(a, b) KW_INTERNAL_CONCAT_INNER(a, b)

#define KW_RETURN_IF_ERROR(expr)        \
  do {                                  \
    ::absl::Status kw_status_ = (expr); \
    if (!kw_status_.ok())               \
      return kw_status_;                \
  } while (false)

// `tmp` is the name of the variable it declares and `lhs` may be a declaration
// (`const Foo foo`): neither can be put in parentheses.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define KW_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok())                                     \
    return std::move(tmp).status();                  \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

#define KW_ASSIGN_OR_RETURN(lhs, expr) \
  KW_INTERNAL_ASSIGN_OR_RETURN(KW_INTERNAL_CONCAT(kw_statusor_, __LINE__), lhs, expr)

// A broken invariant is a bug: abort, also in release builds.
#define KW_CHECK(cond)                                                                 \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: KW_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (false)
