#include "cmd/metric_catalog.h"

namespace vfio_dra::cmd {

void DeclareMetricCatalog(MetricsRegistry& metrics) {
  // The kubelet-facing service (plugin::DraNodeService).
  metrics.DeclareCounter("vfio_dra_requests_total",
                         "kubelet calls by method (NodePrepareResources, NodeUnprepareResources)");
  metrics.DeclareCounter(
      "vfio_dra_claims_total",
      "claims handled, by operation (prepare, unprepare) and result (ok, error)");
  metrics.DeclareHistogram("vfio_dra_claim_duration_seconds",
                           "time to prepare or unprepare one claim, including the wait for the "
                           "node's device lock");
  // Device work (prepare::VfioDevicePreparer).
  metrics.DeclareHistogram("vfio_dra_device_operation_duration_seconds",
                           "time of one device operation: bind (to vfio-pci), restore (to the "
                           "original driver), mdev_create, mdev_remove, vgpu_create, vgpu_remove");
  metrics.DeclareCounter("vfio_dra_device_operation_errors_total",
                         "device operations that failed, by operation");
  // Publication and state, read at scrape time (ServeDaemon's collector).
  metrics.DeclareGauge("vfio_dra_published_devices",
                       "devices in this node's ResourceSlices, by kind");
  metrics.DeclareCounter("vfio_dra_slice_writes_total",
                         "ResourceSlice writes, by operation (create, update, delete)");
  metrics.DeclareCounter("vfio_dra_slice_syncs_total",
                         "ResourceSlice syncs, by result (ok, error)");
  metrics.DeclareCounter("vfio_dra_device_scans_total",
                         "Full scans of the node's devices, by cause (event: a uevent or an "
                         "unprepare that asked for one; other: the start and periodic checks)");
  metrics.DeclareCounter("vfio_dra_device_checks_total",
                         "Periodic checks of the node's devices (a probe, and a full scan when it "
                         "saw a change)");
  metrics.DeclareGauge("vfio_dra_privilege_missing",
                       "1 for each privilege the features of this node's devices need and the "
                       "plugin lacks, by feature and privilege (the start-up log says how to "
                       "grant it)");
  metrics.DeclareGauge("vfio_dra_checkpoint_claims", "claims in the prepare checkpoint, by state");
  metrics.DeclareGauge("vfio_dra_claim_status_pending",
                       "claims whose status.devices write has not landed yet (retried in the "
                       "background)");
  metrics.DeclareCounter("vfio_dra_claim_status_writes_total",
                         "claim status writes, by result (ok; error: failed, retried; given_up: "
                         "the claim is gone or the server refuses it for good)");
}

}  // namespace vfio_dra::cmd
