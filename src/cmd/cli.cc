#include "cmd/cli.h"

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "cmd/discover_command.h"
#include "cmd/malloc_tuning.h"
#include "cmd/serve_command.h"
#include "cmd/serve_options.h"
#include "cmd/slices_command.h"

namespace {

using vfio_dra::cmd::ServeOptions;

constexpr const char* kModulesAliasHelp =
    "the kernel's modules.alias, for VFIO variant drivers (default: "
    "/lib/modules/<release>/modules.alias when --sysfs-root is /sys)";

void AddServeFlags(CLI::App& serve, ServeOptions& o) {
  serve
      .add_option("--driver-name", o.driver_name,
                  "DRA driver name: the ResourceSlice spec.driver and the kubelet plugin name "
                  "(a lower-case DNS subdomain of at most 63 characters)")
      ->capture_default_str();
  serve.add_option("--node-name", o.node_name, "name of this node (required)")
      ->envname("NODE_NAME");
  serve.add_option("--kubeconfig", o.kubeconfig,
                   "kubeconfig file; default: $KUBECONFIG, else the in-cluster service account");
  serve.add_option("--sysfs-root", o.sysfs_root, "where sysfs is mounted")->capture_default_str();
  serve.add_option("--dev-root", o.dev_root, "where /dev is mounted")->capture_default_str();
  serve.add_option("--registrar-dir", o.registrar_dir, "kubelet plugin registration directory")
      ->capture_default_str();
  serve.add_option("--plugin-data-dir", o.plugin_data_dir,
                   "directory for the DRA socket and the plugin's state "
                   "(default /var/lib/kubelet/plugins/<driver-name>)");
  serve.add_option("--cdi-dir", o.cdi_dir, "directory for CDI specs")->capture_default_str();
  serve.add_option("--config", o.config_file, "admin policy file (YAML); default: built-in policy");
  serve.add_option("--pci-ids", o.pci_ids, "pci.ids file for device names")->capture_default_str();
  serve.add_option("--modules-alias", o.modules_alias, kModulesAliasHelp);
  serve
      .add_option("--rescan-interval", o.rescan_interval_seconds,
                  "seconds between checks for device changes (a cheap probe; a full rescan when "
                  "it sees one and at least every 10 minutes; uevents trigger rescans too)")
      ->capture_default_str();
  serve
      .add_option("--pod-uid", o.pod_uid,
                  "UID of this pod; makes socket names unique so that two instances can overlap "
                  "in a rolling update (needs a 1.33+ kubelet)")
      ->envname("POD_UID");
  serve.add_option("--kube-api-qps", o.kube_api_qps, "client-side API rate limit (queries/s)")
      ->capture_default_str();
  serve.add_option("--kube-api-burst", o.kube_api_burst, "client-side API burst")
      ->capture_default_str();
  serve
      .add_option("--claim-api-qps", o.claim_api_qps,
                  "client-side rate limit for ResourceClaim reads during prepare (queries/s)")
      ->capture_default_str();
  serve.add_option("--claim-api-burst", o.claim_api_burst, "burst for ResourceClaim reads")
      ->capture_default_str();
  serve.add_option("--host-netns", o.host_netns,
                   "network namespace (a path like /proc/1/ns/net) in which SR-IOV PFs are "
                   "configured, entered with setns (CAP_SYS_ADMIN; another process's also needs "
                   "CAP_SYS_PTRACE); default: the plugin's own, the host's with hostNetwork "
                   "(then CAP_NET_ADMIN is all VF settings need)");
  serve
      .add_option("--simulated-vf-network-dir", o.simulated_vf_network_dir,
                  "for tests with a simulated sysfs tree: keep VF network settings in files here "
                  "instead of setting them with rtnetlink")
      ->group("");  // not for production; hidden from --help
  serve
      .add_option("--metrics-address", o.metrics_address,
                  "host:port (or :port) for /metrics, /healthz and /livez; empty: none")
      ->capture_default_str();
  serve
      .add_option("--unbind-timeout", o.unbind_timeout_seconds,
                  "seconds an unbind from a driver may block before the claim fails (the device "
                  "is probably still in use)")
      ->capture_default_str();
  serve
      .add_option("--health-interval", o.health_interval_seconds,
                  "seconds between full device lists on the kubelet's health stream")
      ->capture_default_str();
  serve
      .add_option("--close-idle-connections", o.close_idle_connections_seconds,
                  "seconds without a call after which the kubelet's connection to the DRA socket "
                  "is closed (it reconnects on its next call; below 1800 this avoids kubelet "
                  "1.34.0's deadlock on idle connections); 0: never")
      ->capture_default_str();
  serve.add_option("-v,--v", o.verbosity, "log verbosity (0: info; 2: API retries; 4: gRPC calls)")
      ->capture_default_str();
}

}  // namespace

