#include "simulated_kernel.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "base/file_io.h"
#include "sysfs/sysfs_parse.h"
#include "sysfs_fixture.h"

namespace vfio_dra::testing {
namespace fs = std::filesystem;

namespace {

constexpr int kVfioGroupMajor = 241;
constexpr int kVfioDevMajor = 511;

// "" when the file cannot be read, as the stream-based reading this replaced gave.
std::string ReadText(const fs::path& path) {
  auto content = ReadFileToString(path.string());
  return content.ok() ? std::move(*content) : std::string();
}

void WriteText(const fs::path& path, const std::string& content) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT) {
    fs::create_directories(path.parent_path());
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) {
    throw std::runtime_error("simulated kernel: cannot write " + path.string() + ": " +
                             std::strerror(errno));
  }
  const bool written =
      ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  ::close(fd);
  if (!written) throw std::runtime_error("simulated kernel: short write to " + path.string());
}

// What the tree gives, or `fallback` when it cannot be read (a missing link or directory).
template <typename T>
T ValueOr(Result<T> result, T fallback) {
  return result.ok() ? std::move(*result) : std::move(fallback);
}

std::string Trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    if (end > start) parts.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// Without exceptions: a VF has no sriov_numvfs, so a bind parses "" every time, and 32 binders
// throwing at once contend in the unwinder.
int ParseInt(const std::string& text, int fallback) {
  const std::string trimmed = Trim(text);
  size_t start = 0;  // as std::stoi: leading white space, then an optional '+'
  while (start < trimmed.size() && std::isspace(static_cast<unsigned char>(trimmed[start]))) {
    ++start;
  }
  if (start + 1 < trimmed.size() && trimmed[start] == '+' && trimmed[start + 1] != '-') ++start;
  int value = 0;
  const char* end = trimmed.data() + trimmed.size();
  auto [ptr, ec] = std::from_chars(trimmed.data() + start, end, value);
  if (ec != std::errc() || ptr == trimmed.data() + start) return fallback;
  return value;
}

// vfio-pci and its vendor variants (mlx5_vfio_pci, nvgrace-gpu-vfio-pci, ...), which all end so.
bool IsVfioDriver(const std::string& driver) {
  for (const std::string suffix : {"vfio-pci", "vfio_pci"}) {
    if (driver.size() >= suffix.size() &&
        driver.compare(driver.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

SimulatedKernel::SimulatedKernel(std::string sysfs_root, std::string dev_root)
    : root_(fs::weakly_canonical(sysfs_root).string()),
      tree_(root_),
      dev_root_(std::move(dev_root)),
      state_file_(root_ + ".sim.json") {
  fs::create_directories(fs::path(dev_root_) / "vfio" / "devices");
  if (!fs::exists(fs::path(dev_root_) / "vfio" / "vfio")) MakeNode("vfio/vfio", 10, 196);
  AddBootTimeNodes();
  if (fs::exists(state_file_)) {
    LoadState();
    return;
  }
  for (const auto& entry : fs::directory_iterator(Abs("bus/pci/devices"))) {
    const std::string address = entry.path().filename().string();
    const std::string driver = DriverOf(address);
    if (!driver.empty() && !IsVfioDriver(driver)) host_driver_[address] = driver;
  }
  if (fs::exists(Abs("class/mdev_bus"))) {
    for (const auto& parent : fs::directory_iterator(Abs("class/mdev_bus"))) {
      const std::string dir = fs::canonical(parent.path()).lexically_relative(root_).string();
      bool any_instance = false;
      bool idle_type_offered = false;  // a type without instances still offers some
      for (const auto& type : fs::directory_iterator(Abs(dir + "/mdev_supported_types"))) {
        int existing = 0;
        for ([[maybe_unused]] const auto& d : fs::directory_iterator(type.path() / "devices")) {
          ++existing;
        }
        const int available = ParseInt(ReadText(type.path() / "available_instances"), 0);
        any_instance = any_instance || existing > 0;
        idle_type_offered = idle_type_offered || (existing == 0 && available > 0);
        // The vendor's statement where there is one (the fixture then shows the state the
        // kernel would); otherwise the fixture is taken to show the types' real maxima.
        const std::string description =
            fs::exists(type.path() / "description") ? ReadText(type.path() / "description") : "";
        mdev_max_[dir][type.path().filename().string()] =
            sysfs::ParseMdevMaxInstance(description).value_or(available + existing);
      }
      // An NVIDIA parent that offers other types while one runs is in heterogeneous mode.
      if (any_instance && idle_type_offered) mdev_mixed_.insert(dir);
    }
  }
  // The vGPU types of vGPU-on-VF PFs: the driver knows the card; the tree lists only what is
  // creatable now.
  std::ifstream vgpu_types(VgpuVfTypesFile(root_));
  for (std::string line; std::getline(vgpu_types, line);) {
    std::istringstream fields(line);
    std::string pf;
    VgpuVfTypeSpec type;
    fields >> pf >> type.id >> type.max_instances >> std::ws;
    std::getline(fields, type.name);
    // A fixture rebuilt on the same root (a simulated reboot) appends its types again.
    std::vector<VgpuVfTypeSpec>& known = vgpu_vf_types_[pf];
    if (!pf.empty() && std::find(known.begin(), known.end(), type) == known.end()) {
      known.push_back(type);
    }
  }
  // Sizes the fixture knows but the tree cannot state (a busy parent of a silent vendor).
  std::ifstream hints(MdevMaxHintFile(root_));
  std::string hint_dir;
  std::string hint_type;
  int hint_max = 0;
  while (hints >> hint_dir >> hint_type >> hint_max) mdev_max_[hint_dir][hint_type] = hint_max;
  SaveState();
}

void SimulatedKernel::AddBootTimeNodes() {
  // What the kernel shows for devices that were on VFIO drivers when the tree was built: group
  // nodes of existing mdevs and of functions bound to vfio-pci.
  if (fs::exists(Abs("bus/mdev/devices"))) {
    for (const auto& entry : fs::directory_iterator(Abs("bus/mdev/devices"))) {
      const int group = GroupOf("bus/mdev/devices/" + entry.path().filename().string());
      const std::string name = std::to_string(group);
      if (group >= 0 && !fs::exists(Abs("class/vfio/" + name + "/dev"))) {
        WriteText(Abs("class/vfio/" + name + "/dev"),
                  std::to_string(kVfioGroupMajor) + ":" + name + "\n");
        MakeNode("vfio/" + name, kVfioGroupMajor, group);
      }
    }
  }
  for (const auto& entry : fs::directory_iterator(Abs("bus/pci/devices"))) {
    const std::string address = entry.path().filename().string();
    const std::string driver = DriverOf(address);
    const std::string dir = DeviceDir(address);
    if (IsVfioDriver(driver) && !fs::exists(Abs(dir + "/vfio-dev"))) {
      DoUnbind(driver, address);
      DoBind(driver, address);
    }
    // An NVIDIA vGPU VF: nvidia.ko registers it with VFIO itself.
    if (driver == "nvidia" && fs::exists(Abs(dir + "/nvidia/current_vgpu_type")) &&
        !fs::exists(Abs(dir + "/vfio-dev"))) {
      std::lock_guard<std::mutex> nodes(nodes_mu_);
      AddVfioNodes(dir);
    }
  }
}

void SimulatedKernel::WaitIdle() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
}

void SimulatedKernel::KillProcessBetweenWrites() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == hanging_; });
  ::raise(SIGKILL);
  std::abort();  // not reached: SIGKILL cannot be caught
}

