// The slices this node should publish to a given API server: built from a scan with the counter
// layout the server supports, then checked against the server's validation rules. The daemon's
// reconciler and the `slices` command both go through here, so what the command prints is what
// the daemon would write.
#pragma once

#include <string>

#include "base/result.h"
#include "discovery/node_scan.h"
#include "slicepublisher/server_profile.h"
#include "slicepublisher/slice_builder.h"

namespace vfio_dra::slicepublisher {

struct PoolTarget {
  std::string node_name;
  std::string driver;
  ServerProfile profile;
};

struct PublishablePool {
  DesiredPool pool;  // always built; its warnings name devices left out
  Status valid;      // why the server would reject it, naming the slice and rule
};

// `taints` are used where the server takes taints (null: none); what they say is published is
// read either way (slice_builder.h).
PublishablePool BuildPublishablePool(const discovery::NodeScan& scan, const PoolTarget& target,
                                     const MdevTypeMaxima& maxima,
                                     const TaintInputs* taints = nullptr);

}  // namespace vfio_dra::slicepublisher
