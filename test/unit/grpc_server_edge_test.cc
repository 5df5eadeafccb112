// UnixGrpcServer at its edges, driven by a raw HTTP/2 client (nghttp2's client session) that
// starts with the 64 KiB windows grpc-go starts with: the last answers of a stopping server,
// oversized requests, the bound on handler threads, a stream's buffer, and accept() failing for
// want of descriptors. Found by review; each test failed before its fix.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "plugin/server_call.h"
#include "plugin/unix_grpc_server.h"
#include "unit/own_threads.h"

namespace vfio_dra::plugin {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous: every wait below ends early on the event it waits for.
constexpr auto kPatience = seconds(60);
const std::string kEmptyMessage("\0\0\0\0\0", 5);

// A single-threaded HTTP/2 client: requests go out on Request, frames come in on Pump.
class RawH2Client {
 public:
  explicit RawH2Client(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    nghttp2_session_callbacks* callbacks = nullptr;
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_send_callback(callbacks, &RawH2Client::SendCallback);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, &RawH2Client::HeaderCallback);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &RawH2Client::CloseCallback);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks,
                                                              &RawH2Client::DataCallback);
    nghttp2_session_client_new(&session_, callbacks, this);
    nghttp2_session_callbacks_del(callbacks);
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, nullptr, 0);
    Flush();
  }
  ~RawH2Client() {
    nghttp2_session_del(session_);
    ::close(fd_);
  }
  bool connected() const { return connected_; }

  int32_t Request(const std::string& path, std::string body) {
    bodies_.push_back({std::move(body), 0});
    const std::array<std::pair<std::string, std::string>, 6> headers = {
        {{":method", "POST"},
         {":scheme", "http"},
         {":path", path},
         {":authority", "localhost"},
         {"content-type", "application/grpc"},
         {"te", "trailers"}}};
    std::vector<nghttp2_nv> nv;
    nv.reserve(headers.size());
    for (const auto& [name, value] : headers) {
      nv.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NONE});
    }
    nghttp2_data_provider provider{};
    provider.source.ptr = &bodies_.back();
    provider.read_callback = &RawH2Client::ReadBody;
    const int32_t id =
        nghttp2_submit_request(session_, nullptr, nv.data(), nv.size(), &provider, nullptr);
    Flush();
    return id;
  }
  // Lets the server send up to `bytes` on the connection and on each stream without waiting for
  // a WINDOW_UPDATE, so that only the socket's buffer holds it back.
  void OpenWindows(int32_t bytes) {
    const std::array<nghttp2_settings_entry, 1> settings = {
        {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(bytes)}}};
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings.data(), settings.size());
    nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, bytes);
    Flush();
  }
  // Bytes that have arrived on the socket and not been read yet.
  size_t Unread() const {
    int n = 0;
    return ::ioctl(fd_, FIONREAD, &n) == 0 ? static_cast<size_t>(n) : 0;
  }
  void Flush() { nghttp2_session_send(session_); }
  // Reads and answers frames until `done` or the patience runs out; false if it ran out.
  bool PumpUntil(const std::function<bool()>& done) {
    const auto until = std::chrono::steady_clock::now() + kPatience;
    while (!done()) {
      if (eof_ || std::chrono::steady_clock::now() >= until) return false;
      PumpOnce(milliseconds(10));
    }
    return true;
  }
  void PumpOnce(milliseconds wait) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return;
    std::array<uint8_t, 65536> buffer{};
    const ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n == 0) eof_ = true;
    if (n <= 0) return;
    nghttp2_session_mem_recv(session_, buffer.data(), static_cast<size_t>(n));
    Flush();
  }

  std::map<int32_t, std::map<std::string, std::string>> headers_;
  std::map<int32_t, size_t> data_bytes_;
  std::map<int32_t, std::string> data_;  // the DATA payloads, gRPC framing included
  std::map<int32_t, uint32_t> closed_;
  std::map<int32_t, size_t> body_sent_;
  bool eof_ = false;

 private:
  struct Body {
    std::string data;
    size_t pos = 0;
  };
  static ssize_t SendCallback(nghttp2_session* /*session*/, const uint8_t* data, size_t size,
                              int /*flags*/, void* self) {
    const ssize_t sent =
        ::send(static_cast<RawH2Client*>(self)->fd_, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return NGHTTP2_ERR_WOULDBLOCK;
    return sent < 0 ? static_cast<ssize_t>(NGHTTP2_ERR_CALLBACK_FAILURE) : sent;
  }
  static ssize_t ReadBody(nghttp2_session* /*session*/, int32_t id, uint8_t* buf, size_t size,
                          uint32_t* flags, nghttp2_data_source* source, void* self) {
    auto* body = static_cast<Body*>(source->ptr);
    const size_t n = std::min(size, body->data.size() - body->pos);
    std::copy_n(body->data.data() + body->pos, n, buf);
    body->pos += n;
    static_cast<RawH2Client*>(self)->body_sent_[id] += n;
    if (body->pos == body->data.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }
  static int HeaderCallback(nghttp2_session* /*session*/, const nghttp2_frame* frame,
                            const uint8_t* name, size_t namelen, const uint8_t* value,
                            size_t valuelen, uint8_t /*flags*/, void* self) {
    static_cast<RawH2Client*>(self)
        ->headers_[frame->hd.stream_id][std::string(reinterpret_cast<const char*>(name), namelen)] =
        std::string(reinterpret_cast<const char*>(value), valuelen);
    return 0;
  }
  static int DataCallback(nghttp2_session* /*session*/, uint8_t /*flags*/, int32_t id,
                          const uint8_t* data, size_t size, void* self) {
    static_cast<RawH2Client*>(self)->data_bytes_[id] += size;
    static_cast<RawH2Client*>(self)->data_[id].append(reinterpret_cast<const char*>(data), size);
    return 0;
  }
  static int CloseCallback(nghttp2_session* /*session*/, int32_t id, uint32_t error, void* self) {
    static_cast<RawH2Client*>(self)->closed_[id] = error;
    return 0;
  }

  int fd_ = -1;
  bool connected_ = false;
  nghttp2_session* session_ = nullptr;
  std::deque<Body> bodies_;  // stable addresses for the data providers
};

// utime + stime of the thread named `name`, read through an fd opened beforehand.
long TicksOf(int stat_fd) {
  std::array<char, 1024> buffer{};
  const ssize_t n = ::pread(stat_fd, buffer.data(), buffer.size() - 1, 0);
  if (n <= 0) return -1;
  const std::string all(buffer.data(), static_cast<size_t>(n));
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::vector<std::string> fields;
  for (std::string field; rest >> field;) fields.push_back(field);
  return std::stol(fields[11]) + std::stol(fields[12]);
}

int OpenStatOfThread(const std::string& wanted) {
  for (const testing::OwnThread& thread : testing::OwnThreads()) {
    if (thread.name == wanted) {
      return ::open((thread.task_dir / "stat").c_str(), O_RDONLY | O_CLOEXEC);
    }
  }
  return -1;
}

class GrpcServerEdgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-grpc-edge-XXXXXX";
    dir_ = mkdtemp(tmpl);
    socket_ = dir_ + "/t.sock";
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Serve(const std::vector<GrpcMethod>& methods) {
    auto server = UnixGrpcServer::Start(socket_, 0600, methods, "edge-grpc", Logger::Discard());
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = std::move(*server);
  }
  std::string dir_;
  std::string socket_;
  std::unique_ptr<UnixGrpcServer> server_;
};