SimulatedKernel::~SimulatedKernel() {
  std::unique_lock<std::mutex> lock(mu_);
  released_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] { return in_flight_ == 0; });
}

void SimulatedKernel::SaveState() const {
  nlohmann::json state = {
      {"hostDrivers", host_driver_}, {"mdevMax", mdev_max_}, {"mdevMixed", mdev_mixed_}};
  for (const auto& [pf, types] : vgpu_vf_types_) {
    for (const VgpuVfTypeSpec& type : types) {
      state["vgpuVfTypes"][pf].push_back(
          {{"id", type.id}, {"name", type.name}, {"max", type.max_instances}});
    }
  }
  WriteText(state_file_, state.dump(2));
}

void SimulatedKernel::LoadState() {
  const auto state = nlohmann::json::parse(ReadText(state_file_));
  host_driver_ = state.at("hostDrivers").get<std::map<std::string, std::string>>();
  mdev_max_ = state.at("mdevMax").get<std::map<std::string, std::map<std::string, int>>>();
  mdev_mixed_ = state.value("mdevMixed", std::set<std::string>{});
  if (state.contains("vgpuVfTypes")) {
    for (const auto& [pf, types] : state.at("vgpuVfTypes").items()) {
      for (const auto& type : types) {
        vgpu_vf_types_[pf].push_back({type.at("id").get<int>(), type.at("name").get<std::string>(),
                                      type.at("max").get<int>()});
      }
    }
  }
}

void SimulatedKernel::OpenVgpuVf(const std::string& address) {
  WriteText(root_ + ".vmm-open/" + address, "");
}

void SimulatedKernel::CloseVgpuVf(const std::string& address) {
  fs::remove(root_ + ".vmm-open/" + address);
}

void SimulatedKernel::FailVfioBind(const std::string& address, int err) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_bind_[address] = err;
}

void SimulatedKernel::HangUnbind(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  hang_unbind_.insert(address);
  released_ = false;
}

void SimulatedKernel::HangVfioBind(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  hang_bind_.insert(address);
  released_ = false;
}

void SimulatedKernel::ReleaseHangs() {
  std::lock_guard<std::mutex> lock(mu_);
  released_ = true;
  hang_unbind_.clear();
  hang_bind_.clear();
  cv_.notify_all();
}

void SimulatedKernel::DenyWrites(const std::string& relative, int err) {
  std::lock_guard<std::mutex> lock(mu_);
  denied_[relative] = err;
}

int SimulatedKernel::DeniedError(const std::string& rel) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [prefix, err] : denied_) {
    if (prefix.empty() || rel == prefix || rel.rfind(prefix + "/", 0) == 0) return err;
  }
  return 0;
}

int SimulatedKernel::ProbeWritable(const std::string& path) {
  const bool inside = path.rfind(root_ + "/", 0) == 0;
  if (!inside) return EACCES;
  if (const int denied = DeniedError(path.substr(root_.size() + 1)); denied != 0) return denied;
  // Non-blocking: a locked attribute is a FIFO (see the header comment), and opening one for
  // writing must not wait for a reader.
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno == ENXIO ? 0 : errno;
  ::close(fd);
  return 0;
}

void SimulatedKernel::FailMdevCreate(int err) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_mdev_create_ = err;
}

