#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Propagation helpers; Abseil ships none.

#define KW_STATUS_CONCAT_INNER_(a, b) a##b
#define KW_STATUS_CONCAT_(a, b) KW_STATUS_CONCAT_INNER_(a, b)

#define KW_RETURN_IF_ERROR(expr)        \
  do {                                  \
    ::absl::Status kw_status_ = (expr); \
    if (!kw_status_.ok())               \
      return kw_status_;                \
  } while (false)

#define KW_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok())                                  \
    return std::move(tmp).status();               \
  lhs = std::move(tmp).value()

#define KW_ASSIGN_OR_RETURN(lhs, expr) \
  KW_ASSIGN_OR_RETURN_IMPL_(KW_STATUS_CONCAT_(kw_statusor_, __LINE__), lhs, expr)

// A broken invariant is a bug: abort, also in release builds.
#define KW_CHECK(cond)                                                                 \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: KW_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (false)
