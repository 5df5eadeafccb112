#include "slicepublisher/packed_device_table.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "slicepublisher/device_attributes.h"

namespace vfio_dra::slicepublisher {
namespace {

// The layout of one device: name, attributes, counter consumptions, taints. A string is its length
// (a LEB128 varint) and its bytes; an attribute name the builder uses is one byte (its index here,
// plus one), any other a zero and the string; a value is a tag byte and an 8-byte integer, a bool
// byte or a string.
constexpr std::array<const char*, 19> kKnownNames = {
    attribute::kPciBusId,    attribute::kPcieRoot,      attribute::kNumaNode,
    attribute::kType,        attribute::kVendorId,      attribute::kDeviceId,
    attribute::kProductName, attribute::kIommuGroup,    attribute::kHostDriver,
    attribute::kVfioDriver,  attribute::kUnsafeNoIommu, attribute::kPfPciAddress,
    attribute::kVfIndex,     attribute::kNetdev,        attribute::kMdevUuid,
    attribute::kMdevType,    attribute::kMdevParent,    attribute::kParentPciAddress,
    attribute::kMacAddress,
};
static_assert(kKnownNames.size() < 255);

enum Tag : char { kInt = 0, kBool = 1, kString = 2, kVersion = 3 };

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void PutString(std::string& out, std::string_view text) {
  PutVarint(out, text.size());
  out.append(text);
}

void PutName(std::string& out, const std::string& name) {
  auto known = std::find_if(kKnownNames.begin(), kKnownNames.end(),
                            [&](const char* candidate) { return name == candidate; });
  if (known != kKnownNames.end()) {
    out.push_back(static_cast<char>(known - kKnownNames.begin() + 1));
    return;
  }
  out.push_back(0);
  PutString(out, name);
}

void PutInt(std::string& out, int64_t value) {
  std::array<char, sizeof value> raw{};
  std::memcpy(raw.data(), &value, sizeof value);
  out.append(raw.data(), raw.size());
}

void Pack(std::string& out, const SliceDevice& device) {
  PutString(out, device.name);
  PutVarint(out, device.attributes.size());
  for (const auto& [name, value] : device.attributes) {
    PutName(out, name);
    if (const auto* i = std::get_if<int64_t>(&value)) {
      out.push_back(kInt);
      PutInt(out, *i);
    } else if (const auto* b = std::get_if<bool>(&value)) {
      out.push_back(kBool);
      out.push_back(*b ? 1 : 0);
    } else if (const auto* s = std::get_if<std::string>(&value)) {
      out.push_back(kString);
      PutString(out, *s);
    } else {
      out.push_back(kVersion);
      PutString(out, std::get<VersionString>(value).value);
    }
  }
  PutVarint(out, device.consumes_counters.size());
  for (const CounterConsumption& consumption : device.consumes_counters) {
    PutString(out, consumption.counter_set);
    PutVarint(out, consumption.counters.size());
    for (const auto& [counter, amount] : consumption.counters) {
      PutString(out, counter);
      PutInt(out, amount);
    }
  }
  PutVarint(out, device.taints.size());
  for (const DeviceTaint& taint : device.taints) {
    for (const std::string* text : {&taint.key, &taint.value, &taint.effect, &taint.time_added}) {
      PutString(out, *text);
    }
  }
}

// Reads what Pack wrote. The bytes are this process's own, so a short read is a bug; it ends the
// device where it happens rather than reading past the buffer.
class Reader {
 public:
  Reader(const std::string& bytes, size_t at) : bytes_(bytes), at_(at) {}

  uint64_t Varint() {
    uint64_t value = 0;
    for (int shift = 0; at_ < bytes_.size() && shift < 64; shift += 7) {
      const auto byte = static_cast<unsigned char>(bytes_[at_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) break;
    }
    return value;
  }
  std::string_view String() {
    const uint64_t size = std::min<uint64_t>(Varint(), bytes_.size() - at_);
    std::string_view out(bytes_.data() + at_, size);
    at_ += size;
    return out;
  }
  char Byte() { return at_ < bytes_.size() ? bytes_[at_++] : '\0'; }
  int64_t Int() {
    int64_t value = 0;
    if (bytes_.size() - at_ >= sizeof value) std::memcpy(&value, bytes_.data() + at_, sizeof value);
    at_ = std::min(bytes_.size(), at_ + sizeof value);
    return value;
  }
  std::string Name() {
    const auto code = static_cast<unsigned char>(Byte());
    if (code != 0 && code <= kKnownNames.size()) return kKnownNames[code - 1];
    return std::string(String());
  }

 private:
  const std::string& bytes_;
  size_t at_;
};

}  // namespace

PackedDeviceTable::PackedDeviceTable(const std::vector<const SliceDevice*>& devices) {
  std::vector<const SliceDevice*> sorted = devices;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const SliceDevice* a, const SliceDevice* b) { return a->name < b->name; });
  std::string bytes;
  starts_.reserve(sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) {
    // The sort is stable: the last of a run of one name is the last given.
    if (i + 1 < sorted.size() && sorted[i + 1]->name == sorted[i]->name) continue;
    starts_.push_back(static_cast<uint32_t>(bytes.size()));
    Pack(bytes, *sorted[i]);
  }
  bytes_.assign(bytes);  // exactly sized: the table lives as long as the publish
}

std::string_view PackedDeviceTable::NameAt(uint32_t start) const {
  return Reader(bytes_, start).String();
}

SliceDevice PackedDeviceTable::UnpackAt(uint32_t start) const {
  Reader in(bytes_, start);
  SliceDevice device;
  device.name = std::string(in.String());
  for (uint64_t n = in.Varint(); n > 0; --n) {
    std::string name = in.Name();
    switch (in.Byte()) {
      case kInt:
        device.attributes.emplace(std::move(name), in.Int());
        break;
      case kBool:
        device.attributes.emplace(std::move(name), in.Byte() != 0);
        break;
      case kString:
        device.attributes.emplace(std::move(name), std::string(in.String()));
        break;
      default:
        device.attributes.emplace(std::move(name), VersionString{std::string(in.String())});
        break;
    }
  }
  for (uint64_t n = in.Varint(); n > 0; --n) {
    CounterConsumption consumption;
    consumption.counter_set = std::string(in.String());
    for (uint64_t c = in.Varint(); c > 0; --c) {
      std::string counter(in.String());
      consumption.counters.emplace(std::move(counter), in.Int());
    }
    device.consumes_counters.push_back(std::move(consumption));
  }
  for (uint64_t n = in.Varint(); n > 0; --n) {
    DeviceTaint taint;
    for (std::string* text : {&taint.key, &taint.value, &taint.effect, &taint.time_added}) {
      *text = std::string(in.String());
    }
    device.taints.push_back(std::move(taint));
  }
  return device;
}

std::optional<SliceDevice> PackedDeviceTable::Find(std::string_view name) const {
  auto it = std::lower_bound(
      starts_.begin(), starts_.end(), name,
      [&](uint32_t start, std::string_view wanted) { return NameAt(start) < wanted; });
  if (it == starts_.end() || NameAt(*it) != name) return std::nullopt;
  return UnpackAt(*it);
}

void PackedDeviceTable::ForEach(const std::function<void(const SliceDevice&)>& each) const {
  for (uint32_t start : starts_) each(UnpackAt(start));
}

}  // namespace vfio_dra::slicepublisher
