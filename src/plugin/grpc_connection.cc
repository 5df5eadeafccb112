#include "plugin/grpc_connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "base/file_io.h"

namespace vfio_dra::plugin {
namespace {

// Enough for the kubelet, which runs one call per pod being started, and a bound on what one
// client can make the plugin hold.
constexpr uint32_t kMaxConcurrentStreams = 128;
constexpr size_t kReadChunk = size_t{16} << 10;
constexpr size_t kSendBatch = size_t{64} << 10;

nghttp2_nv Header(std::string_view name, std::string_view value) {
  // nghttp2 copies names and values when the frame is submitted (no NO_COPY flags).
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NONE};
}

// A status as its grpc-status and grpc-message fields, in trailers or in a trailers-only
// response. Holds the text the fields point to until the frame is submitted.
class StatusFields {
 public:
  explicit StatusFields(const GrpcStatus& status)
      : code_(std::to_string(static_cast<int>(status.code))),
        message_(PercentEncodeGrpcMessage(status.message)) {}
  void AppendTo(std::vector<nghttp2_nv>& fields) const {
    fields.push_back(Header("grpc-status", code_));
    if (!message_.empty()) fields.push_back(Header("grpc-message", message_));
  }

 private:
  std::string code_;
  std::string message_;
};

std::string PeerOf(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return "unix:unknown";
  return "unix:pid=" + std::to_string(cred.pid) + ",uid=" + std::to_string(cred.uid);
}

GrpcCode CodeForFraming(ErrorKind kind) {
  return kind == ErrorKind::kUnimplemented ? GrpcCode::kUnimplemented : GrpcCode::kInternal;
}

}  // namespace

GrpcConnection::GrpcConnection(int fd, uint64_t id,
                               const std::unordered_map<std::string, GrpcMethod>& methods,
                               CallEvents& events, CallStarter start)
    : fd_(fd),
      id_(id),
      peer_(PeerOf(fd)),
      methods_(methods),
      events_(events),
      start_(std::move(start)) {}

GrpcConnection::~GrpcConnection() {
  for (auto& [id, stream] : streams_) {
    if (stream.call) stream.call->Cancel();
  }
  if (session_ != nullptr) nghttp2_session_del(session_);
  ::close(fd_);
}

bool GrpcConnection::Open() {
  nghttp2_session_callbacks* callbacks = nullptr;
  if (nghttp2_session_callbacks_new(&callbacks) != 0) return false;
  nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks,
                                                          &GrpcConnection::OnBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, &GrpcConnection::OnHeader);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks,
                                                            &GrpcConnection::OnDataChunk);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &GrpcConnection::OnFrameReceived);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &GrpcConnection::OnStreamClose);
  nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, &GrpcConnection::OnFrameSent);
  // No HTTP messaging checks: they refuse an :authority with a '/' in it (PROTOCOL_ERROR), and
  // kubelets dialing the registration socket by path send the socket path there. Dispatch checks
  // what gRPC needs (POST, the content-type, the path) itself.
  nghttp2_option* option = nullptr;
  if (nghttp2_option_new(&option) != 0) {
    nghttp2_session_callbacks_del(callbacks);
    return false;
  }
  nghttp2_option_set_no_http_messaging(option, 1);
  const int rv = nghttp2_session_server_new2(&session_, callbacks, this, option);
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(callbacks);
  if (rv != 0) return false;
  const std::array<nghttp2_settings_entry, 1> settings = {
      {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreams}}};
  if (nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings.data(), settings.size()) != 0) {
    return false;
  }
  return Flush();
}

bool GrpcConnection::OnReadable() {
  std::array<uint8_t, kReadChunk> buffer{};
  while (true) {
    const ssize_t got = ::recv(fd_, buffer.data(), buffer.size(), 0);
    if (got == 0) return false;  // the client closed the connection
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    const ssize_t used =
        nghttp2_session_mem_recv(session_, buffer.data(), static_cast<size_t>(got));
    if (used < 0) {
      // A protocol error: nghttp2 has queued a GOAWAY saying why; send it before closing.
      Flush();
      return false;
    }
  }
}

bool GrpcConnection::Flush() {
  blocked_ = false;
  while (true) {
    while (unsent_pos_ < unsent_.size()) {
      const ssize_t sent =
          ::send(fd_, unsent_.data() + unsent_pos_, unsent_.size() - unsent_pos_, MSG_NOSIGNAL);
      if (sent >= 0) {
        unsent_pos_ += static_cast<size_t>(sent);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        blocked_ = true;
        return true;
      } else if (errno != EINTR) {
        if (failure_.empty()) failure_ = "cannot send: " + ErrnoText(errno);
        return false;
      }
    }
    unsent_.clear();
    unsent_pos_ = 0;
    // Everything the session has ready leaves in one send: a unary answer's headers, message and
    // trailers, and the answers of the other calls that finished meanwhile, reach the client as
    // one segment instead of one per frame (each a wakeup of its reader). Batches stay bounded, so
    // a client that does not read holds back at most one.
    while (unsent_.size() < kSendBatch) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) {
        if (failure_.empty()) {
          failure_ = "cannot send: " + std::string(nghttp2_strerror(static_cast<int>(n)));
        }
        return false;
      }
      if (n == 0) break;
      unsent_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (unsent_.empty()) return true;
  }
}

