#include "util/large_stack.h"

#include <pthread.h>

#include <cstring>

#include "util/log.h"

namespace qpool {
namespace {

void* Trampoline(void* arg) {
  (*static_cast<const std::function<void()>*>(arg))();
  return nullptr;
}

}  // namespace

Status RunWithStack(size_t bytes, const std::function<void()>& fn) {
  pthread_attr_t attr;
  int error = pthread_attr_init(&attr);
  if (error == 0) error = pthread_attr_setstacksize(&attr, bytes);
  pthread_t thread;
  if (error == 0) {
    error = pthread_create(&thread, &attr, Trampoline, const_cast<std::function<void()>*>(&fn));
  }
  pthread_attr_destroy(&attr);
  if (error != 0) {
    return Internal(StrCat("cannot start a thread with a ", bytes >> 20,
                           " MiB stack: ", std::strerror(error)));
  }
  pthread_join(thread, nullptr);
  return Status::Ok();
}

}  // namespace qpool