// The last handler to finish while the server stops answers more than the client's window holds:
// the server must go on reading the client's WINDOW_UPDATEs until the answer is through.
TEST_F(GrpcServerEdgeTest, AStoppingServerDeliversAnAnswerLargerThanTheClientsWindow) {
  std::promise<void> entered;
  std::promise<void> release;
  auto released = release.get_future().share();
  const size_t size = size_t{512} << 10;
  Serve({RawUnaryMethod("/t.S/Big", [&](std::string_view, CallContext&, std::string* out) {
    entered.set_value();
    released.wait();
    *out = std::string(size, 'r');
    return GrpcStatus::Ok();
  })});
  RawH2Client client(socket_);
  ASSERT_TRUE(client.connected());
  const int32_t id = client.Request("/t.S/Big", kEmptyMessage);
  auto running = entered.get_future();
  ASSERT_TRUE(client.PumpUntil(
      [&] { return running.wait_for(milliseconds(0)) == std::future_status::ready; }));
  auto stopped = std::async(std::launch::async, [&] { server_->Shutdown(kPatience); });
  release.set_value();
  ASSERT_TRUE(client.PumpUntil([&] { return client.closed_.count(id) > 0; }));
  stopped.get();
  EXPECT_EQ(client.data_bytes_[id], size + 5);
  EXPECT_EQ(client.headers_[id]["grpc-status"], "0");
}

