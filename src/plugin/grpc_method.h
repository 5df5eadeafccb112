// GrpcMethod: one RPC of the plugin's gRPC server, as the server (SocketServer, on gRPC C++)
// dispatches it: a full method path and a handler over serialized messages. UnaryMethod and
// ServerStreamingMethod bind typed protobuf handlers, so a service is plain C++ over generated
// message types and can be called directly in tests and the fuzzer. CallContext is what a handler
// sees of its call.
// Invariants: a handler runs on a thread of its own and may block (device work does); it learns
// that its caller went away through CallContext::IsCancelled, OnCancel and a failing Write.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace vfio_dra::plugin {

// The gRPC status codes a handler answers with (the numbers are gRPC's).
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

// The largest message received or sent, gRPC's default receive limit (4 MiB), which the kubelet's
// grpc-go keeps. The kubelet's requests are a few KiB; anything near this is a broken or hostile
// client.
constexpr size_t kMaxMessageBytes = size_t{4} << 20;

class CallContext {
 public:
  virtual ~CallContext() = default;
  // The caller cancelled, went away, or the server is stopping: the answer will not be read.
  virtual bool IsCancelled() const = 0;
  // From the caller's grpc-timeout; nullopt when it set none.
  virtual std::optional<std::chrono::steady_clock::time_point> deadline() const = 0;
  // Who called, for logs.
  virtual const std::string& peer() const = 0;
  // Runs `wake` once when the call is cancelled (at once when it already is), so that a handler
  // waiting on its own condition variable notices the cancel without polling for it. `wake` may
  // run on any thread, after the handler returned too: it must only notify.
  virtual void OnCancel(std::function<void()> wake) const = 0;
};

// A call context with no caller behind it: never cancelled, no deadline. For calling a service
// directly (tests, fuzzing).
class DetachedCallContext final : public CallContext {
 public:
  bool IsCancelled() const override { return false; }
  std::optional<std::chrono::steady_clock::time_point> deadline() const override {
    return std::nullopt;
  }
  const std::string& peer() const override { return peer_; }
  void OnCancel(std::function<void()> /*wake*/) const override {}

 private:
  std::string peer_ = "local";
};

// Where a server-streaming handler sends its serialized messages. Write blocks while the caller
// is slow to read, and returns false once the call is cancelled or over.
class MessageSink {
 public:
  virtual ~MessageSink() = default;
  virtual bool Write(std::string message) = 0;
};

template <typename Message>
class StreamWriter {
 public:
  explicit StreamWriter(MessageSink& sink) : sink_(sink) {}
  bool Write(const Message& message) { return sink_.Write(message.SerializeAsString()); }

 private:
  MessageSink& sink_;
};

struct GrpcMethod {
  using Unary = std::function<GrpcStatus(std::string_view request, CallContext& context,
                                         std::string* response)>;
  using ServerStreaming =
      std::function<GrpcStatus(std::string_view request, CallContext& context, MessageSink& sink)>;

  std::string path;  // "/<package>.<Service>/<Method>"
  Unary unary;       // exactly one of unary and server_streaming is set
  ServerStreaming server_streaming;
};

// A unary method whose handler takes the serialized request and gives the serialized response
// (for methods without generated messages, and for tests of the server itself).
inline GrpcMethod RawUnaryMethod(std::string path, GrpcMethod::Unary handler) {
  GrpcMethod method;
  method.path = std::move(path);
  method.unary = std::move(handler);
  return method;
}

// How the server answers a request body that is not a `Request`: INTERNAL, as gRPC servers do.
template <typename Request>
std::optional<GrpcStatus> ParseRequest(std::string_view bytes, Request* request) {
  if (request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return std::nullopt;
  return GrpcStatus{GrpcCode::kInternal,
                    "cannot parse the request body as " + request->GetTypeName()};
}

// `handler(const Request&, CallContext&, Response*) -> GrpcStatus`.
template <typename Request, typename Response, typename Handler>
GrpcMethod UnaryMethod(std::string path, Handler handler) {
  GrpcMethod method;
  method.path = std::move(path);
  method.unary = [handler = std::move(handler)](std::string_view bytes, CallContext& context,
                                                std::string* out) -> GrpcStatus {
    Request request;
    if (auto bad = ParseRequest(bytes, &request)) return *bad;
    Response response;
    GrpcStatus status = handler(request, context, &response);
    if (status.ok()) *out = response.SerializeAsString();
    return status;
  };
  return method;
}

// `handler(const Request&, CallContext&, StreamWriter<Response>&) -> GrpcStatus`.
template <typename Request, typename Response, typename Handler>
GrpcMethod ServerStreamingMethod(std::string path, Handler handler) {
  GrpcMethod method;
  method.path = std::move(path);
  method.server_streaming = [handler = std::move(handler)](std::string_view bytes,
                                                           CallContext& context,
                                                           MessageSink& sink) -> GrpcStatus {
    Request request;
    if (auto bad = ParseRequest(bytes, &request)) return *bad;
    StreamWriter<Response> writer(sink);
    return handler(request, context, writer);
  };
  return method;
}

}  // namespace vfio_dra::plugin
