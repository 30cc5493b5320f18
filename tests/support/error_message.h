#pragma once
// The message of the c10::Error a call raises (without the backtrace), for tests that check a
// refusal names its argument and rule; "<no error>" when it raises none. The one definition: the
// tests of every folder use it.
#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace convnn::testing {

inline std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  return "<no error>";
}

}  // namespace convnn::testing
