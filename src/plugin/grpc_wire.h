// The gRPC-over-HTTP/2 conventions the plugin's server needs, as plain functions: status codes,
// the 5-byte length prefix of each message, the grpc-timeout header and the percent-encoding of
// grpc-message. No I/O here; the connection code (grpc_connection.*) applies them.
// Invariant: a request body is accepted only as exactly one uncompressed message, which is all
// that unary and server-streaming calls carry.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "base/result.h"

namespace vfio_dra::plugin {

// The gRPC status codes (the numbers are the wire values of grpc-status).
enum class GrpcCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
};

struct GrpcStatus {
  GrpcCode code = GrpcCode::kOk;
  std::string message;

  static GrpcStatus Ok() { return {}; }
  bool ok() const { return code == GrpcCode::kOk; }
};

// The largest request body accepted, like gRPC's default receive limit (4 MiB). The kubelet's
// requests are a few KiB; anything near this is a broken or hostile client.
constexpr size_t kMaxRequestMessageBytes = size_t{4} << 20;

// `message` with gRPC's 5-byte prefix (uncompressed flag, big-endian length).
std::string FrameMessage(std::string_view message);

// The single message of a unary or server-streaming request body. A compressed message is
// kUnimplemented (the server advertises no encoding, so a client must not send one); a body that
// is cut short, holds more than one message or exceeds kMaxRequestMessageBytes is kInvalidArgument.
Result<std::string_view> SingleRequestMessage(std::string_view body);

// The value of a grpc-timeout header ("<1-8 digits><H|M|S|m|u|n>"); nullopt when malformed.
std::optional<std::chrono::nanoseconds> ParseGrpcTimeout(std::string_view value);

// grpc-message as the protocol carries it: bytes outside printable ASCII, and '%', as %XX.
std::string PercentEncodeGrpcMessage(std::string_view message);

}  // namespace vfio_dra::plugin