// A handler that the stopping server cancels but that still completes its answer: the answer is
// delivered whole, not a bare OK status without the message (which a client takes as an error).
TEST_F(GrpcServerEdgeTest, AStoppingServerDeliversTheAnswerOfACancelledHandlerThatCompleted) {
  std::promise<void> entered;
  Serve({RawUnaryMethod("/t.S/Late", [&](std::string_view, CallContext& context, std::string* out) {
    entered.set_value();
    const auto until = std::chrono::steady_clock::now() + kPatience;
    while (!context.IsCancelled() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    *out = "answer";
    return GrpcStatus::Ok();
  })});
  RawH2Client client(socket_);
  ASSERT_TRUE(client.connected());
  const int32_t id = client.Request("/t.S/Late", kEmptyMessage);
  auto running = entered.get_future();
  ASSERT_TRUE(client.PumpUntil(
      [&] { return running.wait_for(milliseconds(0)) == std::future_status::ready; }));
  // No grace: the call is cancelled at once, and the handler answers after that.
  auto stopped = std::async(std::launch::async, [&] { server_->Shutdown(milliseconds(0)); });
  ASSERT_TRUE(client.PumpUntil([&] { return client.closed_.count(id) > 0; }));
  stopped.get();
  EXPECT_EQ(client.data_bytes_[id], std::string("answer").size() + 5);
  EXPECT_EQ(client.headers_[id]["grpc-status"], "0");
}

// An answer larger than the socket's buffer, to a client that reads nothing until the buffer is
// full: the server keeps what the socket refuses and sends it as the client drains, whole and
// in order.
TEST_F(GrpcServerEdgeTest, AnAnswerLargerThanTheSocketBufferArrivesWholeWhenTheClientReadsLate) {
  const size_t size = size_t{4} << 20;
  std::string answer(size, '\0');
  for (size_t i = 0; i < size; ++i) answer[i] = static_cast<char>('a' + i % 26);
  Serve({RawUnaryMethod("/t.S/Big", [&](std::string_view, CallContext&, std::string* out) {
    *out = answer;
    return GrpcStatus::Ok();
  })});
  RawH2Client client(socket_);
  ASSERT_TRUE(client.connected());
  client.OpenWindows(int32_t{64} << 20);
  const int32_t id = client.Request("/t.S/Big", kEmptyMessage);
  // Not reading: the server writes until the socket refuses more (far less than 4 MiB).
  const auto until = std::chrono::steady_clock::now() + kPatience;
  size_t unread = 0;
  while (std::chrono::steady_clock::now() < until) {
    const size_t now = client.Unread();
    if (now >= (size_t{64} << 10) && now == unread) break;  // stopped growing: the buffer is full
    unread = now;
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_GE(unread, size_t{64} << 10) << "the server sent nothing while the client did not read";
  ASSERT_TRUE(client.PumpUntil([&] { return client.closed_.count(id) > 0; }));
  EXPECT_EQ(client.data_bytes_[id], size + 5);
  EXPECT_EQ(client.data_[id].substr(5), answer);
  EXPECT_EQ(client.headers_[id]["grpc-status"], "0");
}

// Over the limit: RESOURCE_EXHAUSTED naming the method, and the upload is cut short rather than
// taken in whole (32 MiB here).
TEST_F(GrpcServerEdgeTest, AnOversizedRequestIsRefusedAndItsUploadStopped) {
  std::atomic<bool> ran{false};
  Serve({RawUnaryMethod("/t.S/Echo", [&](std::string_view, CallContext&, std::string*) {
    ran = true;
    return GrpcStatus::Ok();
  })});
  RawH2Client client(socket_);
  std::string body(5, '\0');
  body += std::string(size_t{32} << 20, 'x');
  const int32_t id = client.Request("/t.S/Echo", body);
  ASSERT_TRUE(client.PumpUntil([&] { return client.closed_.count(id) > 0; }));
  EXPECT_EQ(client.headers_[id]["grpc-status"], "8");
  EXPECT_NE(client.headers_[id]["grpc-message"].find("/t.S/Echo"), std::string::npos);
  EXPECT_LT(client.body_sent_[id], size_t{16} << 20);
  EXPECT_FALSE(ran.load());
}

// Three connections of 100 calls each, all blocking: 256 handlers run, the other 44 calls are
// refused at once with RESOURCE_EXHAUSTED instead of each getting a thread.
TEST_F(GrpcServerEdgeTest, HandlerThreadsAreBoundedWhateverClientsDo) {
  std::mutex mu;
  std::condition_variable changed;
  int running = 0;
  bool release = false;
  Serve({RawUnaryMethod("/t.S/Block", [&](std::string_view, CallContext&, std::string*) {
    std::unique_lock<std::mutex> lock(mu);
    ++running;
    changed.notify_all();
    changed.wait(lock, [&] { return release; });
    return GrpcStatus::Ok();
  })});
  std::vector<std::unique_ptr<RawH2Client>> clients;
  for (int c = 0; c < 3; ++c) {
    clients.push_back(std::make_unique<RawH2Client>(socket_));
    for (int i = 0; i < 100; ++i) clients.back()->Request("/t.S/Block", kEmptyMessage);
  }
  auto refused = [&] {
    int count = 0;
    for (const auto& client : clients) {
      for (const auto& [id, headers] : client->headers_) {
        auto it = headers.find("grpc-status");
        if (it != headers.end() && it->second == "8") ++count;
      }
    }
    return count;
  };
  auto running_now = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return running;
  };
  const auto until = std::chrono::steady_clock::now() + kPatience;
  while ((running_now() < 256 || refused() < 44) && std::chrono::steady_clock::now() < until) {
    for (auto& client : clients) client->PumpOnce(milliseconds(5));
  }
  EXPECT_EQ(running_now(), 256);
  EXPECT_EQ(refused(), 44);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  changed.notify_all();
  // The handlers use this test's locals: they must be done before those go.
  server_->Shutdown(kPatience);
}

// A stream whose reader never quite catches up must not keep everything it was ever sent.
TEST(ServerCallTest, TheBufferOfAStreamThatIsNeverFullyDrainedStaysBounded) {
  CallEvents events;
  ServerCall call(CallEvent{1, 1}, "peer", std::nullopt, events);
  const std::string message(size_t{64} << 10, 'm');
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(call.Write(message));
  std::vector<uint8_t> buffer(message.size() + 5);
  const size_t before = mallinfo2().uordblks + mallinfo2().hblkhd;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(call.Write(message));
    ASSERT_EQ(call.TakeOutput(buffer.data(), buffer.size()), buffer.size());
    events.Take();
  }
  const size_t after = mallinfo2().uordblks + mallinfo2().hblkhd;
  EXPECT_LT(after - before, size_t{4} << 20) << "64 MiB went through with 512 KiB pending";
}

