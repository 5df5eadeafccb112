#include "discovery/vgpu_gpu_sizes_file.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/file_io.h"

namespace vfio_dra::discovery {
namespace {

constexpr int kVersion = 1;
constexpr int kLargestFrameBufferGb = 1 << 20;

// A positive type ID as the driver prints it.
std::optional<int> ParseTypeId(const std::string& text) {
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const int value = std::stoi(text);
  return value > 0 ? std::optional<int>(value) : std::nullopt;
}

}  // namespace

Result<VgpuGpuSizes> LoadVgpuGpuSizes(const std::string& path) {
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) {
    if (text.error().kind == ErrorKind::kNotFound) return VgpuGpuSizes{};
    return text.error().Wrap("reading the GPUs' vGPU frame buffers");
  }
  const auto json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return MakeError(ErrorKind::kInvalidArgument, path + ": " + what);
  };
  if (json.is_discarded()) return bad("not valid JSON");
  if (!json.is_object() || json.value("kind", "") != "VgpuGpuSizes") {
    return bad("not a VgpuGpuSizes document");
  }
  if (!json.contains("version") || !json["version"].is_number_integer() ||
      json["version"].get<int>() != kVersion) {
    return bad("unknown version (this daemon reads version " + std::to_string(kVersion) + ")");
  }
  if (!json.contains("gpus") || !json["gpus"].is_object()) return bad("no gpus object");
  VgpuGpuSizes sizes;
  for (const auto& [pf, gpu] : json["gpus"].items()) {
    if (!gpu.is_object() || !gpu.contains("model") || !gpu["model"].is_string() ||
        !gpu.contains("largestGB") || !gpu["largestGB"].is_number_integer() ||
        !gpu.contains("largestType") || !gpu["largestType"].is_string()) {
      return bad("gpus." + pf + ": expected {model, largestGB, largestType}");
    }
    const int64_t gb = gpu["largestGB"].get<int64_t>();
    if (gb < 1 || gb > kLargestFrameBufferGb) {
      return bad("gpus." + pf + ".largestGB: " + std::to_string(gb) + " is out of range");
    }
    VgpuGpuSize& size = sizes[pf];
    size = {gpu["model"].get<std::string>(),
            static_cast<int>(gb),
            gpu["largestType"].get<std::string>(),
            {}};
    if (!gpu.contains("types") || !gpu["types"].is_object()) {
      return bad("gpus." + pf + ".types: expected an object of type names by ID");
    }
    for (const auto& [id, name] : gpu["types"].items()) {
      auto value = ParseTypeId(id);
      if (!value || !name.is_string()) {
        return bad("gpus." + pf + ".types." + id + ": expected a type ID and its name");
      }
      size.types[*value] = name.get<std::string>();
    }
  }
  return sizes;
}

VgpuGpuSizes LoadVgpuGpuSizesOrMoveAside(const std::string& path, std::string& warning) {
  auto loaded = LoadVgpuGpuSizes(path);
  if (loaded.ok()) return std::move(*loaded);
  const std::string aside = path + ".bad";
  const bool moved = std::rename(path.c_str(), aside.c_str()) == 0;
  warning = "ignoring the GPUs' remembered vGPU frame buffers (" + loaded.error().message +
            (moved ? "; moved aside to " + aside : "; could not move it aside") +
            "): a GPU that runs a vGPU type offers nothing new until it is idle again or its "
            "layout declares a count";
  return {};
}

Status SaveVgpuGpuSizes(const std::string& path, const VgpuGpuSizes& sizes) {
  nlohmann::json gpus = nlohmann::json::object();
  for (const auto& [pf, size] : sizes) {
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [id, name] : size.types) types[std::to_string(id)] = name;
    gpus[pf] = {{"model", size.model},
                {"largestGB", size.largest_gb},
                {"largestType", size.largest_name},
                {"types", types}};
  }
  const nlohmann::json json = {{"kind", "VgpuGpuSizes"}, {"version", kVersion}, {"gpus", gpus}};
  return WriteFileAtomically(path, json.dump(2) + "\n", 0644);
}

}  // namespace vfio_dra::discovery
