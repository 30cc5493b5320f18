#pragma once
// The message of the c10::Error a call raises, for tests that check a refusal names its argument
// and rule; "no error" when it raises none.
#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace convnn::testing {

inline std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const c10::Error& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace convnn::testing
