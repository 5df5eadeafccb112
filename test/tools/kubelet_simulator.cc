#include "kubelet_simulator.h"

#include <grpcpp/generic/generic_stub.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <type_traits>

#include "dra_health_v1.grpc.pb.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "pluginregistration.pb.h"

namespace vfio_dra::testing {
namespace {

bool IsSocket(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

std::optional<std::string> FindRegistrationSocket(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;  // the kubelet ignores dot-files
    if (name.size() > 9 && name.substr(name.size() - 9) == "-reg.sock" &&
        IsSocket(entry.path().string())) {
      return entry.path().string();
    }
  }
  return std::nullopt;
}

std::shared_ptr<grpc::Channel> UnixChannel(const std::string& socket) {
  return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
}

}  // namespace

KubeletSimulator::KubeletSimulator(std::vector<std::string> kubelet_services,
                                   std::vector<std::string> kubelet_health_services)
    : kubelet_services_(std::move(kubelet_services)),
      kubelet_health_services_(std::move(kubelet_health_services)) {}

Result<std::string> KubeletSimulator::WaitForRegistrationSocket(const std::string& registrar_dir,
                                                                std::chrono::milliseconds timeout) {
  std::filesystem::create_directories(registrar_dir);
  const int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return MakeError(ErrorKind::kInternal, "inotify_init1 failed");
  inotify_add_watch(fd, registrar_dir.c_str(), IN_CREATE | IN_MOVED_TO);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    // Checked after the watch is in place, so a socket created in between is not missed.
    if (auto found = FindRegistrationSocket(registrar_dir)) {
      ::close(fd);
      return *found;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::close(fd);
      return MakeError(ErrorKind::kDeadlineExceeded,
                       "no registration socket appeared in " + registrar_dir);
    }
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
    char buf[4096];
    while (::read(fd, buf, sizeof buf) > 0) {
    }
  }
}

std::shared_ptr<grpc::Channel> KubeletSimulator::ChannelTo(const std::string& socket) {
  if (!keep_connections_) return UnixChannel(socket);
  std::lock_guard<std::mutex> lock(channels_mu_);
  auto& channel = channels_[socket];
  if (!channel) channel = UnixChannel(socket);
  return channel;
}

