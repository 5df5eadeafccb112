#include "slicepublisher/publishable_pool.h"

#include <optional>

#include "slicepublisher/slice_validator.h"

namespace vfio_dra::slicepublisher {

PublishablePool BuildPublishablePool(const discovery::NodeScan& scan, const PoolTarget& target,
                                     const MdevTypeMaxima& maxima, const TaintInputs* taints) {
  const ServerProfile& profile = target.profile;
  const CounterLayout layout = profile.Layout();
  std::optional<TaintInputs> used;
  if (taints != nullptr && profile.Taints()) {
    used = *taints;
    used->effect_none = profile.kubernetes_minor >= 35;
  }
  const BuildOptions options{target.node_name, layout, used ? &*used : nullptr,
                             profile.kubernetes_minor >= 35,
                             taints != nullptr ? taints->published : nullptr};
  PublishablePool out{BuildDesiredPool(scan, options, maxima), Status::Ok()};
  out.valid = ValidatePool(out.pool, {profile.kubernetes_minor, target.driver, target.node_name,
                                      layout, profile.Taints()});
  return out;
}

}  // namespace vfio_dra::slicepublisher