// accept() failing with EMFILE leaves the connection in the backlog and the socket readable; the
// I/O thread must pause accepting, not spin (it used a whole core before).
TEST_F(GrpcServerEdgeTest, AcceptFailingForWantOfDescriptorsDoesNotSpin) {
  Serve({});
  // The I/O thread names itself as it starts, which may be a moment after Start returns.
  int stat_fd = OpenStatOfThread("edge-grpc");
  for (const auto until = std::chrono::steady_clock::now() + kPatience;
       stat_fd < 0 && std::chrono::steady_clock::now() < until;
       stat_fd = OpenStatOfThread("edge-grpc")) {
    std::this_thread::yield();
  }
  ASSERT_GE(stat_fd, 0);
  std::vector<int> clients(3);
  for (int& fd : clients) fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  // Read before the descriptors run out: sanitizers need some for their own checks.
  const long before = TicksOf(stat_fd);
  std::vector<int> fillers;
  for (int fd = ::dup(0); fd >= 0; fd = ::dup(0)) fillers.push_back(fd);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
  for (int fd : clients) {
    // Queued in the backlog whether or not accept() can take them. (No ASSERT: the limit and
    // the descriptors must be given back below whatever happens.)
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  // The measurement window: how much CPU the I/O thread burns while accept() keeps failing.
  std::this_thread::sleep_for(seconds(2));
  for (int fd : fillers) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &old);
  const long after = TicksOf(stat_fd);
  for (int fd : clients) ::close(fd);
  ::close(stat_fd);
  EXPECT_LT(after - before, ::sysconf(_SC_CLK_TCK) / 5) << "ticks over 2 s";
}

}  // namespace
}  // namespace vfio_dra::plugin
