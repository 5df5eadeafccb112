// kubelet-sim: the kubelet simulator as a command, for the demo and the VM tests.
//   kubelet-sim register  --registrar-dir D
//   kubelet-sim prepare   --registrar-dir D --claim ns/name/uid [--claim ...]
//   kubelet-sim unprepare --registrar-dir D --claim ns/name/uid [--claim ...]
//   kubelet-sim watch-health --registrar-dir D [--messages N] [--timeout S]
// Prints the plugin's answer as JSON on stdout; exits 1 when the call or registration fails.
#include <google/protobuf/util/json_util.h>

#include <CLI/CLI.hpp>
#include <iostream>

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

template <typename Message>
std::string ToJson(const Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
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
              << "\", \"service\": \"" << plugin->chosen_service << "\"}" << std::endl;
    return 0;
  }
  if (watch->parsed()) {
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
