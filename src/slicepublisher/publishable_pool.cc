#include "slicepublisher/publishable_pool.h"

#include "slicepublisher/slice_validator.h"

namespace vfio_dra::slicepublisher {

PublishablePool BuildPublishablePool(const discovery::NodeScan& scan, const PoolTarget& target,
                                     const MdevTypeMaxima& maxima) {
  const CounterLayout layout = target.profile.Layout();
  PublishablePool out{BuildDesiredPool(scan, {target.node_name, layout}, maxima), Status::Ok()};
  out.valid = ValidatePool(
      out.pool, {target.profile.kubernetes_minor, target.driver, target.node_name, layout});
  return out;
}

}  // namespace vfio_dra::slicepublisher
