#include "discovery/pci_names.h"

extern "C" {
#include <pci/pci.h>
}

#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vfio_dra::discovery {
namespace {

// libpci's error callback must not return. It gets no user pointer, so the jump target of the
// libpci call in progress on this thread is kept here; it is set only around libpci calls.
struct ErrorTrap {
  std::jmp_buf jump;
  char message[512];
};
thread_local ErrorTrap* current_trap = nullptr;

__attribute__((noreturn)) void OnPciError(char* format, ...) {
  ErrorTrap* trap = current_trap;
  // Every libpci call below runs under a trap; without one there is nowhere safe to return to.
  if (trap == nullptr) std::abort();
  va_list args;
  va_start(args, format);
  // va_start above initializes `args`; the analyzer does not model it through the noreturn
  // variadic callback type libpci requires.
  // NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized)
  (void)std::vsnprintf(trap->message, sizeof trap->message, format, args);
  va_end(args);
  std::longjmp(trap->jump, 1);
}

void OnPciWarning(char* /*format*/, ...) {}
void OnPciDebug(char* /*format*/, ...) {}

}  // namespace

Result<std::unique_ptr<PciNames>> PciNames::Open(const PciNamesOptions& options) {
  pci_access* access = pci_alloc();
  if (access == nullptr) return MakeError(ErrorKind::kInternal, "pci_alloc failed");
  access->error = OnPciError;
  access->warning = OnPciWarning;
  access->debug = OnPciDebug;
  access->method = PCI_ACCESS_SYS_BUS_PCI;
  const std::string sysfs_path = options.sysfs_root + "/bus/pci";
  ErrorTrap trap{};
  current_trap = &trap;
  if (setjmp(trap.jump) != 0) {
    current_trap = nullptr;
    return MakeError(ErrorKind::kUnavailable, std::string("libpci: ") + trap.message);
  }
  pci_set_param(access, const_cast<char*>("sysfs.path"), const_cast<char*>(sysfs_path.c_str()));
  if (!options.use_hwdb) {
    pci_set_param(access, const_cast<char*>("hwdb.disable"), const_cast<char*>("1"));
  }
  // Debian builds libpci with DNS lookups and a cache in $HOME; names come from the file only.
  pci_set_param(access, const_cast<char*>("net.cache_name"), const_cast<char*>("/dev/null"));
  // libpci keeps the pointer and frees it at cleanup, so it gets its own malloc'ed copy.
  pci_set_name_list_path(access, ::strdup(options.ids_file.c_str()), /*to_be_freed=*/1);
  pci_init(access);
  current_trap = nullptr;
  return std::unique_ptr<PciNames>(new PciNames(access));
}

PciNames::~PciNames() {
  ErrorTrap trap{};
  current_trap = &trap;
  if (setjmp(trap.jump) == 0) pci_cleanup(access_);
  current_trap = nullptr;
}

std::string PciNames::Lookup(int flags, uint32_t a, uint32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!load_error_.empty()) return "";
  char buf[256];
  ErrorTrap trap{};
  current_trap = &trap;
  if (setjmp(trap.jump) != 0) {
    current_trap = nullptr;
    load_error_ = trap.message;
    return "";
  }
  const int no_hwdb = PCI_LOOKUP_NO_HWDB;
  const char* name =
      pci_lookup_name(access_, buf, sizeof buf, flags | PCI_LOOKUP_NO_NUMBERS | no_hwdb,
                      static_cast<int>(a), static_cast<int>(b));
  current_trap = nullptr;
  return name == nullptr ? std::string() : std::string(name);
}

void PciNames::ReleaseDatabase() {
  std::lock_guard<std::mutex> lock(mu_);
  pci_free_name_list(access_);
}

std::string PciNames::VendorName(uint32_t vendor) { return Lookup(PCI_LOOKUP_VENDOR, vendor, 0); }

std::string PciNames::DeviceName(uint32_t vendor, uint32_t device) {
  return Lookup(PCI_LOOKUP_DEVICE, vendor, device);
}

std::string PciNames::LoadError() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_error_;
}

}  // namespace vfio_dra::discovery