int SimulatedKernel::Hanging() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hanging_;
}

bool SimulatedKernel::WaitUntilHanging(int count, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return hanging_ >= count; });
}

std::vector<SimWrite> SimulatedKernel::Writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}

void SimulatedKernel::RemoveDevice(const std::string& address) {
  std::unique_lock<std::shared_mutex> tree(tree_mu_);
  const std::string dir = DeviceDir(address);
  const std::string driver = DriverOf(address);
  if (!driver.empty()) DoUnbind(driver, address);
  const int group = GroupOf(dir);
  if (group >= 0)
    fs::remove(Abs("kernel/iommu_groups/" + std::to_string(group) + "/devices/" + address));
  fs::remove(Abs("bus/pci/devices/" + address));
  fs::remove_all(Abs(dir));
}

std::string SimulatedKernel::DeviceDir(const std::string& address) const {
  // The bus link is relative and the tree under devices/ has no further links: one readlink and
  // one stat, resolved with string work (the simulation's cost is not the daemon's, and the
  // benchmarks count both).
  const std::string target = ValueOr<std::string>(tree_.ReadLink("bus/pci/devices/" + address), "");
  if (target.empty() || target.front() == '/') return "";
  std::vector<std::string> parts{"bus", "pci", "devices"};
  for (const std::string& part : Split(target)) {
    if (part == "..") {
      if (parts.empty()) return "";
      parts.pop_back();
    } else if (part != ".") {
      parts.push_back(part);
    }
  }
  std::string dir;
  for (const std::string& part : parts) dir += (dir.empty() ? "" : "/") + part;
  struct stat st {};
  if (::stat(Abs(dir).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "";
  return dir;
}

std::string SimulatedKernel::DriverOf(const std::string& address) const {
  return ValueOr<std::string>(tree_.LinkBaseName("bus/pci/devices/" + address + "/driver"), "");
}

std::string SimulatedKernel::OverrideOf(const std::string& address) const {
  return sysfs::ParseDriverOverride(
      ReadText(Abs("bus/pci/devices/" + address + "/driver_override")));
}

int SimulatedKernel::GroupOf(const std::string& rel_dir) const {
  const std::string target = ValueOr<std::string>(tree_.LinkBaseName(rel_dir + "/iommu_group"), "");
  return target.empty() ? -1 : ParseInt(target, -1);
}

int SimulatedKernel::NextGroup() const {
  int next = 0;
  for (const auto& entry : fs::directory_iterator(Abs("kernel/iommu_groups"))) {
    next = std::max(next, ParseInt(entry.path().filename().string(), 0) + 1);
  }
  return next;
}

void SimulatedKernel::SetUeventDriver(const std::string& dir, const std::string& driver) {
  const std::string in = ReadText(Abs(dir + "/uevent"));
  std::string out = driver.empty() ? "" : "DRIVER=" + driver + "\n";
  for (size_t start = 0; start < in.size();) {
    size_t end = in.find('\n', start);
    if (end == std::string::npos) end = in.size();
    if (in.compare(start, 7, "DRIVER=") != 0) out.append(in, start, end - start).append("\n");
    start = end + 1;
  }
  WriteText(Abs(dir + "/uevent"), out);
}

void SimulatedKernel::MakeNode(const std::string& dev_relative, int major, int minor) const {
  const fs::path path = fs::path(dev_root_) / dev_relative;
  ::unlink(path.c_str());
  int made = ::mknod(path.c_str(), S_IFCHR | 0600, makedev(major, minor));
  if (made != 0 && errno == ENOENT) {
    fs::create_directories(path.parent_path());
    made = ::mknod(path.c_str(), S_IFCHR | 0600, makedev(major, minor));
  }
  if (made != 0) {
    throw std::runtime_error("simulated kernel: mknod " + path.string() +
                             " failed: " + std::strerror(errno) + " (the tests need CAP_MKNOD)");
  }
}

void SimulatedKernel::RemoveNode(const std::string& dev_relative) const {
  ::unlink((dev_root_ + "/" + dev_relative).c_str());
}

int SimulatedKernel::Write(const std::string& path, std::string_view value) {
  const bool inside = path.rfind(root_ + "/", 0) == 0;
  const std::string rel = inside ? path.substr(root_.size() + 1) : path;
  const std::vector<std::string> parts = Split(rel);
  const std::string arg = Trim(std::string(value));
  // The device lock as this process keeps it: writes that act on the same device wait for each
  // other; those on other devices go on.
  const std::string device = inside ? TargetDevice(parts, rel, arg) : "";
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++in_flight_;
    cv_.wait(lock, [&] { return device.empty() || busy_.count(device) == 0; });
    if (!device.empty()) busy_.insert(device);
  }
  int result = EACCES;
  std::string simulation_error;
  const int denied = inside ? DeniedError(rel) : 0;
  if (denied != 0) {
    result = denied;
  } else if (inside) {
    try {
      WaitWhileLocked(device);
      result = Apply(parts, rel, arg);
    } catch (const std::exception& e) {
      // A broken fixture must fail the test, not the daemon under test.
      result = EIO;
      simulation_error = e.what();
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!device.empty()) busy_.erase(device);
  if (!simulation_error.empty()) {
    writes_.push_back(
        {rel + " (simulation error: " + simulation_error + ")", std::string(value), EIO});
  }
  writes_.push_back({rel, std::string(value), result});
  if (!log_file_.empty()) {
    std::ofstream out(log_file_, std::ios::app);
    out << nlohmann::json{{"path", rel}, {"value", std::string(value)}, {"result", result}}.dump()
        << "\n";
  }
  --in_flight_;
  cv_.notify_all();
  return result;
}

std::string SimulatedKernel::TargetDevice(const std::vector<std::string>& parts,
                                          const std::string& rel, const std::string& arg) const {
  if (rel == "bus/pci/drivers_probe") return arg;
  if (parts.size() == 5 && parts[0] == "bus" && parts[1] == "pci" && parts[2] == "drivers") {
    return arg;
  }
  if (parts.size() >= 5 && parts[0] == "bus" && parts[1] == "pci" && parts[2] == "devices") {
    return parts[3];
  }
  if (parts.size() == 5 && parts[0] == "bus" && parts[1] == "mdev" && parts[2] == "devices") {
    // An mdev's remove takes its parent's lock too.
    std::error_code ec;
    const fs::path real = fs::canonical(Abs("bus/mdev/devices/" + parts[3]), ec);
    if (!ec) return real.parent_path().filename().string();
  }
  return "";
}

bool SimulatedKernel::DeviceLocked(const std::string& address) const {
  struct stat st {};
  return !address.empty() &&
         ::lstat(Abs("bus/pci/devices/" + address + "/driver_override").c_str(), &st) == 0 &&
         S_ISFIFO(st.st_mode);
}

void SimulatedKernel::LockDevice(const std::string& address) {
  const std::string dir = DeviceDir(address);
  std::vector<HeldAttribute> held;
  for (const char* name : {"driver_override", "sriov_numvfs", "uevent"}) {
    const std::string path = Abs(dir + "/" + name);
    if (!fs::is_regular_file(path)) continue;
    HeldAttribute attribute{name, ReadText(path), -1};
    fs::remove(path);
    if (::mkfifo(path.c_str(), 0644) != 0) {
      throw std::runtime_error("simulated kernel: mkfifo " + path + ": " + std::strerror(errno));
    }
    attribute.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    held.push_back(std::move(attribute));
  }
  locked_[address] = std::move(held);
}

void SimulatedKernel::UnlockDevice(const std::string& address) {
  auto it = locked_.find(address);
  if (it == locked_.end()) return;
  const std::string dir = DeviceDir(address);
  for (HeldAttribute& attribute : it->second) {
    // The file comes back first (new opens see it), then blocked readers get the value.
    const std::string path = Abs(dir + "/" + attribute.name);
    WriteText(path + ".unlocked", attribute.content);
    fs::rename(path + ".unlocked", path);
    if (attribute.fd >= 0) {
      (void)!::write(attribute.fd, attribute.content.data(), attribute.content.size());
      ::close(attribute.fd);
    }
  }
  locked_.erase(it);
}

void SimulatedKernel::HoldUntilReleased(const std::string& address, TreeLock& tree) {
  std::unique_lock<std::mutex> lock(mu_);
  LockDevice(address);
  ++hanging_;
  cv_.notify_all();
  tree.unlock();  // the kernel holds this device only
  cv_.wait(lock, [&] { return released_; });
  --hanging_;
  UnlockDevice(address);
  lock.unlock();
  tree.lock();
}

void SimulatedKernel::WaitWhileLocked(const std::string& address) {
  while (DeviceLocked(address)) {
    const std::string path = Abs("bus/pci/devices/" + address + "/driver_override");
    // Blocks until the holder (here or in another process) lets go: it writes and closes. A
    // FIFO nobody holds any more (its holder was killed) reads end of file at once.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ssize_t n = -1;
    if (fd >= 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      char buffer[256];
      n = ::read(fd, buffer, sizeof buffer);
      ::close(fd);
    }
    std::lock_guard<std::mutex> lock(mu_);
    // A holder that lets go puts the file back before it writes and closes; a FIFO still there
    // after end of file, held by no one here, was left by a holder that was killed.
    if (n <= 0 && DeviceLocked(address) && locked_.count(address) == 0) return;
  }
}

int SimulatedKernel::Apply(const std::vector<std::string>& parts, const std::string& rel,
                           const std::string& arg) {
  const bool device_attribute =
      parts.size() >= 5 && parts[0] == "bus" && parts[1] == "pci" && parts[2] == "devices";
  if (device_attribute && parts.size() == 6 && parts[4] == "nvidia" &&
      parts[5] == "current_vgpu_type") {
    // Changes what every sibling VF can create: runs alone.
    std::unique_lock<std::shared_mutex> tree(tree_mu_);
    if (!fs::exists(Abs(rel))) return ENOENT;
    return SetVgpuType(parts[3], arg);
  }
  if (rel == "bus/pci/drivers_probe" ||
      (parts.size() == 5 && parts[0] == "bus" && parts[1] == "pci" && parts[2] == "drivers") ||
      (device_attribute &&
       !(parts.size() == 5 && (parts[4] == "sriov_numvfs" || parts[4] == "remove")))) {
    return ApplyToOneDevice(parts, rel, arg);
  }
  std::unique_lock<std::shared_mutex> tree(tree_mu_);
  if (device_attribute) {
    if (DeviceDir(parts[3]).empty()) return ENOENT;
    if (parts[4] == "remove") {
      // pci_stop_and_remove_bus_device: any non-zero number removes; 0 does nothing.
      if (ParseInt(arg, -1) < 0) return EINVAL;
      if (ParseInt(arg, 0) == 0) return 0;
      RemoveFunction(parts[3]);
      SaveState();
      return 0;
    }
    return SetNumVfs(parts[3], arg);
  }
  if (parts.size() == 5 && parts[0] == "bus" && parts[1] == "mdev" && parts[2] == "devices" &&
      parts[4] == "remove") {
    if (!fs::exists(Abs(rel))) return ENOENT;
    return arg == "1" ? RemoveMdev(parts[3]) : EINVAL;
  }
  const size_t types = rel.find("/mdev_supported_types/");
  if (types != std::string::npos && parts.back() == "create" && parts.size() >= 3) {
    if (!fs::exists(Abs(rel))) return ENOENT;
    std::error_code ec;
    const fs::path parent = fs::canonical(Abs(rel.substr(0, types)), ec);
    if (ec) return ENOENT;
    return CreateMdev(parent.lexically_relative(root_).string(), parts[parts.size() - 2], arg);
  }
  return EACCES;
}

int SimulatedKernel::ApplyToOneDevice(const std::vector<std::string>& parts, const std::string& rel,
                                      const std::string& arg) {
  TreeLock tree(tree_mu_);
  if (rel == "bus/pci/drivers_probe") return Probe(arg, tree);
  if (parts[2] == "drivers") {
    if (!fs::exists(Abs(rel))) return ENOENT;
    if (parts[4] == "bind") return Bind(parts[3], arg, tree);
    if (parts[4] == "unbind") return Unbind(parts[3], arg, tree);
    return EACCES;
  }
  const std::string& address = parts[3];
  if (DeviceDir(address).empty()) return ENOENT;
  if (parts.size() == 6 && parts[4] == "driver" && parts[5] == "unbind") {
    const std::string driver = DriverOf(address);
    if (driver.empty()) return ENOENT;
    if (arg != address) return ENODEV;
    return Unbind(driver, address, tree);
  }
  if (parts.size() == 5 && parts[4] == "driver_override") {
    WriteText(Abs("bus/pci/devices/" + address + "/driver_override"),
              (arg.empty() ? std::string("(null)") : arg) + "\n");
    return 0;
  }
  return EACCES;
}

int SimulatedKernel::Bind(const std::string& driver, const std::string& address, TreeLock& tree) {
  const std::string dir = DeviceDir(address);
  if (dir.empty()) return ENODEV;
  int fault = 0;
  bool hang = false;
  std::string host_driver;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = fail_bind_.find(address); it != fail_bind_.end()) fault = it->second;
    hang = hang_bind_.count(address) != 0 && !released_;
    if (auto it = host_driver_.find(address); it != host_driver_.end()) host_driver = it->second;
  }
  if (fault != 0 && IsVfioDriver(driver)) return fault;
  if (!DriverOf(address).empty()) return EBUSY;
  const std::string override = OverrideOf(address);
  if (!override.empty() && override != driver) return ENODEV;
  if (IsVfioDriver(driver)) {
    // vfio-pci has no ID table and variant drivers mark theirs override-only: a VFIO driver
    // matches only through driver_override.
    if (override != driver) return ENODEV;
    if (ParseInt(ReadText(Abs(dir + "/sriov_numvfs")), 0) > 0) return EBUSY;
    if (ReadText(Abs(dir + "/class")).rfind("0x06", 0) == 0) return EINVAL;
    if (hang) {
      HoldUntilReleased(address, tree);
      if (DeviceDir(address).empty()) return ENODEV;
    }
  } else if (host_driver != driver) {
    return ENODEV;
  }
  DoBind(driver, address);
  return 0;
}

