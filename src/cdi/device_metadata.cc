#include "cdi/device_metadata.h"

#include <sys/stat.h>

#include <filesystem>

#include "base/file_io.h"
#include "base/k8s_names.h"
#include "base/text.h"

namespace vfio_dra::cdi {
namespace {

Error BadName(const std::string& what, const std::string& value) {
  return MakeError(ErrorKind::kInvalidArgument, "refusing device metadata for " + what + " \"" +
                                                    EscapeForDisplay(value, 80) +
                                                    "\": not a valid Kubernetes name");
}

// The directory, readable by virt-launcher (not root) whatever the umask; once it is there, one
// stat per write.
Status MakeDirs(const std::filesystem::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0755) {
    return Status::Ok();
  }
  if (Status s = EnsureDirectory(dir.string()); !s.ok()) return s;
  ::chmod(dir.c_str(), 0755);
  return Status::Ok();
}

}  // namespace

// ordered_json keeps the members in the order written (apiVersion and kind first, as Kubernetes
// objects are shown), for people reading the file; virt-launcher does not depend on the order.
std::string DeviceMetadataText(const RequestMetadata& metadata) {
  using OrderedJson = nlohmann::ordered_json;
  OrderedJson devices = OrderedJson::array();
  for (const MetadataDevice& device : metadata.devices) {
    OrderedJson attributes = OrderedJson::object();
    for (const auto& [name, value] : device.attributes) attributes[name] = OrderedJson(value);
    OrderedJson entry = OrderedJson::object();
    entry["driver"] = device.driver;
    entry["pool"] = device.pool;
    entry["name"] = device.name;
    entry["attributes"] = std::move(attributes);
    devices.push_back(std::move(entry));
  }
  OrderedJson request = OrderedJson::object();
  request["name"] = metadata.request;
  request["devices"] = std::move(devices);
  OrderedJson object_meta = OrderedJson::object();
  object_meta["name"] = metadata.claim_name;
  object_meta["namespace"] = metadata.claim_namespace;
  object_meta["uid"] = metadata.claim_uid;
  object_meta["generation"] = metadata.generation;
  OrderedJson root = OrderedJson::object();
  root["apiVersion"] = kMetadataApiVersion;
  root["kind"] = "DeviceMetadata";
  root["metadata"] = std::move(object_meta);
  if (metadata.pod_claim_name) root["podClaimName"] = *metadata.pod_claim_name;
  OrderedJson requests = OrderedJson::array();
  requests.push_back(std::move(request));
  root["requests"] = std::move(requests);
  // Bytes that are not UTF-8 (in a published attribute, say) go out as U+FFFD, so the file stays
  // JSON virt-launcher can read; the strict default would throw, and no exception may leave a
  // prepare.
  return root.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

Status MetadataStore::CheckNames(const RequestMetadata& metadata) const {
  if (!IsDnsLabel(metadata.claim_namespace)) return BadName("namespace", metadata.claim_namespace);
  if (!IsDnsSubdomain(metadata.claim_name)) return BadName("claim", metadata.claim_name);
  if (!IsObjectUid(metadata.claim_uid)) return BadName("claim uid", metadata.claim_uid);
  if (!IsDnsLabel(metadata.request)) return BadName("request", metadata.request);
  if (metadata.pod_claim_name && !IsDnsLabel(*metadata.pod_claim_name)) {
    return BadName("pod claim name", *metadata.pod_claim_name);
  }
  return Status::Ok();
}

std::string MetadataStore::BaseDirectory() const {
  return plugin_data_dir_ + "/" + kHostMetadataDirectory;
}

std::string MetadataStore::HostPath(const RequestMetadata& metadata) const {
  return BaseDirectory() + "/" + metadata.claim_uid + "_" + metadata.request + ".json";
}

std::string MetadataStore::ContainerPath(const RequestMetadata& metadata) const {
  const std::string claim = metadata.pod_claim_name
                                ? "resourceclaimtemplates/" + *metadata.pod_claim_name
                                : "resourceclaims/" + metadata.claim_name;
  return std::string(kContainerMetadataBase) + "/" + claim + "/" + metadata.request + "/" +
         driver_ + "-metadata.json";
}

std::string MetadataStore::CdiFileName(const std::string& claim_uid,
                                       const std::string& request) const {
  return driver_ + "_metadata_" + claim_uid + "_" + request + ".json";
}

std::string MetadataStore::CdiDeviceId(const std::string& claim_uid,
                                       const std::string& request) const {
  return QualifiedDeviceId(driver_ + "/metadata", claim_uid + "_" + request);
}

Result<std::string> MetadataStore::Write(const RequestMetadata& metadata) const {
  if (Status s = CheckNames(metadata); !s.ok()) return s.error();
  const std::filesystem::path host(HostPath(metadata));
  if (Status s = MakeDirs(host.parent_path()); !s.ok()) return s.error();
  // Volatile for the same reason as the CDI spec that mounts it: it is read only by a container
  // started after this prepare in this boot, and every prepare (the kubelet's after a reboot too)
  // writes it again.
  if (Status s = WriteFileAtomically(host.string(), DeviceMetadataText(metadata) + "\n", 0644,
                                     Durability::kVolatile);
      !s.ok()) {
    return s.error();
  }
  Spec spec;
  spec.kind = driver_ + "/metadata";
  Device device;
  device.name = metadata.claim_uid + "_" + metadata.request;
  device.mounts.push_back(Mount{host.string(), ContainerPath(metadata), {"ro", "bind"}});
  spec.devices.push_back(device);
  if (Status s = cdi_.Write(CdiFileName(metadata.claim_uid, metadata.request), spec); !s.ok()) {
    return s.error();
  }
  return CdiDeviceId(metadata.claim_uid, metadata.request);
}

Result<std::set<std::string>> MetadataStore::ClaimUidsOnDisk() const {
  std::set<std::string> uids;
  std::error_code ec;
  // increment(ec): the operator++ of a range-for throws on an I/O error.
  for (std::filesystem::directory_iterator it(BaseDirectory(), ec), end; !ec && it != end;
       it.increment(ec)) {
    // "<uid>_<request>.json", its temporary ".<uid>_<request>.json.tmp-<n>", or a directory
    // "<uid>" of the previous layout; not the oldest layout's "<namespace>_<claim>" directories.
    std::string name = it->path().filename().string();
    std::error_code type_ec;
    const bool directory = it->is_directory(type_ec);
    if (!directory && !name.empty() && name[0] == '.') name.erase(0, 1);
    const size_t underscore = name.find('_');
    const std::string uid = directory ? name : name.substr(0, underscore);
    const bool file_name_fits =
        underscore != std::string::npos && name.find(".json", underscore) != std::string::npos;
    if (IsObjectUid(uid) && (directory || file_name_fits)) uids.insert(uid);
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot list " + BaseDirectory() + ": " + ec.message());
  }
  return uids;
}

Status MetadataStore::RemoveHostFiles(const std::string& claim_uid) const {
  if (!IsObjectUid(claim_uid)) return BadName("claim uid", claim_uid);
  // This layout: <uid>_<request>.json, and the temporary file a write cut short left.
  const std::string base = BaseDirectory() + "/";
  const std::string own = claim_uid + "_";
  std::error_code ec;
  for (std::filesystem::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (name.rfind(own, 0) != 0 && name.rfind("." + own, 0) != 0) continue;
    // Only files: a directory of the oldest layout is "<namespace>_<claim>", and a namespace may
    // look like a UID.
    std::error_code removed;
    if (!entry.is_regular_file(removed)) continue;
    std::filesystem::remove(entry.path(), removed);
    if (removed) {
      return MakeError(ErrorKind::kUnavailable,
                       "cannot remove " + entry.path().string() + ": " + removed.message());
    }
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return MakeError(ErrorKind::kUnavailable, "cannot list " + base + ": " + ec.message());
  }
  // The layout before: <uid>/<request>/metadata.json (claims prepared by an earlier version).
  const std::string dir = base + claim_uid;
  ec.clear();
  std::filesystem::remove_all(dir, ec);
  if (ec) return MakeError(ErrorKind::kUnavailable, "cannot remove " + dir + ": " + ec.message());
  return Status::Ok();
}

Status MetadataStore::RemoveClaim(const std::string& claim_namespace, const std::string& claim_name,
                                  const std::string& claim_uid,
                                  const std::vector<std::string>& other_cdi_files) const {
  if (!IsObjectUid(claim_uid)) return BadName("claim uid", claim_uid);
  // Everything named by the UID goes even when something else cannot (a spec that cannot be
  // removed, a damaged record's namespace or name): each is tried, the first failure reported.
  Status specs_removed =
      cdi_.RemoveAll(other_cdi_files, {driver_ + "_metadata_" + claim_uid + "_"});
  if (Status s = RemoveHostFiles(claim_uid); !s.ok()) return specs_removed.ok() ? s : specs_removed;
  if (!specs_removed.ok()) return specs_removed;
  if (!IsDnsLabel(claim_namespace)) return BadName("namespace", claim_namespace);
  if (!IsDnsSubdomain(claim_name)) return BadName("claim", claim_name);
  const std::string base = BaseDirectory() + "/";
  std::error_code ec;
  // The earlier layout kept a claim's files under <namespace>_<claim>; that name may now be a
  // re-created claim's, so the directory goes only when every file in it is this UID's.
  const std::string legacy = base + claim_namespace + "_" + claim_name;
  if (!std::filesystem::is_directory(legacy, ec)) return Status::Ok();
  for (std::filesystem::directory_iterator it(legacy, ec), end; !ec && it != end;
       it.increment(ec)) {
    auto text = ReadFileToString((it->path() / "metadata.json").string(), 1 << 20);
    if (!text.ok()) continue;
    const auto json = nlohmann::json::parse(*text, nullptr, false);
    if (json.is_discarded() || !json.contains("metadata") || !json["metadata"].is_object() ||
        json["metadata"].value("uid", "") != claim_uid) {
      return Status::Ok();
    }
  }
  std::filesystem::remove_all(legacy, ec);
  if (ec) {
    return MakeError(ErrorKind::kUnavailable, "cannot remove " + legacy + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace vfio_dra::cdi