bool GrpcConnection::Finished() const {
  return nghttp2_session_want_read(session_) == 0 && nghttp2_session_want_write(session_) == 0 &&
         unsent_pos_ == unsent_.size();
}

bool GrpcConnection::Quiet() const {
  return streams_.empty() && nghttp2_session_want_write(session_) == 0 &&
         unsent_pos_ == unsent_.size() && !blocked_;
}

void GrpcConnection::GoAway() {
  going_away_ = true;
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                        nullptr, 0);
}

void GrpcConnection::NoticeGoAway() {
  if (going_away_ || noticed_at_) return;
  if (nghttp2_submit_shutdown_notice(session_) == 0) {
    noticed_at_ = std::chrono::steady_clock::now();
  } else {
    GoAway();
  }
}

std::optional<std::chrono::steady_clock::time_point> GrpcConnection::IdleSince() const {
  if (going_away_ || noticed_at_ || !streams_.empty()) return std::nullopt;
  return idle_since_;
}

std::optional<std::chrono::steady_clock::time_point> GrpcConnection::NoticedAt() const {
  if (going_away_) return std::nullopt;
  return noticed_at_;
}

GrpcConnection::Stream* GrpcConnection::Find(int32_t stream_id) {
  auto it = streams_.find(stream_id);
  return it == streams_.end() ? nullptr : &it->second;
}

int GrpcConnection::OnBeginHeaders(nghttp2_session* /*session*/, const nghttp2_frame* frame,
                                   void* self) {
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
    static_cast<GrpcConnection*>(self)->streams_.try_emplace(frame->hd.stream_id);
  }
  return 0;
}

int GrpcConnection::OnHeader(nghttp2_session* /*session*/, const nghttp2_frame* frame,
                             const uint8_t* name, size_t namelen, const uint8_t* value,
                             size_t valuelen, uint8_t /*flags*/, void* self) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  Stream* stream = static_cast<GrpcConnection*>(self)->Find(frame->hd.stream_id);
  if (stream == nullptr) return 0;
  const std::string_view key(reinterpret_cast<const char*>(name), namelen);
  std::string val(reinterpret_cast<const char*>(value), valuelen);
  if (key == ":method") {
    stream->method = std::move(val);
  } else if (key == ":path") {
    stream->path = std::move(val);
  } else if (key == "content-type") {
    stream->content_type = std::move(val);
  } else if (key == "grpc-timeout") {
    stream->timeout = std::move(val);
  }
  return 0;
}

