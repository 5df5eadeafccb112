#include "base/thread_name.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace vfio_dra {

void NameThisThread(const char* name) {
  constexpr size_t kMaxName = 15;  // TASK_COMM_LEN less the terminating NUL
  const std::string cut(name, std::min(std::strlen(name), kMaxName));
  // Naming is for people reading process listings; a failure changes nothing else.
  (void)::pthread_setname_np(::pthread_self(), cut.c_str());
}

}  // namespace vfio_dra