int SimulatedKernel::Probe(const std::string& address, TreeLock& tree) {
  const std::string dir = DeviceDir(address);
  if (dir.empty()) return ENODEV;
  if (!DriverOf(address).empty()) return 0;
  const std::string override = OverrideOf(address);
  std::string candidate = override;
  if (candidate.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto host = host_driver_.find(address);
    if (host != host_driver_.end()) candidate = host->second;
  }
  if (candidate.empty() || !fs::exists(Abs("bus/pci/drivers/" + candidate))) return 0;
  // A refused probe still reports success, as the kernel does.
  Bind(candidate, address, tree);
  return 0;
}

int SimulatedKernel::Unbind(const std::string& driver, const std::string& address, TreeLock& tree) {
  if (DeviceDir(address).empty() || DriverOf(address) != driver) return ENODEV;
  bool hang = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hang = hang_unbind_.count(address) != 0 && !released_;
  }
  if (hang) {
    // As __device_release_driver: the driver links go, then the driver's remove() waits for the
    // VFIO user with the device lock held.
    const std::string dir = DeviceDir(address);
    fs::remove(Abs(dir + "/driver"));
    fs::remove(Abs("bus/pci/drivers/" + driver + "/" + address));
    HoldUntilReleased(address, tree);
    if (DeviceDir(address).empty()) return 0;
  }
  DoUnbind(driver, address);
  return 0;
}