int GrpcConnection::OnDataChunk(nghttp2_session* /*session*/, uint8_t /*flags*/, int32_t stream_id,
                                const uint8_t* data, size_t len, void* self) {
  auto* connection = static_cast<GrpcConnection*>(self);
  Stream* stream = connection->Find(stream_id);
  if (stream == nullptr || stream->answered) return 0;
  // The prefix plus the largest message accepted; the rest of a larger body is dropped unread.
  if (stream->body.size() + len > kMaxRequestMessageBytes + 5) {
    stream->answered = true;
    stream->body.clear();
    connection->RespondTrailersOnly(
        stream_id, {GrpcCode::kResourceExhausted,
                    "the request to " + stream->path + " is larger than the limit of " +
                        std::to_string(kMaxRequestMessageBytes) + " bytes"});
    // Once the answer is out, RST_STREAM(NO_ERROR) tells the client to stop sending the rest,
    // as gRPC servers do (OnFrameSent); sent now, it would overtake the answer.
    stream->reset_after_answer = true;
    return 0;
  }
  stream->body.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int GrpcConnection::OnFrameReceived(nghttp2_session* /*session*/, const nghttp2_frame* frame,
                                    void* self) {
  const bool request_end = (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
                           (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (!request_end) return 0;
  auto* connection = static_cast<GrpcConnection*>(self);
  if (Stream* stream = connection->Find(frame->hd.stream_id)) {
    connection->Dispatch(frame->hd.stream_id, *stream);
  }
  return 0;
}

int GrpcConnection::OnFrameSent(nghttp2_session* session, const nghttp2_frame* frame, void* self) {
  if (frame->hd.type != NGHTTP2_HEADERS || (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) {
    return 0;
  }
  Stream* stream = static_cast<GrpcConnection*>(self)->Find(frame->hd.stream_id);
  if (stream != nullptr && stream->reset_after_answer) {
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
  }
  return 0;
}

int GrpcConnection::OnStreamClose(nghttp2_session* /*session*/, int32_t stream_id,
                                  uint32_t /*error_code*/, void* self) {
  auto* connection = static_cast<GrpcConnection*>(self);
  auto it = connection->streams_.find(stream_id);
  if (it == connection->streams_.end()) return 0;
  // Closed before the handler finished (RST_STREAM from the client): nobody reads the answer.
  if (it->second.call) it->second.call->Cancel();
  connection->streams_.erase(it);
  if (connection->streams_.empty()) connection->idle_since_ = std::chrono::steady_clock::now();
  return 0;
}

void GrpcConnection::Dispatch(int32_t stream_id, Stream& stream) {
  if (stream.answered) return;
  stream.answered = true;  // one answer per stream, whatever follows
  if (stream.method != "POST") {
    RespondHttpError(stream_id, "405");
    return;
  }
  const std::string_view type = stream.content_type;
  const bool grpc_type = type == "application/grpc" || type.rfind("application/grpc+", 0) == 0 ||
                         type.rfind("application/grpc;", 0) == 0;
  if (!grpc_type) {
    RespondHttpError(stream_id, "415");
    return;
  }
  auto method = methods_.find(stream.path);
  if (method == methods_.end()) {
    RespondTrailersOnly(
        stream_id, {GrpcCode::kUnimplemented, "unknown method " + stream.path + " on this socket"});
    return;
  }
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (!stream.timeout.empty()) {
    const auto timeout = ParseGrpcTimeout(stream.timeout);
    if (!timeout) {
      RespondTrailersOnly(stream_id, {GrpcCode::kInternal,
                                      "malformed grpc-timeout header \"" + stream.timeout + "\""});
      return;
    }
    deadline = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(*timeout);
  }
  auto message = SingleRequestMessage(stream.body);
  if (!message.ok()) {
    RespondTrailersOnly(stream_id, {CodeForFraming(message.error().kind), message.error().message});
    return;
  }
  stream.call = std::make_shared<ServerCall>(CallEvent{id_, stream_id}, peer_, deadline, events_);
  std::string request(*message);
  stream.body = std::string();
  start_(method->second, stream.call, std::move(request));
}

void GrpcConnection::OnCallEvent(int32_t stream_id) {
  Stream* stream = Find(stream_id);
  if (stream == nullptr || !stream->call) return;
  if (stream->headers_sent) {
    nghttp2_session_resume_data(session_, stream_id);
    return;
  }
  if (!stream->call->HasOutput()) {
    // Finished without a message: the status alone, as trailers-only.
    if (auto status = stream->call->StatusIfDrained()) RespondTrailersOnly(stream_id, *status);
    return;
  }
  stream->headers_sent = true;
  const std::array<nghttp2_nv, 2> headers = {Header(":status", "200"),
                                             Header("content-type", "application/grpc")};
  nghttp2_data_provider provider{};
  provider.source.ptr = stream->call.get();
  provider.read_callback = &GrpcConnection::ReadCallOutput;
  if (nghttp2_submit_response(session_, stream_id, headers.data(), headers.size(), &provider) !=
      0) {
    // Nothing can reach the client on this stream; the handler must not wait for it.
    stream->call->Cancel();
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_INTERNAL_ERROR);
  }
}

ssize_t GrpcConnection::ReadCallOutput(nghttp2_session* /*session*/, int32_t stream_id,
                                       uint8_t* buf, size_t length, uint32_t* data_flags,
                                       nghttp2_data_source* source, void* self) {
  auto* call = static_cast<ServerCall*>(source->ptr);
  const size_t n = call->TakeOutput(buf, length);
  if (n > 0) return static_cast<ssize_t>(n);
  if (auto status = call->StatusIfDrained()) {
    *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    // Failing here resets the stream: the client sees an error rather than waiting forever.
    if (!static_cast<GrpcConnection*>(self)->SubmitTrailers(stream_id, *status)) {
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    return 0;
  }
  return NGHTTP2_ERR_DEFERRED;
}

void GrpcConnection::RespondHttpError(int32_t stream_id, const char* http_status) {
  const std::array<nghttp2_nv, 1> headers = {Header(":status", http_status)};
  nghttp2_submit_response(session_, stream_id, headers.data(), headers.size(), nullptr);
}

void GrpcConnection::RespondTrailersOnly(int32_t stream_id, const GrpcStatus& status) {
  const StatusFields fields(status);
  std::vector<nghttp2_nv> headers = {Header(":status", "200"),
                                     Header("content-type", "application/grpc")};
  fields.AppendTo(headers);
  nghttp2_submit_response(session_, stream_id, headers.data(), headers.size(), nullptr);
}

bool GrpcConnection::SubmitTrailers(int32_t stream_id, const GrpcStatus& status) {
  const StatusFields fields(status);
  std::vector<nghttp2_nv> trailers;
  fields.AppendTo(trailers);
  return nghttp2_submit_trailer(session_, stream_id, trailers.data(), trailers.size()) == 0;
}

}  // namespace vfio_dra::plugin
