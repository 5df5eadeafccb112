// ValidatePool: the API server's ResourceSlice rules for the target release, checked before
// anything is sent, plus the pool-wide rules the allocator relies on (unique device and counter
// set names, counter references that resolve). A failure names the slice, the device and the rule.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "base/result.h"
#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

struct ValidationTarget {
  int kubernetes_minor = 35;  // 1.<minor>
  std::string driver;
  std::string node_name;
  CounterLayout layout = CounterLayout::kOwnSlice;
  bool taints = true;  // the server takes device taints
};

Status ValidatePool(const DesiredPool& pool, const ValidationTarget& target);

// What the server would refuse in one device's attributes (their count, a name, a string's
// length, a version), as ValidatePool words it; nullopt when nothing. For attributes that do not
// come from the builder (a checkpoint's record of a device).
std::optional<std::string> AttributeProblem(const std::map<std::string, AttributeValue>& attributes,
                                            const std::string& driver);

// A qualified attribute name: C identifier (at most 32) with an optional "<dns subdomain>/"
// prefix (at most 63).
bool IsQualifiedName(const std::string& name);

}  // namespace vfio_dra::slicepublisher
