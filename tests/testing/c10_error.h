// The message of the c10::Error a call throws, for tests that check what an error says.
#pragma once

#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace qpool::testing {

// What f() threw as a c10::Error, without the backtrace; "" when it threw nothing.
inline std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace qpool::testing
