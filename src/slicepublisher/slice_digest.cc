#include "slicepublisher/slice_digest.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "slicepublisher/slice_json.h"

namespace vfio_dra::slicepublisher {
namespace {

std::string NameList(const SliceContent& content) {
  std::vector<std::string> names;
  names.reserve(content.devices.size() + content.shared_counters.size());
  for (const auto& d : content.devices) names.push_back("d:" + d.name);
  for (const auto& c : content.shared_counters) names.push_back("c:" + c.name);
  std::sort(names.begin(), names.end());
  std::string list;
  for (const auto& n : names) list += n + ",";
  return list;
}

}  // namespace

SliceDigest DigestOf(const SliceContent& content) {
  return {Sha256Of(NameList(content)), Sha256Of(SliceToJson(content, SliceMeta{}).dump())};
}

}  // namespace vfio_dra::slicepublisher
