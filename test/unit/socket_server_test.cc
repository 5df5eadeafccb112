// SocketServer (gRPC C++ serving GrpcMethods) against a client: status codes and messages as the
// client sees them, deadlines, calls running in parallel on one connection, cancellation of a
// stream by the client and by Shutdown (the device health stream's wait wakes on the cancel),
// large messages both ways, requests it must refuse, the socket's mode, and connections left idle
// closed. Also the device health stream in both versions it is served in, and the kubelet
// simulator's choice between them.
#include "plugin/socket_server.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "dra_health_v1.grpc.pb.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "grpc_health_v1.grpc.pb.h"
#include "kubelet_simulator.h"
#include "plugin/health_grpc_service.h"
#include "plugin/registration_service.h"

namespace vfio_dra::plugin {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using std::chrono::seconds;

// Generous: the machine may be busy; every wait below ends early on the event it waits for.
constexpr auto kPatience = seconds(60);

class SocketServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-grpc-server-XXXXXX";
    dir_ = mkdtemp(tmpl);
    socket_ = dir_ + "/test.sock";
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Serve(const std::vector<GrpcMethod>& methods,
             std::chrono::milliseconds close_idle_after = std::chrono::milliseconds(0)) {
    auto server = SocketServer::Start(socket_, 0600, methods, "test-grpc", Logger::Discard(),
                                      close_idle_after);
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = std::move(*server);
  }
  grpc::Status Call(const std::string& method, const std::string& request, std::string* response,
                    std::chrono::milliseconds deadline = kPatience) {
    return sim_.CallRaw(socket_, method, request, response, deadline);
  }
  std::unique_ptr<Health::Stub> HealthStub() {
    return Health::NewStub(
        grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  }

  std::string dir_;
  std::string socket_;
  testing::KubeletSimulator sim_;
  std::unique_ptr<SocketServer> server_;
};

TEST_F(SocketServerTest, TheClientSeesTheHandlersStatusCodeAndMessageVerbatim) {
  const std::string message = "claim vms/vm-a: 100% of \"gpu\" taken; naïve\nsecond line";
  Serve({RawUnaryMethod("/t.S/Fail", [&](std::string_view, CallContext&, std::string*) {
    return GrpcStatus{GrpcCode::kFailedPrecondition, message};
  })});
  std::string response;
  const grpc::Status status = Call("/t.S/Fail", "", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), message);
}

// The names of this process's threads (/proc/self/task/*/comm).
std::vector<std::string> ThreadNames() {
  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.push_back(name);
  }
  return names;
}

// gRPC C++ 1.51 serves its callback API on threads of its own ("nexting_thread", two or more)
// that each wake 1.1 times a second while no call comes, the largest part of an idle plugin's
// CPU; the server takes its calls from its completion queue on one thread of ours instead, which
// sleeps until an event.
TEST_F(SocketServerTest, CallsAreTakenOnTheServersOwnQueueThreadNotOnGrpcsPollingThreads) {
  Serve({RawUnaryMethod("/t.S/Echo",
                        [](std::string_view request, CallContext&, std::string* response) {
                          *response = std::string(request);
                          return GrpcStatus::Ok();
                        })});
  std::string response;
  ASSERT_TRUE(Call("/t.S/Echo", "ping", &response).ok());
  EXPECT_EQ(response, "ping");
  EXPECT_THAT(ThreadNames(), ::testing::Not(::testing::Contains("nexting_thread")));
  EXPECT_THAT(ThreadNames(), ::testing::Contains("grpc-queue"));
}

