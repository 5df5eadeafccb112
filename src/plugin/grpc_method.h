// GrpcMethod: one RPC of the plugin's gRPC server, as the server dispatches it: a full method path
// and a handler over serialized messages. UnaryMethod and ServerStreamingMethod bind typed
// protobuf handlers, so a service is plain C++ over generated message types and can be called
// directly in tests. CallContext is what a handler sees of its call.
// Invariants: a handler runs on a thread of its own and may block (device work does); it learns
// that its caller went away through CallContext::IsCancelled and from a failing Write.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "plugin/grpc_wire.h"

namespace vfio_dra::plugin {

class CallContext {
 public:
  virtual ~CallContext() = default;
  // The caller cancelled, went away, or the server is stopping: the answer will not be read.
  virtual bool IsCancelled() const = 0;
  // From the caller's grpc-timeout; nullopt when it set none.
  virtual std::optional<std::chrono::steady_clock::time_point> deadline() const = 0;
  // Who called, for logs (the peer's process and user on a unix socket).
  virtual const std::string& peer() const = 0;
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
