// NameThisThread: gives the calling thread the name that `top -H`, /proc/<pid>/task/*/comm and
// the benchmark's per-thread CPU figures show, so a node agent's threads can be told apart.
#pragma once

namespace vfio_dra {

// `name` is cut to the kernel's 15 characters.
void NameThisThread(const char* name);

}  // namespace vfio_dra
