// kubelet-sim: the kubelet simulator as a command, for the demo and the VM tests.
//   kubelet-sim register  --registrar-dir D
//   kubelet-sim prepare   --registrar-dir D --claim ns/name/uid [--claim ...]
//   kubelet-sim unprepare --registrar-dir D --claim ns/name/uid [--claim ...]
//   kubelet-sim watch-health --registrar-dir D [--messages N] [--timeout S]
// Prints the plugin's answer as JSON on stdout; exits 1 when the call or registration fails.
// `register` names the DRA and health services it chose; `watch-health` says on stderr which
// health version it watched (v1 when the plugin offers it, else v1alpha1).
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kubelet_simulator.h"

namespace {

bool ParseClaims(const std::vector<std::string>& specs,
                 std::vector<vfio_dra::testing::SimClaim>& out) {
  for (const std::string& spec : specs) {
    const auto a = spec.find('/');
    const auto b = spec.find('/', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos) {
      std::cerr << "kubelet-sim: --claim wants namespace/name/uid, got " << spec << "\n";
      return false;
    }
    out.push_back({spec.substr(0, a), spec.substr(a + 1, b - a - 1), spec.substr(b + 1)});
  }
  return true;
}

// The answers as JSON with the proto field names, fields at their default value left out (what
// the VM tests and the demo read). The messages are generated for protobuf's lite runtime, which
// has no JSON printer.
template <typename Repeated>
std::vector<std::string> Strings(const Repeated& repeated) {
  return {repeated.begin(), repeated.end()};
}

template <typename Response>
nlohmann::json ClaimsJson(const Response& response) {
  nlohmann::json claims = nlohmann::json::object();
  for (const auto& entry : response.claims()) {
    // Not a structured binding: clang does not let a requires-expression name one.
    const auto& result = entry.second;
    nlohmann::json claim = nlohmann::json::object();
    if (!result.error().empty()) claim["error"] = result.error();
    if constexpr (requires { result.devices(); }) {
      for (const auto& device : result.devices()) {
        nlohmann::json d = {{"request_names", Strings(device.request_names())},
                            {"pool_name", device.pool_name()},
                            {"device_name", device.device_name()},
                            {"cdi_device_ids", Strings(device.cdi_device_ids())}};
        if constexpr (requires { device.share_id(); }) {
          if (!device.share_id().empty()) d["share_id"] = device.share_id();
        }
        claim["devices"].push_back(d);
      }
    }
    claims[entry.first] = claim;
  }
  return {{"claims", claims}};
}

std::string ToJson(const vfio_dra::testing::KubeletSimulator::HealthMessage& message) {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& health : message.devices()) {
    // proto3 JSON writes 64-bit integers as strings and enums by name.
    devices.push_back(
        {{"device",
          {{"pool_name", health.device().pool_name()},
           {"device_name", health.device().device_name()}}},
         {"health", v1::HealthStatus_Name(health.health())},
         {"last_updated_time", std::to_string(health.last_updated_time())},
         {"health_check_timeout_seconds", std::to_string(health.health_check_timeout_seconds())},
         {"message", health.message()}});
  }
  return nlohmann::json{{"devices", devices}}.dump(2);
}

template <typename Response>
std::string ToJson(const Response& response) {
  return ClaimsJson(response).dump(2);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kubelet-sim: the kubelet's side of DRA, for tests and the demo"};
  app.require_subcommand(1);
  std::string registrar_dir;
  std::string service;
  std::vector<std::string> claim_specs;
  int wait_seconds = 30;
  auto* reg = app.add_subcommand("register", "find and register the plugin");
  auto* prep = app.add_subcommand("prepare", "call NodePrepareResources");
  auto* unprep = app.add_subcommand("unprepare", "call NodeUnprepareResources");
  auto* watch = app.add_subcommand("watch-health", "read the device health stream");
  int messages = 1;
  int timeout_seconds = 30;
  watch->add_option("--messages", messages, "messages to read before exiting")
      ->check(CLI::Range(1, 1000));
  watch->add_option("--timeout", timeout_seconds, "seconds to wait for them");
  for (auto* cmd : {reg, prep, unprep, watch}) {
    cmd->add_option("--registrar-dir", registrar_dir, "kubelet plugin registration directory")
        ->required();
    cmd->add_option("--wait", wait_seconds, "seconds to wait for the plugin to appear");
    cmd->add_option("--service", service, "force v1.DRAPlugin or v1beta1.DRAPlugin");
  }
  for (auto* cmd : {prep, unprep}) {
    cmd->add_option("--claim", claim_specs, "namespace/name/uid")->required();
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  vfio_dra::testing::KubeletSimulator sim;
  auto socket = sim.WaitForRegistrationSocket(registrar_dir, std::chrono::seconds(wait_seconds));
  if (!socket.ok()) {
    std::cerr << "kubelet-sim: " << socket.error().message << "\n";
    return 1;
  }
  auto plugin = sim.Register(*socket);
  if (!plugin.ok()) {
    std::cerr << "kubelet-sim: registration failed: " << plugin.error().message << "\n";
    return 1;
  }
  if (reg->parsed()) {
    std::cout << "{\"name\": \"" << plugin->name << "\", \"endpoint\": \"" << plugin->endpoint
              << "\", \"service\": \"" << plugin->chosen_service << "\", \"health_service\": \""
              << plugin->health_service << "\"}" << std::endl;
    return 0;
  }
  if (watch->parsed()) {
    std::cerr << "kubelet-sim: watching the device health stream through "
              << (plugin->health_service.empty() ? "(none)" : plugin->health_service) << "\n";
    int seen = 0;
    auto read = sim.WatchHealth(
        *plugin, [&](const auto& /*message*/) { return ++seen >= messages; },
        std::chrono::seconds(timeout_seconds));
    if (!read.ok()) {
      std::cerr << "kubelet-sim: " << read.error().message << "\n";
      return 1;
    }
    for (const auto& message : *read) std::cout << ToJson(message) << std::endl;
    return 0;
  }
  std::vector<vfio_dra::testing::SimClaim> claims;
  if (!ParseClaims(claim_specs, claims)) return 2;
  // Prints the answer as JSON; any per-claim error makes the exit code 1.
  auto report = [](const auto& response) {
    if (!response.ok()) {
      std::cerr << "kubelet-sim: " << response.error().message << "\n";
      return 1;
    }
    std::cout << ToJson(*response) << std::endl;
    for (const auto& [uid, result] : response->claims()) {
      if (!result.error().empty()) return 1;
    }
    return 0;
  };
  if (prep->parsed()) return report(sim.Prepare(*plugin, claims, service));
  return report(sim.Unprepare(*plugin, claims, service));
}