grpc::Status KubeletSimulator::CallRaw(const std::string& socket, const std::string& method,
                                       const std::string& request_bytes,
                                       std::string* response_bytes,
                                       std::chrono::milliseconds deadline, bool wait_for_ready) {
  grpc::GenericStub stub(ChannelTo(socket));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  context.set_wait_for_ready(wait_for_ready);
  grpc::CompletionQueue cq;
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (status.ok() && response_bytes != nullptr) {
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    response_bytes->clear();
    for (const auto& s : slices) {
      response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

Result<std::string> KubeletSimulator::MethodPath(const std::string& service,
                                                 const std::string& method) {
  // Registration identifiers are not gRPC service names (except for health).
  if (service == "v1.DRAPlugin") return "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/" + method;
  if (service == "v1beta1.DRAPlugin") {
    return "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/" + method;
  }
  if (service == "v1.DRAResourceHealth") return "/v1.DRAResourceHealth/" + method;
  if (service == "v1alpha1.DRAResourceHealth") return "/v1alpha1.DRAResourceHealth/" + method;
  return MakeError(ErrorKind::kInvalidArgument, "unknown DRA service " + service);
}

Result<RegisteredPlugin> KubeletSimulator::Register(const std::string& registration_socket) {
  std::string info_bytes;
  grpc::Status status = CallRaw(registration_socket, "/pluginregistration.Registration/GetInfo",
                                pluginregistration::InfoRequest().SerializeAsString(), &info_bytes,
                                std::chrono::seconds(11), /*wait_for_ready=*/true);
  if (!status.ok()) {
    return MakeError(ErrorKind::kUnavailable, "GetInfo failed: " + status.error_message());
  }
  pluginregistration::PluginInfo info;
  if (!info.ParseFromString(info_bytes)) {
    return MakeError(ErrorKind::kInternal, "GetInfo returned an unparsable PluginInfo");
  }
  RegisteredPlugin plugin;
  plugin.registration_socket = registration_socket;
  plugin.name = info.name();
  plugin.endpoint = info.endpoint().empty() ? registration_socket : info.endpoint();
  plugin.supported_versions.assign(info.supported_versions().begin(),
                                   info.supported_versions().end());
  std::string error;
  if (info.type() != "DRAPlugin") {
    error = "no handler registered for plugin type: " + info.type();
  } else if (plugin.supported_versions.empty()) {
    error = "empty list of supported versions";
  } else {
    for (const std::string& offered : plugin.supported_versions) {
      if (std::find(kubelet_services_.begin(), kubelet_services_.end(), offered) !=
          kubelet_services_.end()) {
        plugin.chosen_service = offered;
        break;
      }
    }
    if (plugin.chosen_service.empty()) {
      error = "none of services supported by the plugin are supported by the kubelet";
    }
    for (const std::string& known : kubelet_health_services_) {
      if (std::find(plugin.supported_versions.begin(), plugin.supported_versions.end(), known) !=
          plugin.supported_versions.end()) {
        plugin.health_service = known;
        break;
      }
    }
  }
  pluginregistration::RegistrationStatus notify;
  notify.set_plugin_registered(error.empty());
  notify.set_error(error);
  status = CallRaw(registration_socket, "/pluginregistration.Registration/NotifyRegistrationStatus",
                   notify.SerializeAsString(), nullptr, std::chrono::seconds(5));
  if (!error.empty()) return MakeError(ErrorKind::kFailedPrecondition, error);
  if (!status.ok()) {
    return MakeError(ErrorKind::kUnavailable,
                     "NotifyRegistrationStatus failed: " + status.error_message());
  }
  return plugin;
}

Status KubeletSimulator::Reject(const std::string& registration_socket, const std::string& reason) {
  pluginregistration::RegistrationStatus notify;
  notify.set_plugin_registered(false);
  notify.set_error(reason);
  // Waits for the socket to accept, as Register's GetInfo does: the plugin binds it at its final
  // name, so it can be seen an instant before it listens (the kubelet's reconciler retries).
  grpc::Status status =
      CallRaw(registration_socket, "/pluginregistration.Registration/NotifyRegistrationStatus",
              notify.SerializeAsString(), nullptr, std::chrono::seconds(5),
              /*wait_for_ready=*/true);
  if (!status.ok()) return MakeError(ErrorKind::kUnavailable, status.error_message());
  return Status::Ok();
}

template <typename Request>
static void FillClaims(Request& request, const std::vector<SimClaim>& claims) {
  for (const SimClaim& c : claims) {
    auto* pb = request.add_claims();
    pb->set_namespace_(c.namespace_);
    pb->set_name(c.name);
    pb->set_uid(c.uid);
  }
}

// One DRA call: the v1 message types encode both versions (they are wire-identical).
template <typename Request, typename Response>
static Result<Response> CallDra(KubeletSimulator& sim, const RegisteredPlugin& plugin,
                                const std::vector<SimClaim>& claims, const std::string& service,
                                const std::string& method) {
  auto path =
      KubeletSimulator::MethodPath(service.empty() ? plugin.chosen_service : service, method);
  if (!path.ok()) return path.error();
  Request request;
  FillClaims(request, claims);
  std::string bytes;
  grpc::Status status = sim.CallRaw(plugin.endpoint, *path, request.SerializeAsString(), &bytes,
                                    std::chrono::seconds(45));
  if (!status.ok()) {
    return MakeError(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT
                         ? ErrorKind::kInvalidArgument
                         : ErrorKind::kUnavailable,
                     method + ": " + status.error_message());
  }
  Response response;
  if (!response.ParseFromString(bytes)) {
    return MakeError(ErrorKind::kInternal, "unparsable " + method + " response");
  }
  return response;
}

Result<k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse>
KubeletSimulator::Prepare(const RegisteredPlugin& plugin, const std::vector<SimClaim>& claims,
                          const std::string& service) {
  return CallDra<k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesRequest,
                 k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse>(
      *this, plugin, claims, service, "NodePrepareResources");
}

Result<k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse>
KubeletSimulator::Unprepare(const RegisteredPlugin& plugin, const std::vector<SimClaim>& claims,
                            const std::string& service) {
  return CallDra<k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesRequest,
                 k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse>(
      *this, plugin, claims, service, "NodeUnprepareResources");
}

// One health stream through the generated stub of `Service`, whatever its version.
template <typename Service, typename Request, typename Response>
static Result<std::vector<KubeletSimulator::HealthMessage>> ReadHealthStream(
    const std::string& endpoint,
    const std::function<bool(const KubeletSimulator::HealthMessage&)>& done,
    std::chrono::milliseconds timeout) {
  using HealthMessage = KubeletSimulator::HealthMessage;
  auto stub = Service::NewStub(UnixChannel(endpoint));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  auto reader = stub->NodeWatchResources(&context, Request());
  std::vector<HealthMessage> messages;
  bool accepted = false;
  for (Response read; reader->Read(&read);) {
    HealthMessage message;
    if constexpr (std::is_same_v<Response, HealthMessage>) {
      message = std::move(read);
    } else if (!message.ParseFromString(read.SerializeAsString())) {
      return MakeError(ErrorKind::kInternal, "a health message does not parse as v1");
    }
    messages.push_back(message);
    if (done(message)) {
      accepted = true;
      context.TryCancel();
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  if (accepted) return messages;
  if (!status.ok() && status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return MakeError(ErrorKind::kUnavailable, "NodeWatchResources failed after " +
                                                  std::to_string(messages.size()) +
                                                  " messages: " + status.error_message());
  }
  return MakeError(ErrorKind::kDeadlineExceeded,
                   "no awaited health message within " + std::to_string(timeout.count()) + " ms (" +
                       std::to_string(messages.size()) + " messages read)");
}

Result<std::vector<KubeletSimulator::HealthMessage>> KubeletSimulator::WatchHealth(
    const RegisteredPlugin& plugin, const std::function<bool(const HealthMessage&)>& done,
    std::chrono::milliseconds timeout) {
  if (plugin.health_service == "v1.DRAResourceHealth") {
    return ReadHealthStream<::v1::DRAResourceHealth, ::v1::NodeWatchResourcesRequest,
                            ::v1::NodeWatchResourcesResponse>(plugin.endpoint, done, timeout);
  }
  if (plugin.health_service == "v1alpha1.DRAResourceHealth") {
    return ReadHealthStream<::v1alpha1::DRAResourceHealth, ::v1alpha1::NodeWatchResourcesRequest,
                            ::v1alpha1::NodeWatchResourcesResponse>(plugin.endpoint, done, timeout);
  }
  std::string known;
  for (const std::string& service : kubelet_health_services_) {
    known += (known.empty() ? "" : ", ") + service;
  }
  return MakeError(
      ErrorKind::kFailedPrecondition,
      "plugin " + plugin.name + " advertises no health service this kubelet knows (" + known + ")");
}

}  // namespace vfio_dra::testing