std::string SimulatedKernel::ClaimVfioDev(const std::string& dir) {
  // The lowest free number, as the kernel's IDA hands out, without listing every number in use:
  // each number below the hint is taken, and the class link, made atomically, claims the number
  // (so a number taken by a fixture or by another process's bind is skipped, not shared). The link
  // comes before the device's vfio-dev directory it points to, which the daemon reads; nothing
  // follows the class link in that moment.
  for (int index = vfio_dev_hint_;; ++index) {
    std::string cdev = "vfio" + std::to_string(index);
    const std::string link = Abs("class/vfio-dev/" + cdev);
    if (::symlink(("../../" + dir + "/vfio-dev/" + cdev).c_str(), link.c_str()) == 0) {
      vfio_dev_hint_ = index + 1;
      return cdev;
    }
    if (errno == ENOENT) {
      fs::create_directories(Abs("class/vfio-dev"));
      --index;  // the same number again, now that its directory exists
    } else if (errno != EEXIST) {
      throw std::runtime_error("simulated kernel: cannot make " + link + ": " +
                               std::strerror(errno));
    }
  }
}

void SimulatedKernel::DoBind(const std::string& driver, const std::string& address) {
  const std::string dir = DeviceDir(address);
  MakeRelativeSymlink(root_, dir + "/driver", "bus/pci/drivers/" + driver);
  MakeRelativeSymlink(root_, "bus/pci/drivers/" + driver + "/" + address, dir);
  SetUeventDriver(dir, driver);
  if (!IsVfioDriver(driver)) return;
  // Numbers and group nodes are shared by all devices: handed out one binder at a time, as the
  // kernel's IDA and group lock do.
  std::lock_guard<std::mutex> nodes(nodes_mu_);
  AddVfioNodes(dir);
}

