// Status values for the library's errors (the Status of attention.h).

#ifndef SIMDATTN_LIB_STATUS_H_
#define SIMDATTN_LIB_STATUS_H_

#include <string>
#include <utility>

#include "simdattn/attention.h"

namespace simdattn {

inline Status Error(StatusCode code, std::string message) {
  Status s;
  s.code = code;
  s.message = std::move(message);
  return s;
}

// An argument error; `message` names the argument and what is wrong.
inline Status Invalid(std::string message) {
  return Error(StatusCode::kInvalidArgument, std::move(message));
}

// What the call asks for is valid but not supported (here, or yet).
inline Status Unimplemented(std::string message) {
  return Error(StatusCode::kUnimplemented, std::move(message));
}

}  // namespace simdattn

#endif  // SIMDATTN_LIB_STATUS_H_
