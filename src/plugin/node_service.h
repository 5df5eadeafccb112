// DraNodeService: the one implementation of NodePrepareResources / NodeUnprepareResources behind
// both gRPC API versions. It enforces the kubelet contract: an answer for every claim UID in the
// request, per-claim failures as per-claim errors naming the claim, whole-call errors only for a
// malformed request, the claim re-read from the API (UID and allocation checked), only this
// driver's results handed on, base request names, and device work serialized unless the preparer
// orders device work itself (as the upstream helper's Serialize(false)).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/metrics.h"
#include "base/result.h"
#include "kube/claim_reader.h"
#include "plugin/call_serializer.h"
#include "prepare/claim_ref.h"
#include "prepare/device_preparer.h"

namespace vfio_dra::plugin {

// More claims than any pod can reference; a request beyond this is refused as malformed.
inline constexpr size_t kMaxClaimsPerCall = 1024;

struct ClaimPrepareResult {
  std::vector<prepare::PreparedDevice> devices;
  std::string error;  // non-empty: the claim failed, devices are ignored
};

struct ClaimUnprepareResult {
  std::string error;
};

// Reads ResourceClaims; an interface so tests can run the service without an API server.
class ClaimSource {
 public:
  virtual ~ClaimSource() = default;
  virtual Result<kube::ResourceClaim> Get(const std::string& namespace_, const std::string& name,
                                          Deadline deadline) = 0;
};

class ApiClaimSource final : public ClaimSource {
 public:
  explicit ApiClaimSource(kube::ResourceClaimReader& reader) : reader_(reader) {}
  Result<kube::ResourceClaim> Get(const std::string& namespace_, const std::string& name,
                                  Deadline deadline) override {
    return reader_.Get(namespace_, name, deadline);
  }

 private:
  kube::ResourceClaimReader& reader_;
};

class DraNodeService {
 public:
  // `serializer`: held around every preparer call; null when the preparer locks what it changes
  // itself (vfio-dra's does, per device, so claims on disjoint devices run in parallel).
  // `metrics` may be null.
  DraNodeService(std::string driver_name, ClaimSource& claims, prepare::DevicePreparer& preparer,
                 CallSerializer* serializer, Logger log, MetricsRegistry* metrics = nullptr);

  // Whole-call errors (kInvalidArgument) for a malformed request; otherwise one entry per UID.
  // Claims are worked on in order until `deadline` (the kubelet's, less a margin for the answer);
  // a claim whose turn comes too late fails with an error the kubelet's retry picks up.
  Result<std::map<std::string, ClaimPrepareResult>> Prepare(
      const std::vector<prepare::ClaimRef>& claims, Deadline deadline = {});
  Result<std::map<std::string, ClaimUnprepareResult>> Unprepare(
      const std::vector<prepare::ClaimRef>& claims, Deadline deadline = {});

 private:
  Status ValidateRequest(const std::vector<prepare::ClaimRef>& claims, const char* call) const;
  ClaimPrepareResult PrepareOne(const prepare::ClaimRef& ref, Deadline deadline);
  ClaimUnprepareResult UnprepareOne(const prepare::ClaimRef& ref, Deadline deadline);
  void Record(const char* operation, const std::string& error,
              std::chrono::steady_clock::duration took);

  const std::string driver_name_;
  ClaimSource& claims_;
  prepare::DevicePreparer& preparer_;
  CallSerializer* serializer_;
  Logger log_;
  MetricsRegistry* metrics_;
};

}  // namespace vfio_dra::plugin
