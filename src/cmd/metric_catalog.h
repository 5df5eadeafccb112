// MetricCatalog: every metric family the daemon exports, declared (type and help text) in one
// place, so an operator reading /metrics or writing alerts has one file to look at. Modules
// record into these families by name; a family recorded without being declared here renders
// without help text, which the daemon's metrics test rejects.
#pragma once

#include "base/metrics.h"

namespace vfio_dra::cmd {

void DeclareMetricCatalog(MetricsRegistry& metrics);

}  // namespace vfio_dra::cmd