// Kubelets that dial the registration socket by path send that path as :authority, which strict
// HTTP/2 header checks refuse (it has '/' in it).
TEST_F(SocketServerTest, ASocketPathAsAuthorityIsServed) {
  Serve({UnaryMethod<HealthCheckRequest, HealthCheckResponse>(
      "/grpc.health.v1.Health/Check",
      [](const HealthCheckRequest&, CallContext&, HealthCheckResponse* response) {
        response->set_status(HealthCheckResponse::SERVING);
        return GrpcStatus::Ok();
      })});
  grpc::ClientContext context;
  context.set_authority(socket_);
  HealthCheckResponse answer;
  const grpc::Status status = HealthStub()->Check(&context, HealthCheckRequest(), &answer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(answer.status(), HealthCheckResponse::SERVING);
}

TEST_F(SocketServerTest, AnUnknownMethodIsUnimplementedAndNamesThePath) {
  Serve({});
  std::string response;
  const grpc::Status status = Call("/t.S/Nope", "", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(status.error_message().find("/t.S/Nope"), std::string::npos);
}

TEST_F(SocketServerTest, AnUnparsableRequestIsInternalAndTheServerGoesOnServing) {
  std::vector<GrpcMethod> methods;
  methods.push_back(UnaryMethod<HealthCheckRequest, HealthCheckResponse>(
      "/grpc.health.v1.Health/Check",
      [](const HealthCheckRequest&, CallContext&, HealthCheckResponse* response) {
        response->set_status(HealthCheckResponse::SERVING);
        return GrpcStatus::Ok();
      }));
  Serve(methods);
  std::string response;
  // Field 1 announced as a length-delimited string of 100 bytes, with 1 byte following.
  const grpc::Status bad =
      Call("/grpc.health.v1.Health/Check", std::string("\x0a\x64z"), &response);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(bad.error_message().find("HealthCheckRequest"), std::string::npos)
      << bad.error_message();
  HealthCheckResponse answer;
  grpc::ClientContext context;
  ASSERT_TRUE(HealthStub()->Check(&context, HealthCheckRequest(), &answer).ok());
  EXPECT_EQ(answer.status(), HealthCheckResponse::SERVING);
}

TEST_F(SocketServerTest, TheHandlerSeesTheCallersDeadline) {
  std::optional<std::chrono::steady_clock::time_point> seen;
  Serve({RawUnaryMethod("/t.S/Deadline", [&](std::string_view, CallContext& context, std::string*) {
    seen = context.deadline();
    return GrpcStatus::Ok();
  })});
  const auto before = std::chrono::steady_clock::now();
  std::string response;
  ASSERT_TRUE(Call("/t.S/Deadline", "", &response, std::chrono::seconds(45)).ok());
  ASSERT_TRUE(seen.has_value());
  // The header carries the time left when the client sent it, which clients round up (gRPC C++ to
  // a tenth of a second); a busy machine may take long to send it.
  EXPECT_LE(*seen, before + seconds(46));
  EXPECT_GT(*seen, before + seconds(30));
}

TEST_F(SocketServerTest, CallsOnOneConnectionRunInParallel) {
  // Each handler waits until all three are running: calls run one after another never get there.
  std::mutex mu;
  std::condition_variable arrived;
  int running = 0;
  Serve({RawUnaryMethod("/t.S/Meet", [&](std::string_view request, CallContext&, std::string* out) {
    std::unique_lock<std::mutex> lock(mu);
    ++running;
    arrived.notify_all();
    if (!arrived.wait_for(lock, kPatience, [&] { return running >= 3; })) {
      return GrpcStatus{GrpcCode::kDeadlineExceeded, "the other calls never came"};
    }
    *out = std::string(request);
    return GrpcStatus::Ok();
  })});
  sim_.KeepConnections();  // one channel, so one HTTP/2 connection, as the kubelet has
  std::vector<std::future<grpc::Status>> calls;
  calls.reserve(3);
  std::vector<std::string> answers(3);
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      return sim_.CallRaw(socket_, "/t.S/Meet", "call-" + std::to_string(i), &answers[i],
                          kPatience);
    }));
  }
  for (int i = 0; i < 3; ++i) {
    const grpc::Status status = calls[i].get();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(answers[i], "call-" + std::to_string(i));
  }
}

TEST_F(SocketServerTest, LargeMessagesCrossInBothDirections) {
  const std::string big_request(3 * 1024 * 1024 + 17, 'q');
  Serve({RawUnaryMethod("/t.S/Echo", [&](std::string_view request, CallContext&, std::string* out) {
    // Past the HTTP/2 windows both ways, under gRPC clients' 4 MiB receive limit.
    *out = std::string(request) + std::string(size_t{512} << 10, 'r');
    return GrpcStatus::Ok();
  })});
  std::string response;
  const grpc::Status status = Call("/t.S/Echo", big_request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, big_request + std::string(size_t{512} << 10, 'r'));
}

