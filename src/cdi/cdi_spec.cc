#include "cdi/cdi_spec.h"

#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "base/file_io.h"

namespace vfio_dra::cdi {
namespace {

// ordered_json keeps the members in the order written (cdiVersion and kind first, as the CDI
// specification shows specs), for people reading the file; runtimes do not depend on the order.
using OrderedJson = nlohmann::ordered_json;

OrderedJson NodeJson(const DeviceNode& node) {
  OrderedJson out = OrderedJson::object();
  out["path"] = node.path;
  if (!node.host_path.empty() && node.host_path != node.path) out["hostPath"] = node.host_path;
  if (node.major && node.minor) {
    out["type"] = "c";
    out["major"] = *node.major;
    out["minor"] = *node.minor;
  }
  return out;
}

OrderedJson NodesJson(const std::vector<DeviceNode>& nodes) {
  OrderedJson out = OrderedJson::array();
  for (const DeviceNode& node : nodes) out.push_back(NodeJson(node));
  return out;
}

// What List finds and RemoveAll removes by prefix: spec files, never other files of the directory.
FileNamePattern SpecFilesStartingWith(const std::string& prefix) { return {prefix, ".json"}; }

}  // namespace

bool IsSafeFileName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (unsigned char c : name) {
    if (c == '/' || c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

std::string MinimumCdiVersion(const Spec& spec) {
  bool needs_050 = false;
  for (const Device& device : spec.devices) {
    if (!device.name.empty() && device.name[0] >= '0' && device.name[0] <= '9') needs_050 = true;
    for (const DeviceNode& node : device.device_nodes) {
      if (!node.host_path.empty() && node.host_path != node.path) needs_050 = true;
    }
  }
  for (const DeviceNode& node : spec.common_device_nodes) {
    if (!node.host_path.empty() && node.host_path != node.path) needs_050 = true;
  }
  return needs_050 ? "0.5.0" : "0.3.0";
}

Status ValidateSpec(const Spec& spec) {
  const size_t slash = spec.kind.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == spec.kind.size() ||
      spec.kind.find('/', slash + 1) != std::string::npos ||
      !std::isalpha(static_cast<unsigned char>(spec.kind[0]))) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "CDI kind \"" + spec.kind +
                         "\" must be vendor/class with a vendor starting "
                         "with a letter");
  }
  if (spec.devices.empty()) {
    return MakeError(ErrorKind::kInvalidArgument, "CDI spec " + spec.kind + " has no devices");
  }
  for (const Device& device : spec.devices) {
    if (device.name.empty()) {
      return MakeError(ErrorKind::kInvalidArgument, "CDI spec " + spec.kind + ": unnamed device");
    }
    for (char c : device.name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
          c != ':') {
        return MakeError(ErrorKind::kInvalidArgument,
                         "CDI device name \"" + device.name + "\" has a character CDI refuses");
      }
    }
    if (device.device_nodes.empty() && device.mounts.empty()) {
      return MakeError(ErrorKind::kInvalidArgument,
                       "CDI device " + device.name + " has no container edits");
    }
  }
  return Status::Ok();
}

