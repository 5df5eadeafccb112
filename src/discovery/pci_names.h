// PciNames: vendor and device names from pci.ids through libpci. libpci is pointed at
// <sysfs-root>/bus/pci with its access method forced to sysfs (so it can never fall back to the
// host's /proc/bus/pci), udev's hwdb is off by default (names depend only on the pci.ids file),
// and its error handler returns control to us instead of exiting the process.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "base/result.h"

struct pci_access;

namespace vfio_dra::discovery {

struct PciNamesOptions {
  std::string sysfs_root;                            // libpci's sysfs.path = <root>/bus/pci
  std::string ids_file = "/usr/share/misc/pci.ids";  // Debian's pci.ids package
  bool use_hwdb = false;
};

class PciNames {
 public:
  static Result<std::unique_ptr<PciNames>> Open(const PciNamesOptions& options);
  ~PciNames();
  PciNames(const PciNames&) = delete;
  PciNames& operator=(const PciNames&) = delete;

  // Empty when the id is unknown (or the database could not be read; see LoadError()).
  std::string VendorName(uint32_t vendor);
  std::string DeviceName(uint32_t vendor, uint32_t device);
  // Set when libpci reported an error (for example a malformed pci.ids); names are then empty.
  std::string LoadError() const;
  // Frees libpci's in-memory copy of pci.ids (about 2 MB); the next lookup reads the file again.
  // The daemon calls it after each full scan: names are needed only while scanning, and an idle
  // node agent should not keep the database for the hours between scans.
  void ReleaseDatabase();

 private:
  explicit PciNames(pci_access* access) : access_(access) {}
  std::string Lookup(int flags, uint32_t a, uint32_t b);

  mutable std::mutex mu_;  // libpci has no locking of its own
  pci_access* access_;
  std::string load_error_;
};

}  // namespace vfio_dra::discovery
