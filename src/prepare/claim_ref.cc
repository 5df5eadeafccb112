#include "prepare/claim_ref.h"

#include "base/k8s_names.h"

namespace vfio_dra::prepare {

std::string ClaimRef::Display() const {
  return EscapeForDisplay(namespace_) + "/" + EscapeForDisplay(name);
}

Status ValidateClaimRef(const ClaimRef& claim) {
  const std::string who = "claim " + claim.Display() + " (uid " + EscapeForDisplay(claim.uid) + ")";
  if (!IsDnsLabel(claim.namespace_)) {
    return MakeError(ErrorKind::kInvalidArgument,
                     who +
                         ": invalid namespace: must be a DNS label (lower-case letters, digits "
                         "and '-', at most 63 characters)");
  }
  if (!IsDnsSubdomain(claim.name)) {
    return MakeError(ErrorKind::kInvalidArgument,
                     who +
                         ": invalid name: must be a DNS subdomain (lower-case letters, digits, "
                         "'-' and '.', at most 253 characters)");
  }
  if (!IsObjectUid(claim.uid)) {
    return MakeError(ErrorKind::kInvalidArgument,
                     who + ": invalid uid: must be letters, digits and '-' (at most 128)");
  }
  return Status::Ok();
}

}  // namespace vfio_dra::prepare
