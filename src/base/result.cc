#include "base/result.h"

namespace vfio_dra {

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "InvalidArgument";
    case ErrorKind::kNotFound:
      return "NotFound";
    case ErrorKind::kAlreadyExists:
      return "AlreadyExists";
    case ErrorKind::kConflict:
      return "Conflict";
    case ErrorKind::kGone:
      return "Gone";
    case ErrorKind::kUnavailable:
      return "Unavailable";
    case ErrorKind::kDeadlineExceeded:
      return "DeadlineExceeded";
    case ErrorKind::kPermissionDenied:
      return "PermissionDenied";
    case ErrorKind::kUnauthenticated:
      return "Unauthenticated";
    case ErrorKind::kUnimplemented:
      return "Unimplemented";
    case ErrorKind::kFailedPrecondition:
      return "FailedPrecondition";
    case ErrorKind::kDataLoss:
      return "DataLoss";
    case ErrorKind::kInternal:
      return "Internal";
  }
  return "Unknown";
}

}  // namespace vfio_dra
