// KubeletSimulator: a test stand-in for the kubelet's side of DRA. It finds the plugin the way
// the kubelet's plugin watcher does (inotify on the registrar directory; dot-files and
// non-sockets ignored), registers it (GetInfo, then NotifyRegistrationStatus), picks the DRA API
// as a 1.34+ kubelet does (the first entry of the plugin's list that it supports) and the health
// stream's version as a 1.37+ kubelet does (v1 when advertised, else v1alpha1), and calls
// NodePrepareResources / NodeUnprepareResources by their full wire method names through a
// generic stub, so it depends on nothing but the wire contract.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "dra_health_v1.pb.h"
#include "dra_v1.pb.h"

namespace vfio_dra::testing {

struct SimClaim {
  std::string namespace_;
  std::string name;
  std::string uid;
};

struct RegisteredPlugin {
  std::string registration_socket;
  std::string name;
  std::string endpoint;
  std::vector<std::string> supported_versions;
  std::string chosen_service;  // "v1.DRAPlugin" or "v1beta1.DRAPlugin"
  // "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth", or "" when the plugin advertises
  // neither (the stream is optional; registration succeeds without it).
  std::string health_service;
};

class KubeletSimulator {
 public:
  // DRA services this simulated kubelet speaks, in the order it accepts them (1.34+), and the
  // health stream versions it knows, in the order it prefers them whatever the plugin's order
  // (1.37+; a 1.34 to 1.36 kubelet knows only v1alpha1).
  explicit KubeletSimulator(std::vector<std::string> kubelet_services = {"v1.DRAPlugin",
                                                                         "v1beta1.DRAPlugin"},
                            std::vector<std::string> kubelet_health_services = {
                                "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"});

  // Keeps one connection per socket across calls, as the 1.34+ kubelet keeps one ClientConn per
  // plugin instance (benchmarks use it). By default every call dials anew, which a kubelet may do
  // at will: tests restart daemons under the same socket path, and a kept channel would first
  // wait out gRPC's reconnect backoff.
  void KeepConnections() { keep_connections_ = true; }

  // Waits until a socket named `*-reg.sock` appears in `registrar_dir` (or is already there).
  Result<std::string> WaitForRegistrationSocket(const std::string& registrar_dir,
                                                std::chrono::milliseconds timeout);
  // Dial (blocking, 10 s) and GetInfo (1 s) as the kubelet does, the version choices, and
  // NotifyRegistrationStatus.
  Result<RegisteredPlugin> Register(const std::string& registration_socket);
  // Sends NotifyRegistrationStatus(false, reason) as a kubelet rejecting the plugin would.
  Status Reject(const std::string& registration_socket, const std::string& reason);

  // Calls the chosen service (or `service` when given) with the 45 s kubelet deadline.
  Result<k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse> Prepare(
      const RegisteredPlugin& plugin, const std::vector<SimClaim>& claims,
      const std::string& service = "");
  Result<k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse> Unprepare(
      const RegisteredPlugin& plugin, const std::vector<SimClaim>& claims,
      const std::string& service = "");

  // Opens the device health stream (NodeWatchResources of plugin.health_service) as a kubelet
  // with the ResourceHealthStatus gate does, and reads messages until `done` accepts one or
  // `timeout` passes; returns every message read. v1alpha1 messages are read as v1 ones (the
  // same fields and numbers), as the 1.37 kubelet does. An error when the plugin advertises no
  // version this kubelet knows, the stream fails, or `done` never accepted a message.
  using HealthMessage = ::v1::NodeWatchResourcesResponse;
  Result<std::vector<HealthMessage>> WatchHealth(
      const RegisteredPlugin& plugin, const std::function<bool(const HealthMessage&)>& done,
      std::chrono::milliseconds timeout);

  // Calls any unary method by its full path with raw request bytes; returns the gRPC status.
  // With `wait_for_ready`, the call waits for the socket to accept connections until the
  // deadline, as the kubelet's blocking dial of a registration socket does.
  grpc::Status CallRaw(const std::string& socket, const std::string& method,
                       const std::string& request_bytes, std::string* response_bytes,
                       std::chrono::milliseconds deadline, bool wait_for_ready = false);

  // The wire path of a DRA or health method for a registration identifier such as
  // "v1.DRAPlugin".
  static Result<std::string> MethodPath(const std::string& service, const std::string& method);

 private:
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& socket);

  std::vector<std::string> kubelet_services_;
  std::vector<std::string> kubelet_health_services_;
  bool keep_connections_ = false;
  std::mutex channels_mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
};

}  // namespace vfio_dra::testing