TEST_F(SocketServerTest, ARequestOverTheLimitIsResourceExhaustedAndTheHandlerNeverRuns) {
  std::atomic<bool> ran{false};
  Serve({RawUnaryMethod("/t.S/Echo", [&](std::string_view, CallContext&, std::string*) {
    ran = true;
    return GrpcStatus::Ok();
  })});
  std::string response;
  const grpc::Status status = Call("/t.S/Echo", std::string(kMaxMessageBytes + 1, 'x'), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_FALSE(ran.load());
}

// A stream the client cancels: the handler's next write fails and it sees the cancellation.
TEST_F(SocketServerTest, AClientCancellingAStreamEndsItsHandler) {
  std::promise<bool> handler_saw_cancel;
  Serve({ServerStreamingMethod<HealthCheckRequest, HealthCheckResponse>(
      "/grpc.health.v1.Health/Watch", [&](const HealthCheckRequest&, CallContext& context,
                                          StreamWriter<HealthCheckResponse>& writer) {
        HealthCheckResponse response;
        response.set_status(HealthCheckResponse::SERVING);
        const auto until = std::chrono::steady_clock::now() + kPatience;
        while (writer.Write(response) && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a producer's pace
        }
        handler_saw_cancel.set_value(context.IsCancelled());
        return GrpcStatus::Ok();
      })});
  auto stub = HealthStub();
  grpc::ClientContext context;
  auto reader = stub->Watch(&context, HealthCheckRequest());
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  auto saw = handler_saw_cancel.get_future();
  ASSERT_EQ(saw.wait_for(kPatience), std::future_status::ready);
  EXPECT_TRUE(saw.get());
}

// Issue 40, 7b: the kubelet cancels the device health stream (de-registration, its own restart of
// the watch); the handler waiting out --health-interval between two lists must end at once, not
// an interval later, so a cancelled stream keeps no thread.
TEST_F(SocketServerTest, ACancelledHealthStreamEndsItsHandlerWithoutWaitingForTheInterval) {
  DeviceHealthService health([] { return std::vector<prepare::DeviceHealthStatus>{}; },
                             std::chrono::hours(1), Logger::Discard());
  std::promise<GrpcCode> handler_returned;
  GrpcMethod method = health.Methods().at(0);
  GrpcMethod::ServerStreaming inner = method.server_streaming;
  method.server_streaming = [&, inner](std::string_view request, CallContext& context,
                                       MessageSink& sink) {
    const GrpcStatus status = inner(request, context, sink);
    handler_returned.set_value(status.code);
    return status;
  };
  Serve({method});
  auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  auto stub = v1::DRAResourceHealth::NewStub(channel);
  auto reader = stub->NodeWatchResources(&context, v1::NodeWatchResourcesRequest());
  v1::NodeWatchResourcesResponse response;
  ASSERT_TRUE(reader->Read(&response));  // the first list; the next is an hour away
  context.TryCancel();
  auto returned = handler_returned.get_future();
  ASSERT_EQ(returned.wait_for(kPatience), std::future_status::ready)
      << "the health stream's handler went on waiting after the kubelet cancelled";
  EXPECT_EQ(returned.get(), GrpcCode::kCancelled);
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// The first message of a stream opened through `Service` (either health version's stub).
template <typename Service, typename Request, typename Response>
Response FirstHealthMessage(const std::string& socket) {
  auto stub =
      Service::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kPatience);
  auto reader = stub->NodeWatchResources(&context, Request());
  Response response;
  EXPECT_TRUE(reader->Read(&response));
  context.TryCancel();
  (void)reader->Finish();
  return response;
}

// Issue 45: a 1.37+ kubelet watches v1, older ones v1alpha1; each stream carries the complete list
// with the verdict's validity and the reason, the message bounded as the kubelet wants it.
TEST_F(SocketServerTest, BothHealthVersionsSendTheCompleteListWithTimeoutAndMessage) {
  const std::string gone = "PCI function 0000:5e:02.1 is gone";
  const std::string long_reason(5000, 'x');
  DeviceHealthService health(
      [&] {
        return std::vector<prepare::DeviceHealthStatus>{
            {"node1", "gpu-0000-01-00-0", true, ""},
            {"node1", "vf-0000-5e-02-1", false, gone},
            {"node1", "vf-0000-5e-02-2", false, long_reason}};
      },
      std::chrono::hours(1), Logger::Discard());
  const std::vector<GrpcMethod> methods = health.Methods();
  ASSERT_EQ(methods.size(), 2u);
  EXPECT_EQ(methods[0].path, "/v1.DRAResourceHealth/NodeWatchResources");
  EXPECT_EQ(methods[1].path, "/v1alpha1.DRAResourceHealth/NodeWatchResources");
  Serve(methods);
  const auto v1 = FirstHealthMessage<v1::DRAResourceHealth, v1::NodeWatchResourcesRequest,
                                     v1::NodeWatchResourcesResponse>(socket_);
  const auto alpha =
      FirstHealthMessage<v1alpha1::DRAResourceHealth, v1alpha1::NodeWatchResourcesRequest,
                         v1alpha1::NodeWatchResourcesResponse>(socket_);
  auto check = [&](const auto& message) {
    ASSERT_EQ(message.devices_size(), 3);
    for (const auto& d : message.devices()) {
      EXPECT_EQ(d.device().pool_name(), "node1");
      EXPECT_GT(d.last_updated_time(), 1700000000);
      // Three intervals (an hour each here).
      EXPECT_EQ(d.health_check_timeout_seconds(), 3 * 3600) << d.device().device_name();
      EXPECT_LE(d.message().size(), 1024u);
    }
    EXPECT_EQ(message.devices(0).device().device_name(), "gpu-0000-01-00-0");
    EXPECT_EQ(static_cast<int>(message.devices(0).health()), 1);  // HEALTHY in both
    EXPECT_EQ(message.devices(0).message(), "");
    EXPECT_EQ(message.devices(1).device().device_name(), "vf-0000-5e-02-1");
    EXPECT_EQ(static_cast<int>(message.devices(1).health()), 2);  // UNHEALTHY in both
    EXPECT_EQ(message.devices(1).message(), gone);
    EXPECT_EQ(static_cast<int>(message.devices(2).health()), 2);
    EXPECT_GT(message.devices(2).message().size(), 900u);
  };
  {
    SCOPED_TRACE("v1");
    check(v1);
  }
  {
    SCOPED_TRACE("v1alpha1");
    check(alpha);
  }
  EXPECT_EQ(v1.devices(0).health(), v1::HEALTHY);
  EXPECT_EQ(alpha.devices(1).health(), v1alpha1::UNHEALTHY);
  server_.reset();  // waits for the streams' handlers before `health` goes
}

// The kubelet simulator picks the health version as a 1.37+ kubelet does: v1 when the plugin
// advertises it, else v1alpha1 (against a plugin that serves only that), else none, which a watch
// refuses with the reason. A 1.34 to 1.36 kubelet knows only v1alpha1, whatever is offered.
TEST_F(SocketServerTest, TheKubeletSimulatorWatchesV1WhenOfferedAndV1alpha1Otherwise) {
  DeviceHealthService health(
      [] {
        return std::vector<prepare::DeviceHealthStatus>{{"node1", "gpu-0000-01-00-0", true, ""}};
      },
      std::chrono::hours(1), Logger::Discard());
  const std::vector<GrpcMethod> both = health.Methods();
  struct Case {
    std::vector<std::string> advertised;
    std::vector<GrpcMethod> health_methods;
    std::vector<std::string> kubelet_health;
    std::string chosen;
  };
  const std::vector<std::string> kubelet_137 = {"v1.DRAResourceHealth",
                                                "v1alpha1.DRAResourceHealth"};
  const std::vector<Case> cases = {
      // Only v1 is served, so a watch that works went through v1.
      {{"v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"},
       {both[0]},
       kubelet_137,
       "v1.DRAResourceHealth"},
      // The plugin's order does not matter: the kubelet's preference does.
      {{"v1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"},
       both,
       kubelet_137,
       "v1.DRAResourceHealth"},
      {{"v1.DRAPlugin", "v1alpha1.DRAResourceHealth"},
       {both[1]},
       kubelet_137,
       "v1alpha1.DRAResourceHealth"},
      {{"v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"},
       {both[1]},
       {"v1alpha1.DRAResourceHealth"},
       "v1alpha1.DRAResourceHealth"},
      {{"v1.DRAPlugin"}, {}, kubelet_137, ""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE("case " + std::to_string(i) + ": kubelet wants " + c.kubelet_health[0]);
    server_.reset();
    socket_ = dir_ + "/plugin-" + std::to_string(i) + ".sock";
    RegistrationService registration("vfio.example.io", socket_, c.advertised, Logger::Discard());
    std::vector<GrpcMethod> methods = registration.Methods();
    methods.insert(methods.end(), c.health_methods.begin(), c.health_methods.end());
    Serve(methods);
    testing::KubeletSimulator kubelet({"v1.DRAPlugin"}, c.kubelet_health);
    auto plugin = kubelet.Register(socket_);
    ASSERT_TRUE(plugin.ok()) << plugin.error().message;
    EXPECT_EQ(plugin->health_service, c.chosen);
    auto messages = kubelet.WatchHealth(
        *plugin, [](const auto& m) { return m.devices_size() > 0; }, kPatience);
    server_.reset();  // waits for the stream's handler; `registration` goes next
    if (c.chosen.empty()) {
      ASSERT_FALSE(messages.ok());
      EXPECT_THAT(messages.error().message, ::testing::HasSubstr("advertises no health service"));
      continue;
    }
    ASSERT_TRUE(messages.ok()) << messages.error().message;
    EXPECT_EQ(messages->back().devices(0).device().device_name(), "gpu-0000-01-00-0");
    EXPECT_EQ(messages->back().devices(0).health(), v1::HEALTHY);
  }
}

// Shutdown with no grace cancels a stream that would run forever, waits for its handler, and
// the client gets the handler's final status.
TEST_F(SocketServerTest, ShutdownCancelsOpenStreamsAndWaitsForTheirHandlers) {
  std::atomic<bool> handler_returned{false};
  Serve({ServerStreamingMethod<HealthCheckRequest, HealthCheckResponse>(
      "/grpc.health.v1.Health/Watch", [&](const HealthCheckRequest&, CallContext& context,
                                          StreamWriter<HealthCheckResponse>& writer) {
        HealthCheckResponse response;
        writer.Write(response);
        while (!context.IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        handler_returned = true;
        return GrpcStatus{GrpcCode::kUnavailable, "the plugin is stopping"};
      })});
  auto stub = HealthStub();
  grpc::ClientContext context;
  auto reader = stub->Watch(&context, HealthCheckRequest());
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  server_->Shutdown(std::chrono::milliseconds(0));
  EXPECT_TRUE(handler_returned.load());
  while (reader->Read(&response)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

// A running unary call finishes within the grace period and its answer reaches the client.
TEST_F(SocketServerTest, ShutdownLetsARunningCallFinishWithinTheGrace) {
  std::promise<void> entered;
  std::promise<void> release;
  auto released = release.get_future().share();
  Serve({RawUnaryMethod("/t.S/Slow", [&](std::string_view, CallContext&, std::string* out) {
    entered.set_value();
    released.wait();
    *out = "done";
    return GrpcStatus::Ok();
  })});
  std::string response;
  auto call = std::async(std::launch::async, [&] { return Call("/t.S/Slow", "", &response); });
  entered.get_future().wait();
  auto stopped = std::async(std::launch::async, [&] { server_->Shutdown(kPatience); });
  release.set_value();
  stopped.get();
  const grpc::Status status = call.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, "done");
}

TEST_F(SocketServerTest, TheSocketHasTheModeAskedForAndIsNotHiddenUnderATemporaryName) {
  Serve({});
  struct stat st {};
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600U);
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string(), "test.sock");
  }
}

// What the kubelet's plugin watcher sees (inotify on the registration directory): it stats every
// name created there, and a name gone by then is an error in its log ("Error when handling create
// event"). The real kubelet logged one on each plugin start while the socket was bound under a
// hidden name and renamed into place; only the socket's own name may appear.
TEST_F(SocketServerTest, OnlyTheSocketsOwnNameAppearsInItsDirectory) {
  const int watch = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  ASSERT_GE(watch, 0);
  ASSERT_GE(::inotify_add_watch(watch, dir_.c_str(), IN_CREATE | IN_MOVED_TO), 0);
  Serve({});
  std::vector<std::string> names;
  alignas(inotify_event) char buffer[4096];
  for (ssize_t n; (n = ::read(watch, buffer, sizeof buffer)) > 0;) {
    for (char* p = buffer; p < buffer + n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(p);
      if (event->len > 0) names.emplace_back(event->name);
      p += sizeof(inotify_event) + event->len;
    }
  }
  ::close(watch);
  EXPECT_EQ(names, std::vector<std::string>{"test.sock"});
}

// The longest path a socket address holds (107 bytes) is served: binding must not need more room
// than the final name (a temporary name once added the PID and so failed in the kubelet's
// registration directory on a host whose PIDs have seven digits).
TEST_F(SocketServerTest, ASocketPathOfTheLongestLengthIsServed) {
  constexpr size_t kLongest = sizeof(sockaddr_un::sun_path) - 1;
  socket_ = dir_ + "/";
  socket_ += std::string(kLongest - socket_.size() - 5, 'r') + ".sock";
  ASSERT_EQ(socket_.size(), kLongest);
  Serve({});
  struct stat st {};
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0) << socket_;
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  socket_ += "x";
  auto refused = SocketServer::Start(socket_, 0600, {}, "test-grpc", Logger::Discard(),
                                     std::chrono::milliseconds(0));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("is too long"), std::string::npos)
      << refused.error().message;
}

