// PrepareCheckpoint::Upgrade: the version-1 checkpoint (every claim in one checkpoint.json)
// split into one record per claim, written as they were (the old boot ID included, so a reboot
// since is noticed); a corrupt file is moved aside.
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "base/file_io.h"
#include "base/k8s_names.h"
#include "prepare/checkpoint_aside.h"
#include "prepare/prepare_checkpoint.h"

namespace vfio_dra::prepare {

namespace {

using nlohmann::json;

}  // namespace

Result<int> PrepareCheckpoint::Upgrade(std::string* problem) const {
  const std::string path = data_dir_ + "/" + kLegacyCheckpointFile;
  auto text = ReadFileToString(path, 64 << 20);
  if (!text.ok()) {
    if (text.error().kind == ErrorKind::kNotFound) return 0;
    return text.error().Wrap("cannot read the version-1 prepare checkpoint to upgrade it");
  }
  std::vector<ClaimRecord> records;
  try {
    const json root = json::parse(*text);
    const int version = root.at("version").get<int>();
    if (version != 1) {
      throw json::other_error::create(
          502, "version " + std::to_string(version) + " where version 1 was expected", nullptr);
    }
    const std::string boot_id = root.at("bootID").get<std::string>();
    for (const auto& [uid, entry] : root.at("claims").items()) {
      records.push_back(RecordFromVersion1(uid, boot_id, entry));
    }
  } catch (const json::exception& e) {
    if (problem != nullptr) {
      *problem = UnusableText(path, e.what(), MoveToUniqueAside(path),
                              "claims prepared before cannot be undone automatically, check their "
                              "devices by hand");
    }
    return 0;
  }
  for (const ClaimRecord& record : records) {
    if (!IsObjectUid(record.uid)) continue;
    // Written as is: the boot ID stays the one of the old file, so a reboot since is noticed.
    auto record_text = RecordText(record);
    if (!record_text.ok()) return record_text.error().Wrap("upgrading the prepare checkpoint");
    auto records_lock = LockRecords(LockMode::kShared);
    if (!records_lock.ok()) return records_lock.error().Wrap("upgrading the prepare checkpoint");
    Status status =
        WriteFileAtomically(PathOf(record.uid), *record_text, 0600, Durability::kDurable, sync_);
    if (!status.ok()) return status.error().Wrap("upgrading the prepare checkpoint");
  }
  if (::unlink(path.c_str()) != 0) {
    return MakeError(ErrorKind::kUnavailable, "upgraded the prepare checkpoint " + path +
                                                  " but cannot remove it: " + ErrnoText(errno));
  }
  if (Status s = sync_.Directory(data_dir_); !s.ok()) return s.error();
  return static_cast<int>(records.size());
}

}  // namespace vfio_dra::prepare
