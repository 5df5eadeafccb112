// The checkpoint record's file format: a ClaimRecord as JSON text and back, the version-1 entries
// (all claims in one file) read for the upgrade. Written members keep the order docs/checkpoint.md
// shows; readers do not depend on it. Parsing throws nlohmann::json exceptions on a wrong shape,
// which the store turns into "corrupt" for the record's file; they never leave the store.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/result.h"
#include "prepare/claim_record.h"

namespace vfio_dra::prepare {

// 3: records that hold vGPUs on NVIDIA vGPU VFs. Records without are still written as version 2,
// which builds before vGPU VFs read; a record with vGPUs is of a newer version to them, so they
// leave it in place instead of moving it aside as corrupt (and forgetting the vGPU).
inline constexpr int kCheckpointVersion = 3;
inline constexpr int kCheckpointVersionWithoutVgpus = 2;

// The record file's text. An error when a value is not UTF-8 (a driver name or driver_override
// read from sysfs can be any bytes): it would be recorded as something else, and undone wrongly.
Result<std::string> RecordText(const ClaimRecord& r);
// A record file's parsed JSON as a record (of version 2 or 3). Throws nlohmann::json exceptions.
ClaimRecord RecordFromJson(const nlohmann::json& root);
// A version-1 entry: the answer was raw JSON and devices carried no plan. Throws like
// RecordFromJson.
ClaimRecord RecordFromVersion1(const std::string& uid, const std::string& boot_id,
                               const nlohmann::json& j);

}  // namespace vfio_dra::prepare