// Health/Check that waits for `gate` (when set) before answering SERVING.
GrpcMethod GatedCheck(std::shared_future<void>* gate, std::promise<void>* entered) {
  return UnaryMethod<HealthCheckRequest, HealthCheckResponse>(
      "/grpc.health.v1.Health/Check",
      [gate, entered](const HealthCheckRequest&, CallContext&, HealthCheckResponse* response) {
        if (gate != nullptr) {
          entered->set_value();
          gate->wait();
        }
        response->set_status(HealthCheckResponse::SERVING);
        return GrpcStatus::Ok();
      });
}

grpc::Status Check(Health::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kPatience);
  HealthCheckResponse answer;
  return stub.Check(&context, HealthCheckRequest(), &answer);
}

// A connection with no call for the limit gets GOAWAY and is closed (the client's channel leaves
// READY on its own); the same channel's next call reconnects and is answered.
TEST_F(SocketServerTest, AConnectionIdleForTheLimitIsClosedAndTheClientReconnects) {
  Serve({GatedCheck(nullptr, nullptr)}, std::chrono::milliseconds(500));
  auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
  auto stub = Health::NewStub(channel);
  ASSERT_TRUE(Check(*stub).ok());  // the channel was READY for it
  ASSERT_TRUE(
      channel->WaitForStateChange(GRPC_CHANNEL_READY, std::chrono::system_clock::now() + kPatience))
      << "the server never closed the idle connection";
  EXPECT_NE(channel->GetState(false), GRPC_CHANNEL_READY);
  const grpc::Status again = Check(*stub);
  EXPECT_TRUE(again.ok()) << again.error_message();
}

