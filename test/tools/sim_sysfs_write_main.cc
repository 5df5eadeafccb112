// sim-sysfs-write: what `echo VALUE > PATH` does on a node, for a simulated tree: the write goes
// through the SimulatedKernel as an admin's would (sriov_numvfs creates the VFs, remove removes a
// function), so tests that drive a running plugin as a process can change its node under it.
//   sim-sysfs-write SYSFS_ROOT DEV_ROOT PATH VALUE      (PATH relative to SYSFS_ROOT)
// Exits 0 when the kernel took the write; else prints the errno's name and exits 1.
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "simulated_kernel.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: sim-sysfs-write SYSFS_ROOT DEV_ROOT PATH VALUE\n";
    return 2;
  }
  const std::string root = std::filesystem::absolute(argv[1]).lexically_normal().string();
  try {
    vfio_dra::testing::SimulatedKernel kernel(root, argv[2]);
    const int err = kernel.Write(root + "/" + argv[3], argv[4]);
    if (err != 0) {
      std::cerr << "sim-sysfs-write: writing '" << argv[4] << "' to " << argv[3]
                << " failed: " << std::strerror(err);
      // A fault of the simulation itself is recorded beside the write: say what it was.
      for (const auto& write : kernel.Writes()) {
        if (write.path.find("simulation error") != std::string::npos)
          std::cerr << "; " << write.path;
      }
      std::cerr << "\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "sim-sysfs-write: the simulated kernel over " << root << " failed: " << e.what()
              << "\n";
    return 1;
  }
  return 0;
}