void SimulatedKernel::AddVfioNodes(const std::string& dir) {
  const std::string cdev = ClaimVfioDev(dir);
  const int index = ParseInt(cdev.substr(4), -1);
  ::mkdir(Abs(dir + "/vfio-dev").c_str(), 0755);
  ::mkdir(Abs(dir + "/vfio-dev/" + cdev).c_str(), 0755);
  WriteText(Abs(dir + "/vfio-dev/" + cdev + "/dev"),
            std::to_string(kVfioDevMajor) + ":" + std::to_string(index) + "\n");
  MakeNode("vfio/devices/" + cdev, kVfioDevMajor, index);
  const int group = GroupOf(dir);
  if (group < 0) return;
  const std::string name = std::to_string(group);
  struct stat st {};
  if (::stat(Abs("class/vfio/" + name + "/dev").c_str(), &st) != 0) {
    ::mkdir(Abs("class/vfio/" + name).c_str(), 0755);
    WriteText(Abs("class/vfio/" + name + "/dev"),
              std::to_string(kVfioGroupMajor) + ":" + name + "\n");
    MakeNode("vfio/" + name, kVfioGroupMajor, group);
  }
}

void SimulatedKernel::DoUnbind(const std::string& driver, const std::string& address) {
  const std::string dir = DeviceDir(address);
  ::unlink(Abs(dir + "/driver").c_str());
  ::unlink(Abs("bus/pci/drivers/" + driver + "/" + address).c_str());
  SetUeventDriver(dir, "");
  if (!IsVfioDriver(driver)) return;
  std::lock_guard<std::mutex> nodes(nodes_mu_);
  const std::string cdevs = Abs(dir + "/vfio-dev");
  for (const std::string& cdev : ValueOr(tree_.List(dir + "/vfio-dev"), {})) {
    if (cdev.rfind("vfio", 0) == 0) {
      vfio_dev_hint_ = std::min(vfio_dev_hint_, ParseInt(cdev.substr(4), vfio_dev_hint_));
    }
    ::unlink(Abs("class/vfio-dev/" + cdev).c_str());
    RemoveNode("vfio/devices/" + cdev);
    ::unlink((cdevs + "/" + cdev + "/dev").c_str());
    ::rmdir((cdevs + "/" + cdev).c_str());
  }
  if (::rmdir(cdevs.c_str()) != 0 && errno == ENOTEMPTY) {
    std::error_code ec;  // a fixture's vfio-dev with more in it than a bind makes
    fs::remove_all(cdevs, ec);
  }
  const int group = GroupOf(dir);
  if (group < 0) return;
  const std::string name = std::to_string(group);
  for (const std::string& member :
       ValueOr(tree_.List("kernel/iommu_groups/" + name + "/devices"), {})) {
    if (IsVfioDriver(DriverOf(member))) return;
  }
  fs::remove_all(Abs("class/vfio/" + name));
  RemoveNode("vfio/" + name);
}

int SimulatedKernel::CreateMdev(const std::string& parent_dir, const std::string& type,
                                const std::string& uuid) {
  if (!sysfs::IsMdevUuid(uuid)) return EINVAL;
  if (fs::exists(Abs("bus/mdev/devices/" + uuid))) return EEXIST;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_mdev_create_ != 0) {
      const int err = fail_mdev_create_;
      fail_mdev_create_ = 0;
      return err;
    }
  }
  const std::string type_dir = parent_dir + "/mdev_supported_types/" + type;
  const int available = ParseInt(ReadText(Abs(type_dir + "/available_instances")), 0);
  if (available <= 0) return EUSERS;
  SysfsFixture fx(root_);
  const std::string dir = parent_dir + "/" + uuid;
  fx.WriteFile(dir + "/remove", "");
  fx.WriteFile(dir + "/uevent", "MDEV_TYPE=" + type + "\n");
  fx.Symlink(dir + "/mdev_type", type_dir);
  fx.Symlink(type_dir + "/devices/" + uuid, dir);
  fx.Symlink("bus/mdev/devices/" + uuid, dir);
  const int group = NextGroup();
  const std::string name = std::to_string(group);
  fx.WriteFile("kernel/iommu_groups/" + name + "/type", "DMA\n");
  fx.Symlink("kernel/iommu_groups/" + name + "/devices/" + uuid, dir);
  fx.Symlink(dir + "/iommu_group", "kernel/iommu_groups/" + name);
  fx.WriteFile("class/vfio/" + name + "/dev", std::to_string(kVfioGroupMajor) + ":" + name + "\n");
  MakeNode("vfio/" + name, kVfioGroupMajor, group);
  RecomputeAvailable(parent_dir);
  return 0;
}

