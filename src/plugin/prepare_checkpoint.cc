#include "plugin/prepare_checkpoint.h"

#include <cstdio>
#include <ctime>

#include "base/file_io.h"

namespace vfio_dra::plugin {
namespace {

using nlohmann::json;

json ToJson(const ClaimRecord& r) {
  json functions = json::array();
  for (const auto& f : r.functions) {
    functions.push_back({{"address", f.address},
                         {"originalDriver", f.driver},
                         {"originalOverride", f.override},
                         {"wasOnVfio", f.was_on_vfio}});
  }
  json mdevs = json::array();
  for (const auto& m : r.mdevs) {
    mdevs.push_back({{"parent", m.parent},
                     {"type", m.type_id},
                     {"uuid", m.uuid},
                     {"createdByUs", m.created_by_us}});
  }
  return {
      {"namespace", r.namespace_},
      {"name", r.name},
      {"state", r.state == PrepareState::kPrepareCompleted ? "PrepareCompleted" : "PrepareStarted"},
      {"functions", functions},
      {"mdevs", mdevs},
      {"cdiFiles", r.cdi_files},
      {"response", r.response}};
}

// Throws nlohmann::json exceptions on a wrong shape; the caller turns them into "corrupt".
ClaimRecord FromJson(const std::string& uid, const json& j) {
  ClaimRecord r;
  r.uid = uid;
  r.namespace_ = j.at("namespace").get<std::string>();
  r.name = j.at("name").get<std::string>();
  const std::string state = j.at("state").get<std::string>();
  if (state != "PrepareStarted" && state != "PrepareCompleted") {
    throw json::other_error::create(501, "unknown state " + state, nullptr);
  }
  r.state =
      state == "PrepareCompleted" ? PrepareState::kPrepareCompleted : PrepareState::kPrepareStarted;
  for (const json& f : j.at("functions")) {
    r.functions.push_back(FunctionRecord{
        f.at("address").get<std::string>(), f.at("originalDriver").get<std::string>(),
        f.at("originalOverride").get<std::string>(), f.at("wasOnVfio").get<bool>()});
  }
  for (const json& m : j.at("mdevs")) {
    r.mdevs.push_back(MdevRecord{m.at("parent").get<std::string>(), m.at("type").get<std::string>(),
                                 m.at("uuid").get<std::string>(), m.at("createdByUs").get<bool>()});
  }
  r.cdi_files = j.at("cdiFiles").get<std::vector<std::string>>();
  r.response = j.at("response");
  return r;
}

// The answer is informational, so a field of the wrong type reads as absent instead of throwing.
std::string StringField(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::vector<PreparedTarget> PreparedTargets(const PrepareCheckpoint& checkpoint) {
  std::vector<PreparedTarget> out;
  for (const auto& [uid, record] : checkpoint.claims()) {
    if (record.state != PrepareState::kPrepareCompleted || !record.response.is_array()) continue;
    for (const json& entry : record.response) {
      if (!entry.is_object()) continue;
      PreparedTarget target;
      target.claim = record.namespace_ + "/" + record.name;
      target.pool = StringField(entry, "pool");
      target.device = StringField(entry, "device");
      target.mdev_uuid = StringField(entry, "mdevUUID");
      if (auto it = entry.find("functions"); it != entry.end() && it->is_array()) {
        for (const json& f : *it) {
          if (f.is_string()) target.functions.push_back(f.get<std::string>());
        }
      } else if (target.mdev_uuid.empty()) {
        for (const FunctionRecord& f : record.functions) target.functions.push_back(f.address);
      }
      out.push_back(std::move(target));
    }
  }
  return out;
}

Result<std::string> ReadBootId(const std::string& path) {
  auto text = ReadFileToString(path, 4096);
  if (!text.ok()) return text.error().Wrap("cannot read the boot ID");
  std::string id = *text;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

Result<PrepareCheckpoint> PrepareCheckpoint::Load(const std::string& path,
                                                  const std::string& boot_id,
                                                  std::string* problem) {
  PrepareCheckpoint checkpoint(path, boot_id);
  auto text = ReadFileToString(path, 64 << 20);
  if (!text.ok()) {
    if (text.error().kind == ErrorKind::kNotFound) return checkpoint;
    return text.error().Wrap("cannot read the prepare checkpoint");
  }
  std::string reason;
  try {
    const json root = json::parse(*text);
    const int version = root.at("version").get<int>();
    if (version != kCheckpointVersion) {
      reason = "unknown checkpoint version " + std::to_string(version) + " (this build reads " +
               std::to_string(kCheckpointVersion) + ")";
    } else {
      checkpoint.stored_boot_id_ = root.at("bootID").get<std::string>();
      for (const auto& [uid, entry] : root.at("claims").items()) {
        checkpoint.claims_[uid] = FromJson(uid, entry);
      }
      return checkpoint;
    }
  } catch (const json::exception& e) {
    reason = std::string("corrupt checkpoint: ") + e.what();
  }
  const std::string aside = path + ".corrupt-" + std::to_string(std::time(nullptr));
  if (std::rename(path.c_str(), aside.c_str()) != 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "the prepare checkpoint " + path + " is unusable (" + reason +
                         ") and cannot be moved aside: " + ErrnoText(errno));
  }
  if (problem != nullptr) {
    *problem = "the prepare checkpoint " + path + " is unusable (" + reason + "); moved it to " +
               aside +
               " and started with an empty one: claims prepared before cannot be undone "
               "automatically, check their devices by hand";
  }
  checkpoint.claims_.clear();
  checkpoint.stored_boot_id_.clear();
  return checkpoint;
}

const ClaimRecord* PrepareCheckpoint::Find(const std::string& uid) const {
  auto it = claims_.find(uid);
  return it == claims_.end() ? nullptr : &it->second;
}

Status PrepareCheckpoint::Put(const ClaimRecord& record) {
  const auto previous = claims_.find(record.uid);
  const std::optional<ClaimRecord> old =
      previous == claims_.end() ? std::nullopt : std::optional<ClaimRecord>(previous->second);
  claims_[record.uid] = record;
  Status status = Save();
  if (!status.ok()) {
    // Memory must not claim what the disk does not hold.
    if (old) {
      claims_[record.uid] = *old;
    } else {
      claims_.erase(record.uid);
    }
  }
  return status;
}

Status PrepareCheckpoint::Remove(const std::string& uid) {
  auto it = claims_.find(uid);
  if (it == claims_.end()) return Status::Ok();
  ClaimRecord old = it->second;
  claims_.erase(it);
  Status status = Save();
  if (!status.ok()) claims_[uid] = std::move(old);
  return status;
}

Status PrepareCheckpoint::Save() {
  json claims = json::object();
  for (const auto& [uid, record] : claims_) claims[uid] = ToJson(record);
  const json root = {{"version", kCheckpointVersion}, {"bootID", boot_id_}, {"claims", claims}};
  Status status = WriteFileAtomically(path_, root.dump(1) + "\n", 0600);
  if (status.ok()) stored_boot_id_ = boot_id_;
  return status.ok() ? status : Status(status.error().Wrap("cannot write the prepare checkpoint"));
}

}  // namespace vfio_dra::plugin
