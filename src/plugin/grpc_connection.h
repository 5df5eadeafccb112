// GrpcConnection: one client connection of the plugin's gRPC server, an HTTP/2 server session
// (nghttp2) over a non-blocking unix socket. It turns each request stream into a call to one
// GrpcMethod, handed to the server to run, and sends each call's messages and final status back
// as gRPC expects: response headers, DATA, trailers; or a single "trailers-only" HEADERS frame
// for a call that fails before any message.
// Invariant: only the server's I/O thread touches a connection; handler threads reach their
// call's ServerCall and nothing else.
#pragma once

#include <nghttp2/nghttp2.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "plugin/server_call.h"

namespace vfio_dra::plugin {

class GrpcConnection {
 public:
  // Runs `method` for `call` with the request `message` (on a thread of the server's choosing).
  using CallStarter = std::function<void(
      const GrpcMethod& method, const std::shared_ptr<ServerCall>& call, std::string message)>;

  GrpcConnection(int fd, uint64_t id, const std::unordered_map<std::string, GrpcMethod>& methods,
                 CallEvents& events, CallStarter start);
  ~GrpcConnection();  // cancels the calls still open and closes the socket
  GrpcConnection(const GrpcConnection&) = delete;
  GrpcConnection& operator=(const GrpcConnection&) = delete;

  // Sends the server's settings. False if the session cannot be set up.
  bool Open();
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }
  // Reads what the socket has and feeds it to the session. False: close the connection.
  bool OnReadable();
  // Writes what the session has to send, until the socket would block. False: close it.
  bool Flush();
  // The last Flush stopped because the socket was full.
  bool blocked() const { return blocked_; }
  // Nothing left to read or write (the peer and we are done, e.g. after GOAWAY).
  bool Finished() const;
  // No call open and nothing waiting to be written: a stopping server may close it.
  bool Quiet() const;
  // Why the session failed, when OnReadable or Flush said to close (empty: the peer closed).
  const std::string& failure() const { return failure_; }
  // A call of this connection has new output or finished.
  void OnCallEvent(int32_t stream);
  // Tells the client to open no new streams, for good: the streams it opened so far are served,
  // and once they end the connection is finished (the server stops, or closes it as idle).
  void GoAway();
  // The first step of closing an idle connection, as HTTP/2 advises: a GOAWAY that announces the
  // end but still takes the streams the client opens meanwhile; GoAway follows a round trip
  // later.
  void NoticeGoAway();
  // Since when no call has been open on this connection; nullopt while one is, or once either
  // GOAWAY was sent (nothing more to decide about it).
  std::optional<std::chrono::steady_clock::time_point> IdleSince() const;
  // When NoticeGoAway was sent, until GoAway follows.
  std::optional<std::chrono::steady_clock::time_point> NoticedAt() const;

 private:
  struct Stream {
    std::string method;
    std::string path;
    std::string content_type;
    std::string timeout;
    std::string body;
    bool answered = false;  // answered already (e.g. too large): further DATA is dropped
    bool headers_sent = false;
    bool reset_after_answer = false;  // the client is still sending a body we refused
    std::shared_ptr<ServerCall> call;
  };

  static int OnBeginHeaders(nghttp2_session* session, const nghttp2_frame* frame, void* self);
  static int OnHeader(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                      void* self);
  static int OnDataChunk(nghttp2_session* session, uint8_t flags, int32_t stream_id,
                         const uint8_t* data, size_t len, void* self);
  static int OnFrameReceived(nghttp2_session* session, const nghttp2_frame* frame, void* self);
  static int OnFrameSent(nghttp2_session* session, const nghttp2_frame* frame, void* self);
  static int OnStreamClose(nghttp2_session* session, int32_t stream_id, uint32_t error_code,
                           void* self);
  static ssize_t ReadCallOutput(nghttp2_session* session, int32_t stream_id, uint8_t* buf,
                                size_t length, uint32_t* data_flags, nghttp2_data_source* source,
                                void* self);

  Stream* Find(int32_t stream_id);
  void Dispatch(int32_t stream_id, Stream& stream);
  // A response that is only headers ending the stream: an HTTP error, or gRPC's trailers-only.
  void RespondHttpError(int32_t stream_id, const char* http_status);
  void RespondTrailersOnly(int32_t stream_id, const GrpcStatus& status);
  bool SubmitTrailers(int32_t stream_id, const GrpcStatus& status);

  const int fd_;
  const uint64_t id_;
  std::string peer_;
  const std::unordered_map<std::string, GrpcMethod>& methods_;
  CallEvents& events_;
  CallStarter start_;
  nghttp2_session* session_ = nullptr;
  // Bytes the session produced that the socket has not taken yet (from unsent_pos_ on).
  std::string unsent_;
  size_t unsent_pos_ = 0;
  bool blocked_ = false;
  bool going_away_ = false;
  std::optional<std::chrono::steady_clock::time_point> noticed_at_;
  std::string failure_;
  std::map<int32_t, Stream> streams_;
  std::chrono::steady_clock::time_point idle_since_ = std::chrono::steady_clock::now();
};

}  // namespace vfio_dra::plugin