// A call open longer than the limit keeps its connection: the channel stays READY for three
// times the limit while the call runs, and the connection is closed only once it has been idle.
TEST_F(SocketServerTest, AConnectionWithACallOpenIsNotClosedAsIdle) {
  constexpr auto kLimit = std::chrono::milliseconds(300);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::promise<void> entered;
  Serve({GatedCheck(&gate, &entered)}, kLimit);
  auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
  auto stub = Health::NewStub(channel);
  auto call = std::async(std::launch::async, [&] { return Check(*stub); });
  // The handler is let go however the test ends: before `call`'s destructor waits for the answer.
  struct Releaser {
    std::promise<void>& promise;
    bool done = false;
    void Release() {
      if (!done) promise.set_value();
      done = true;
    }
    ~Releaser() { Release(); }
  } releaser{release};
  ASSERT_EQ(entered.get_future().wait_for(kPatience), std::future_status::ready);
  ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  // The expected outcome is that nothing happens: the wait runs out.
  EXPECT_FALSE(channel->WaitForStateChange(GRPC_CHANNEL_READY,
                                           std::chrono::system_clock::now() + 3 * kLimit))
      << "the server closed a connection with a call open";
  releaser.Release();
  const grpc::Status status = call.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(
      channel->WaitForStateChange(GRPC_CHANNEL_READY, std::chrono::system_clock::now() + kPatience))
      << "the connection, idle once the call ended, was never closed";
}

}  // namespace
}  // namespace vfio_dra::plugin