void SimulatedKernel::RecomputeAvailable(const std::string& parent_dir) {
  std::map<std::string, int> count;  // instances per type
  for (const auto& [t, max] : mdev_max_[parent_dir]) {
    const fs::path devices = Abs(parent_dir + "/mdev_supported_types/" + t + "/devices");
    count[t] = 0;
    if (!fs::exists(devices)) continue;
    for ([[maybe_unused]] const auto& d : fs::directory_iterator(devices)) ++count[t];
  }
  // NVIDIA runs one type per physical GPU unless heterogeneous mode is on: once an instance
  // exists, the other types have none. In heterogeneous mode, and for other vendors (mtty, Intel
  // GVT-g), the parent counts space: an instance of any type takes its share of the parent, and
  // each type reports how many more of it fit in what is left.
  std::error_code ec;
  const bool one_type = fs::read_symlink(Abs(parent_dir + "/driver"), ec).filename() == "nvidia" &&
                        mdev_mixed_.count(parent_dir) == 0;
  int64_t lcm = 1;
  for (const auto& [t, max] : mdev_max_[parent_dir]) {
    if (max > 0) lcm = std::lcm(lcm, int64_t{max});
  }
  int64_t used = 0;
  std::string in_use;
  for (const auto& [t, n] : count) {
    const int max = mdev_max_[parent_dir][t];
    if (n > 0 && max > 0) used += n * (lcm / max);
    if (n > 0) in_use = t;
  }
  for (const auto& [t, max] : mdev_max_[parent_dir]) {
    int available = 0;
    if (max > 0 && one_type) {
      available = in_use.empty() || in_use == t ? max - count[t] : 0;
    } else if (max > 0) {
      available = static_cast<int>(std::max<int64_t>(0, lcm - used) / (lcm / max));
    }
    WriteText(Abs(parent_dir + "/mdev_supported_types/" + t + "/available_instances"),
              std::to_string(available) + "\n");
  }
}

int SimulatedKernel::RemoveMdev(const std::string& uuid) {
  std::error_code ec;
  const fs::path real = fs::canonical(Abs("bus/mdev/devices/" + uuid), ec);
  if (ec) return ENODEV;
  const std::string dir = real.lexically_relative(root_).string();
  const std::string parent_dir = fs::path(dir).parent_path().string();
  const std::string type = fs::read_symlink(Abs(dir + "/mdev_type")).filename().string();
  const int group = GroupOf(dir);
  fs::remove(Abs("bus/mdev/devices/" + uuid));
  fs::remove(Abs(parent_dir + "/mdev_supported_types/" + type + "/devices/" + uuid));
  if (group >= 0) {
    const std::string name = std::to_string(group);
    fs::remove_all(Abs("kernel/iommu_groups/" + name));
    fs::remove_all(Abs("class/vfio/" + name));
    RemoveNode("vfio/" + name);
  }
  fs::remove_all(Abs(dir));
  RecomputeAvailable(parent_dir);
  return 0;
}

int SimulatedKernel::SetVgpuType(const std::string& vf, const std::string& value) {
  const int wanted = ParseInt(value, -1);
  if (wanted < 0) return EINVAL;
  if (fs::exists(root_ + ".vmm-open/" + vf)) return EBUSY;
  const std::string pf =
      ValueOr<std::string>(tree_.LinkBaseName("bus/pci/devices/" + vf + "/physfn"), "");
  const std::string dir = "bus/pci/devices/" + vf + "/nvidia";
  const int current = ParseInt(ReadText(Abs(dir + "/current_vgpu_type")), 0);
  if (wanted == 0) {
    WriteText(Abs(dir + "/current_vgpu_type"), "0\n");
    RecomputeCreatableVgpuTypes(pf);
    return 0;
  }
  // Only an ID the VF lists now can be set (none while it holds a vGPU).
  bool creatable = false;
  const std::string listed = ReadText(Abs(dir + "/creatable_vgpu_types"));
  std::istringstream lines(listed);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    if (ParseInt(line.substr(0, line.find(':')), -1) == wanted) creatable = true;
  }
  if (current != 0 || !creatable) return ENODEV;
  WriteText(Abs(dir + "/current_vgpu_type"), std::to_string(wanted) + "\n");
  RecomputeCreatableVgpuTypes(pf);
  return 0;
}

