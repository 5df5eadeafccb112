// Stable names and identities of published devices. Names are DNS labels derived from what does
// not change across restarts and reboots (PCI addresses, mdev parent, type and index), and the
// UUIDs of potential mdev instances are name-based (UUID v5), so the same device keeps the same
// name and mdevUUID for as long as the hardware is the same.
#pragma once

#include <string>

#include "discovery/admin_policy.h"

namespace vfio_dra::slicepublisher {

// "gpu-0000-3b-00-0", "vf-0000-5e-02-3", "hostdev-10000-01-00-0".
std::string PciDeviceName(discovery::DeviceKind kind, const std::string& address);

// "mdev-0000-3b-00-0-nvidia-222-5" for potential (and our own) instances; long or unusual parent
// and type names are folded into a DNS label with a hash suffix so names stay unique.
std::string MdevDeviceName(const std::string& parent, const std::string& type_id, int index);

// An existing instance that vfio-dra did not create: "mdev-<uuid>".
std::string ForeignMdevDeviceName(const std::string& uuid);

// A vGPU of type `type_id` on the NVIDIA vGPU VF `vf`: "vgpu-0000-41-00-4-1414". The name is
// the same whether the vGPU is only offered or exists, so an allocated device keeps it.
std::string VgpuDeviceName(const std::string& vf, int type_id);
// The counter set of one GPU with NVIDIA vGPU VFs (how many vGPUs of its offered type it
// holds): "vgpu-gpu-0000-41-00-0".
std::string VgpuGpuCounterSetName(const std::string& pf);
// The counter set of a partitionable parent: "gpu-0000-3b-00-0" or "mdev-parent-mtty".
std::string CounterSetName(const std::string& parent, bool parent_is_pci);

// Deterministic UUID (v5) of potential instance `index` of `type_id` on `parent` of `node`.
std::string MdevInstanceUuid(const std::string& node, const std::string& parent,
                             const std::string& type_id, int index);

// Folds arbitrary text into a DNS label of at most `max` characters (lower case, [a-z0-9-],
// no leading/trailing '-'); when anything had to change or be cut, a short hash of the original
// is appended so that different inputs stay different.
std::string ToDnsLabel(const std::string& text, size_t max = 63);

}  // namespace vfio_dra::slicepublisher
