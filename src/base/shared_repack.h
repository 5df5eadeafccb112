// RepackShared: replaces the value a shared_ptr guarded by `mu` holds with a fresh copy of it,
// unless the pointer changed meanwhile (a newer value wins over the copy). A long-lived value
// built while the heap was full of short-lived data sits in pages those shared; a copy made once
// that data is gone packs into fewer pages, and the old ones can go back to the system
// (malloc_trim). Readers holding the old pointer keep it; the content is the same.
#pragma once

#include <memory>
#include <mutex>

namespace vfio_dra {

template <typename T>
void RepackShared(std::mutex& mu, std::shared_ptr<const T>& value) {
  std::shared_ptr<const T> old;
  {
    std::lock_guard<std::mutex> lock(mu);
    old = value;
  }
  if (old == nullptr) return;
  auto copy = std::make_shared<const T>(*old);  // made outside the lock: it may be large
  std::lock_guard<std::mutex> lock(mu);
  if (value == old) value = std::move(copy);
}

}  // namespace vfio_dra