std::string SpecText(const Spec& spec) {
  OrderedJson devices = OrderedJson::array();
  for (const Device& device : spec.devices) {
    OrderedJson edits = OrderedJson::object();
    if (!device.device_nodes.empty()) edits["deviceNodes"] = NodesJson(device.device_nodes);
    if (!device.mounts.empty()) {
      OrderedJson mounts = OrderedJson::array();
      for (const Mount& m : device.mounts) {
        OrderedJson mount = OrderedJson::object();
        mount["hostPath"] = m.host_path;
        mount["containerPath"] = m.container_path;
        mount["options"] = m.options;
        mounts.push_back(std::move(mount));
      }
      edits["mounts"] = std::move(mounts);
    }
    OrderedJson entry = OrderedJson::object();
    entry["name"] = device.name;
    entry["containerEdits"] = std::move(edits);
    devices.push_back(std::move(entry));
  }
  OrderedJson root = OrderedJson::object();
  root["cdiVersion"] = MinimumCdiVersion(spec);
  root["kind"] = spec.kind;
  root["devices"] = std::move(devices);
  if (!spec.common_device_nodes.empty()) {
    root["containerEdits"]["deviceNodes"] = NodesJson(spec.common_device_nodes);
  }
  // Bytes that are not UTF-8 (a path can hold any) go out as U+FFFD, so the file stays JSON a
  // runtime can load; the strict default would throw, and no exception may leave a prepare.
  return root.dump(2, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

std::string QualifiedDeviceId(const std::string& kind, const std::string& device_name) {
  return kind + "=" + device_name;
}

std::string TransientSpecFileName(const std::string& kind, const std::string& id) {
  std::string name = kind;
  for (char& c : name) {
    if (c == '/') c = '-';
  }
  std::string safe_id = id;
  for (char& c : safe_id) {
    if (c == '/') c = '_';
  }
  return name + "_" + safe_id + ".json";
}

Status SpecDirectory::Write(const std::string& file_name, const Spec& spec) const {
  if (!IsSafeFileName(file_name)) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "refusing CDI spec file name \"" + file_name + "\": not a single safe name");
  }
  if (Status s = ValidateSpec(spec); !s.ok()) return s;
  if (Status s = EnsureDirectory(dir_); !s.ok()) return s.error().Wrap("CDI directory");
  // Volatile: the CDI directory is tmpfs on a node (/var/run/cdi), and a spec only serves a
  // container started after this prepare in this boot; every prepare writes it again.
  return WriteFileAtomically(PathOf(file_name), SpecText(spec), file_mode_, Durability::kVolatile);
}

Status SpecDirectory::Remove(const std::string& file_name) const { return RemoveAll({file_name}); }

Status SpecDirectory::RemoveAll(const std::vector<std::string>& file_names,
                                const std::vector<std::string>& prefixes) const {
  // An unsafe name (from a damaged checkpoint record) is refused, and the others still go.
  std::optional<Error> refused;
  const auto refuse = [&](const std::string& what, const std::string& name) {
    if (!refused) {
      refused = MakeError(ErrorKind::kInvalidArgument, "refusing CDI spec file " + what + " \"" +
                                                           name + "\": not a single safe name");
    }
  };
  std::vector<std::string> safe_names;
  for (const std::string& file_name : file_names) {
    if (IsSafeFileName(file_name)) {
      safe_names.push_back(file_name);
    } else {
      refuse("name", file_name);
    }
  }
  std::vector<FileNamePattern> patterns;
  for (const std::string& prefix : prefixes) {
    if (IsSafeFileName(prefix)) {
      patterns.push_back(SpecFilesStartingWith(prefix));
    } else {
      refuse("name prefix", prefix);
    }
  }
  if (Status s = RemoveFilesAndTemporaries(dir_, safe_names, patterns); !s.ok()) {
    return s.error().Wrap("cannot remove CDI specs of " + dir_);
  }
  return refused ? Status(*refused) : Status::Ok();
}

Result<std::vector<std::string>> SpecDirectory::List(const std::string& prefix) const {
  std::vector<std::string> out;
  DIR* dir = ::opendir(dir_.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT) return out;
    return MakeError(ErrorKind::kUnavailable, "cannot list " + dir_ + ": " + ErrnoText(errno));
  }
  std::set<std::string> names;
  const FileNamePattern spec_file = SpecFilesStartingWith(prefix);
  while (const dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    // A write cut short by a crash leaves ".<name>.tmp-<n>": it stands for <name>, whose Remove
    // takes it along.
    if (name.size() > 1 && name[0] == '.') {
      const auto stands_for = TemporaryFileStandsFor(name);
      if (!stands_for) continue;
      name = std::string(*stands_for);
    }
    if (spec_file.Matches(name)) names.insert(name);
  }
  ::closedir(dir);
  out.assign(names.begin(), names.end());
  return out;
}

}  // namespace vfio_dra::cdi
