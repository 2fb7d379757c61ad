// RETURN_IF_ERROR and ASSIGN_OR_RETURN for absl::Status and absl::StatusOr.
#ifndef LLM_COMMON_STATUS_MACROS_H_
#define LLM_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LLM_STATUS_CONCAT_INNER(a, b) a##b
#define LLM_STATUS_CONCAT(a, b) LLM_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                   \
  do {                                          \
    if (absl::Status _st = (expr); !_st.ok()) { \
      return _st;                               \
    }                                           \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(LLM_STATUS_CONCAT(_status_or_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                          \
  if (!statusor.ok()) {                            \
    return std::move(statusor).status();           \
  }                                                \
  lhs = std::move(statusor).value()

#endif  // LLM_COMMON_STATUS_MACROS_H_
