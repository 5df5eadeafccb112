// The per-request device metadata file of KEP-5304 that KubeVirt's virt-launcher (v1.8.3+) reads
// to find a device's PCI address or mdev UUID, and the CDI spec that bind-mounts it into the
// container:
//   host:      <plugin-data-dir>/dra-device-metadata/<claimUID>_<request>.json (by UID: a claim
//              deleted and re-created under the same name is another claim, and neither may
//              overwrite or remove the other's file; one flat directory, because a directory
//              per claim and request cost a mkdir and an rmdir each, on the node's disk, for
//              every VM)
//   container: /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/
//              <driver>-metadata.json (resourceclaimtemplates/<podClaimName>/... for template
//              claims)
//   CDI:       <cdi-dir>/<driver>_metadata_<claimUID>_<request>.json, kind <driver>/metadata,
//              device <claimUID>_<request>
// The file is a JSON stream: one metadata.resource.k8s.io/v1alpha1 DeviceMetadata object and a
// newline. Every path component comes from validated names; anything else is refused.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "cdi/cdi_spec.h"

namespace vfio_dra::cdi {

inline constexpr const char* kMetadataApiVersion = "metadata.resource.k8s.io/v1alpha1";
inline constexpr const char* kHostMetadataDirectory = "dra-device-metadata";
inline constexpr const char* kContainerMetadataBase =
    "/var/run/kubernetes.io/dra-device-attributes";

struct MetadataDevice {
  std::string driver;
  std::string pool;
  std::string name;
  // Attribute name -> DeviceAttribute JSON ({"string": ...}, {"int": ...}), as published.
  std::map<std::string, nlohmann::json> attributes;
};

struct RequestMetadata {
  std::string claim_namespace;
  std::string claim_name;
  std::string claim_uid;
  std::optional<std::string> pod_claim_name;  // template claims: the pod-local claim name
  std::string request;                        // base request name
  std::vector<MetadataDevice> devices;
  int64_t generation = 1;
};

// The DeviceMetadata object (without the trailing newline of the stream).
std::string DeviceMetadataText(const RequestMetadata& metadata);

class MetadataStore {
 public:
  MetadataStore(std::string plugin_data_dir, SpecDirectory cdi, std::string driver)
      : plugin_data_dir_(std::move(plugin_data_dir)),
        cdi_(std::move(cdi)),
        driver_(std::move(driver)) {}

  std::string HostPath(const RequestMetadata& metadata) const;
  std::string ContainerPath(const RequestMetadata& metadata) const;
  std::string CdiFileName(const std::string& claim_uid, const std::string& request) const;
  std::string CdiDeviceId(const std::string& claim_uid, const std::string& request) const;

  // Writes the metadata file (directory 0755, file 0644, atomically), then its CDI spec. Returns
  // the CDI device ID to append to the request's first device.
  Result<std::string> Write(const RequestMetadata& metadata) const;
  // Removes every metadata file and metadata CDI spec of the claim; succeeds when none exist.
  // Files of the previous layout (<uid>/<request>/metadata.json) go too; a directory of the one
  // before (<namespace>_<claim>) is removed only when the files in it belong to this claim's UID.
  // `other_cdi_files` (the claim's other specs in the same CDI directory, in the order to remove
  // them) go first, in the same one pass over that directory. What the UID names goes even when
  // the namespace or name is refused (the error names it) or another file cannot be removed.
  Status RemoveClaim(const std::string& claim_namespace, const std::string& claim_name,
                     const std::string& claim_uid,
                     const std::vector<std::string>& other_cdi_files = {}) const;
  // The claim UIDs that have metadata files on the host (files of this layout, their temporary
  // files, directories of the previous one), to find those no prepared claim owns.
  Result<std::set<std::string>> ClaimUidsOnDisk() const;
  // Removes a claim's metadata files on the host (this layout and the previous one), not its
  // CDI specs.
  Status RemoveHostFiles(const std::string& claim_uid) const;

 private:
  Status CheckNames(const RequestMetadata& metadata) const;
  std::string BaseDirectory() const;

  std::string plugin_data_dir_;
  SpecDirectory cdi_;
  std::string driver_;
};

}  // namespace vfio_dra::cdi
