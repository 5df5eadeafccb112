// ServeOptions: everything `vfio-dra-plugin serve` is told on its command line, and the checks
// that make a bad value fail at startup with a message naming the flag instead of later.
#pragma once

#include <string>

#include "base/result.h"

namespace vfio_dra::cmd {

inline constexpr const char* kDefaultDriverName = "vfio.dra.io";

struct ServeOptions {
  std::string driver_name = kDefaultDriverName;
  std::string node_name;  // --node-name or $NODE_NAME
  std::string kubeconfig;
  std::string sysfs_root = "/sys";
  std::string dev_root = "/dev";
  std::string registrar_dir = "/var/lib/kubelet/plugins_registry";
  std::string plugin_data_dir;  // default /var/lib/kubelet/plugins/<driver-name>
  std::string cdi_dir = "/var/run/cdi";
  std::string config_file;  // admin policy (discovery)
  std::string pci_ids = "/usr/share/misc/pci.ids";
  std::string modules_alias;  // empty: this kernel's, when reading the real /sys
  int rescan_interval_seconds = 30;
  std::string pod_uid;  // rolling updates: per-instance socket names
  int verbosity = 0;
  double kube_api_qps = 5.0;
  int kube_api_burst = 10;
  // ResourceClaim reads have their own, higher limit: they sit on the path of every pod start,
  // and a node starting many pods at once must not queue them behind slice writes.
  double claim_api_qps = 50.0;
  int claim_api_burst = 100;
  int unbind_timeout_seconds = 20;
  // How often the device health stream re-sends the full list (the kubelet's timeout is 30 s).
  int health_interval_seconds = 5;
  // The kubelet's connection to the DRA socket is closed after this long without a call (0:
  // never): before the kubelet's own 30-minute idle timer, which deadlocks kubelet 1.34.0.
  int close_idle_connections_seconds = 1200;
  std::string metrics_address = ":8080";  // empty: no metrics and health endpoint
  // The network namespace whose netdevs SR-IOV VFs are configured through; empty: the process's
  // own, which is the host's with hostNetwork (CAP_NET_ADMIN suffices then). /proc/1/ns/net with
  // hostPID is the host's without hostNetwork, at the cost of CAP_SYS_ADMIN and CAP_SYS_PTRACE.
  std::string host_netns;
  // Tests with a simulated sysfs tree: VF network settings live in files here instead of the
  // kernel (see vfio/vf_network.h). Empty: rtnetlink.
  std::string simulated_vf_network_dir;
};

// Fills defaults that depend on other options (plugin data dir) and validates every value.
// Errors name the flag: "--driver-name: ...".
Status FinalizeServeOptions(ServeOptions& options);

}  // namespace vfio_dra::cmd