void SimulatedKernel::RecomputeCreatableVgpuTypes(const std::string& pf) {
  std::vector<std::string> vfs;
  for (int i = 0;; ++i) {
    auto vf = tree_.LinkBaseName("bus/pci/devices/" + pf + "/virtfn" + std::to_string(i));
    if (!vf.ok()) break;
    vfs.push_back(*vf);
  }
  std::vector<int> currents;
  for (const std::string& vf : vfs) {
    currents.push_back(
        ParseInt(ReadText(Abs("bus/pci/devices/" + vf + "/nvidia/current_vgpu_type")), 0));
  }
  for (size_t i = 0; i < vfs.size(); ++i) {
    WriteText(Abs("bus/pci/devices/" + vfs[i] + "/nvidia/creatable_vgpu_types"),
              CreatableVgpuTypesText(vgpu_vf_types_[pf], currents, currents[i]));
  }
}

void SimulatedKernel::DisableVfs(const std::string& address) {
  const std::string dir = DeviceDir(address);
  const int current = ParseInt(ReadText(Abs(dir + "/sriov_numvfs")), 0);
  // As pci_iov_remove_virtfn does it, VF by VF: the PF's virtfnN link and the VF's physfn link
  // go first, then the VF is stopped (its driver lets go) and removed. In between, a reader finds
  // the VF on the bus, on its driver, but no longer linked to its PF.
  for (int i = 0; i < current; ++i) {
    const std::string link = dir + "/virtfn" + std::to_string(i);
    std::error_code ec;
    const fs::path vf_real = fs::canonical(Abs(link), ec);
    fs::remove(Abs(link));
    if (ec) continue;
    fs::remove(vf_real / "physfn");
    RemoveFunction(vf_real.filename().string());
  }
  if (current != 0) WriteText(Abs(dir + "/sriov_numvfs"), "0\n");
}

// As the kernel removes a function (a VF when its PF disables SR-IOV, or any function written
// `1` to its `remove`): a PF's VFs go first, then its driver lets go, it leaves its IOMMU group
// (the group goes with its last member), and its entries vanish from the bus.
void SimulatedKernel::RemoveFunction(const std::string& address) {
  const std::string dir = DeviceDir(address);
  if (dir.empty()) return;
  if (fs::exists(Abs(dir + "/sriov_numvfs"))) DisableVfs(address);
  const std::string driver = DriverOf(address);
  if (!driver.empty()) DoUnbind(driver, address);
  const int group = GroupOf(dir);
  if (group >= 0) {
    const std::string group_dir = "kernel/iommu_groups/" + std::to_string(group);
    fs::remove(Abs(group_dir + "/devices/" + address));
    std::error_code ec;
    if (!fs::exists(Abs(group_dir + "/devices")) || fs::is_empty(Abs(group_dir + "/devices"), ec)) {
      fs::remove_all(Abs(group_dir));
    }
  }
  fs::remove(Abs("bus/pci/devices/" + address));
  fs::remove_all(Abs(dir));
  host_driver_.erase(address);
}

int SimulatedKernel::SetNumVfs(const std::string& address, const std::string& value) {
  const std::string dir = DeviceDir(address);
  if (!fs::exists(Abs(dir + "/sriov_totalvfs"))) return EACCES;
  const int wanted = ParseInt(value, -1);
  const int total = ParseInt(ReadText(Abs(dir + "/sriov_totalvfs")), 0);
  const int current = ParseInt(ReadText(Abs(dir + "/sriov_numvfs")), 0);
  if (wanted < 0) return EINVAL;
  if (wanted > total) return ERANGE;
  if (wanted == current) return 0;
  if (current != 0 && wanted != 0) return EBUSY;  // the kernel wants a detour through 0
  if (wanted == 0) {
    DisableVfs(address);
    SaveState();
    return 0;
  }
  SysfsFixture fx(root_);
  fx.Adopt(address, dir);
  const auto hex = [&](const std::string& name) {
    return static_cast<uint32_t>(std::stoul(Trim(ReadText(Abs(dir + "/" + name))), nullptr, 16));
  };
  const uint32_t vf_device = hex("sriov_vf_device");
  std::vector<PciSpec> vfs;
  int group = NextGroup();
  for (int i = 0; i < wanted; ++i) {
    vfs.push_back(MakePciSpec("", hex("vendor"), vf_device, hex("class"), "", group++));
  }
  fx.MakeSriovPf(address, total, vf_device, vfs, ParseInt(ReadText(Abs(dir + "/sriov_offset")), 16),
                 ParseInt(ReadText(Abs(dir + "/sriov_stride")), 1));
  return 0;
}

std::vector<SimWrite> SimulatedKernel::ReadWriteLog(const std::string& path) {
  std::vector<SimWrite> writes;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json w = nlohmann::json::parse(line);
    writes.push_back({w.at("path").get<std::string>(), w.at("value").get<std::string>(),
                      w.at("result").get<int>()});
  }
  return writes;
}

bool IsManagedWrite(const SimWrite& write, const std::set<std::string>& functions,
                    const std::set<std::string>& mdev_types) {
  const std::string& path = write.path;
  for (const std::string& f : functions) {
    if (path == "bus/pci/devices/" + f + "/driver_override") return true;
    if (path == "bus/pci/devices/" + f + "/nvidia/current_vgpu_type") return true;
    if (path.rfind("bus/pci/drivers/", 0) == 0 &&
        (path.ends_with("/bind") || path.ends_with("/unbind")) && write.value == f) {
      return true;
    }
  }
  for (const std::string& type : mdev_types) {
    if (path == type + "/create") return true;
  }
  static const std::regex kRemove("bus/mdev/devices/[0-9a-f-]{36}/remove");
  return !mdev_types.empty() && std::regex_match(path, kRemove);
}

}  // namespace vfio_dra::testing