namespace vfio_dra::cmd {

int RunCli(int argc, char** argv, const ServeEnvironment& environment) {
  vfio_dra::cmd::BlockShutdownSignals();
  CLI::App app{
      "vfio-dra-plugin: Kubernetes DRA kubelet plugin for VM passthrough devices "
      "(PCI GPUs, mediated devices, SR-IOV VFs)",
      "vfio-dra-plugin"};
  app.require_subcommand(1);
  ServeOptions options;
  CLI::App* serve = app.add_subcommand("serve", "run the kubelet plugin daemon");
  AddServeFlags(*serve, options);
  CLI::App* version = app.add_subcommand("version", "print the version");
  vfio_dra::cmd::DiscoverOptions discover_options;
  CLI::App* discover = app.add_subcommand(
      "discover",
      "show the node's devices, what would be published as what, and why not (read only)");
  discover->add_option("--sysfs-root", discover_options.sysfs_root, "where sysfs is mounted")
      ->capture_default_str();
  discover->add_option("--config", discover_options.config_file, "admin policy file (YAML)");
  discover->add_option("-o,--output", discover_options.output, "output format")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  discover->add_option("--pci-ids", discover_options.pci_ids, "pci.ids file for device names")
      ->capture_default_str();
  discover->add_option("--modules-alias", discover_options.modules_alias, kModulesAliasHelp);
  discover
      ->add_option("--dev-root", discover_options.dev_root,
                   "where /dev is mounted (as for serve; for the privilege check)")
      ->capture_default_str();
  discover->add_option("--host-netns", discover_options.host_netns,
                       "the network namespace serve is given (for the privilege check)");
  discover
      ->add_option("--process-status", discover_options.process_status,
                   "for tests: read the effective capabilities from this file")
      ->group("");  // not for production; hidden from --help
  discover->add_flag("--no-write-probes", discover_options.no_write_probes,
                     "never open a sysfs attribute for writing: leave sysfs write access out of "
                     "the privilege check (it opens one attribute of each kind the plugin writes, "
                     "and writes nothing)");

  vfio_dra::cmd::SlicesOptions slices_options;
  CLI::App* slices = app.add_subcommand(
      "slices", "print the ResourceSlices this node would publish (offline, read only)");
  slices->add_option("--sysfs-root", slices_options.sysfs_root, "where sysfs is mounted")
      ->capture_default_str();
  slices->add_option("--config", slices_options.config_file, "admin policy file (YAML)");
  slices->add_option("--node-name", slices_options.node_name,
                     "node name (default: $NODE_NAME, else the host name)");
  slices->add_option("--driver-name", slices_options.driver_name, "DRA driver name")
      ->capture_default_str();
  slices
      ->add_option("--kubernetes-version", slices_options.kubernetes_version,
                   "target Kubernetes release (decides the counter layout)")
      ->capture_default_str();
  slices->add_option("--api-version", slices_options.api_version, "resource.k8s.io version")
      ->check(CLI::IsMember({"v1", "v1beta2", "v1beta1"}))
      ->capture_default_str();
  slices->add_option("-o,--output", slices_options.output, "output format")
      ->check(CLI::IsMember({"yaml", "json"}))
      ->capture_default_str();
  slices->add_option("--pci-ids", slices_options.pci_ids, "pci.ids file for device names")
      ->capture_default_str();
  slices->add_option("--modules-alias", slices_options.modules_alias, kModulesAliasHelp);
  slices->add_option("--plugin-data-dir", slices_options.plugin_data_dir,
                     "the daemon's data directory, for the mdev type maxima it learned (read only; "
                     "default /var/lib/kubelet/plugins/<driver-name>)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "vfio-dra-plugin: " << e.what() << " (see --help)" << std::endl;
    return 2;
  }

  if (version->parsed()) {
    std::cout << "vfio-dra-plugin " << vfio_dra::cmd::PluginVersion() << std::endl;
    return 0;
  }
  if (discover->parsed()) return vfio_dra::cmd::RunDiscover(discover_options);
  if (slices->parsed()) return vfio_dra::cmd::RunSlices(slices_options);
  if (serve->parsed()) {
    if (auto status = vfio_dra::cmd::FinalizeServeOptions(options); !status.ok()) {
      std::cerr << "vfio-dra-plugin serve: " << status.error().message << std::endl;
      return 2;
    }
    // Before any thread starts: normally this process is replaced here by one with the deeper
    // malloc thread cache (see malloc_tuning.h), which parses the same flags again.
    const std::optional<std::string> malloc_problem = vfio_dra::cmd::TuneMallocForServe(argv);
    return vfio_dra::cmd::RunServe(options, environment, malloc_problem);
  }
  return 2;
}

}  // namespace vfio_dra::cmd
