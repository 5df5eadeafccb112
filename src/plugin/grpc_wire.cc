#include "plugin/grpc_wire.h"

#include <algorithm>
#include <cstdint>

namespace vfio_dra::plugin {
namespace {

constexpr size_t kPrefixBytes = 5;

}  // namespace

std::string FrameMessage(std::string_view message) {
  const auto size = static_cast<uint32_t>(message.size());
  std::string framed;
  framed.reserve(kPrefixBytes + message.size());
  framed.push_back('\0');
  for (int shift = 24; shift >= 0; shift -= 8) {
    framed.push_back(static_cast<char>((size >> shift) & 0xFFU));
  }
  framed.append(message);
  return framed;
}

Result<std::string_view> SingleRequestMessage(std::string_view body) {
  if (body.size() < kPrefixBytes) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "request body of " + std::to_string(body.size()) +
                         " bytes is shorter than a gRPC message prefix (5 bytes)");
  }
  const auto flag = static_cast<uint8_t>(body[0]);
  uint32_t size = 0;
  for (size_t i = 1; i < kPrefixBytes; ++i) size = (size << 8) | static_cast<uint8_t>(body[i]);
  if (flag == 1) {
    return MakeError(ErrorKind::kUnimplemented,
                     "the request message is compressed; this server accepts none (it advertises "
                     "no grpc-accept-encoding)");
  }
  if (flag != 0) {
    return MakeError(ErrorKind::kInvalidArgument, "the request message's flag byte is " +
                                                      std::to_string(flag) +
                                                      ", neither 0 (plain) nor 1 (compressed)");
  }
  if (size > kMaxRequestMessageBytes) {
    return MakeError(ErrorKind::kInvalidArgument, "the request message announces " +
                                                      std::to_string(size) +
                                                      " bytes, more than the limit of " +
                                                      std::to_string(kMaxRequestMessageBytes));
  }
  const size_t rest = body.size() - kPrefixBytes;
  if (rest != size) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "the request message announces " + std::to_string(size) + " bytes but " +
                         std::to_string(rest) +
                         " follow (a unary or server-streaming request carries exactly one "
                         "message)");
  }
  return body.substr(kPrefixBytes);
}

std::optional<std::chrono::nanoseconds> ParseGrpcTimeout(std::string_view value) {
  // The protocol allows at most 8 digits, so the amount always fits an int64 in nanoseconds
  // except for hours, which are capped below.
  if (value.size() < 2 || value.size() > 9) return std::nullopt;
  int64_t amount = 0;
  for (const char c : value.substr(0, value.size() - 1)) {
    if (c < '0' || c > '9') return std::nullopt;
    amount = amount * 10 + (c - '0');
  }
  using std::chrono::duration_cast;
  using std::chrono::nanoseconds;
  switch (value.back()) {
    case 'H':
      // 99,999,999 hours overflow nanoseconds; a day is already "no deadline" to the plugin.
      return duration_cast<nanoseconds>(
          std::chrono::hours(std::min<int64_t>(amount, int64_t{24} * 365)));
    case 'M':
      return duration_cast<nanoseconds>(std::chrono::minutes(amount));
    case 'S':
      return duration_cast<nanoseconds>(std::chrono::seconds(amount));
    case 'm':
      return duration_cast<nanoseconds>(std::chrono::milliseconds(amount));
    case 'u':
      return duration_cast<nanoseconds>(std::chrono::microseconds(amount));
    case 'n':
      return nanoseconds(amount);
    default:
      return std::nullopt;
  }
}

std::string PercentEncodeGrpcMessage(std::string_view message) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto byte = static_cast<uint8_t>(c);
    if (byte >= 0x20 && byte <= 0x7E && c != '%') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xFU]);
    }
  }
  return out;
}

}  // namespace vfio_dra::plugin
