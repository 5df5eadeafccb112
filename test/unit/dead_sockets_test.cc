// RemoveDeadSockets on real unix sockets: what a dead plugin pod leaves goes, what lives or is
// not ours stays.
#include "plugin/dead_sockets.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace vfio_dra::plugin {
namespace {

using std::chrono::seconds;
using std::chrono::system_clock;

// A unix socket bound at `path`; listening if `listen`, else closed at once (what a killed
// process leaves: the file, and nothing behind it). Returns the fd of a listening one, else -1.
int BindSocket(const std::string& path, bool listen) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0) << path;
  if (listen) {
    EXPECT_EQ(::listen(fd, 4), 0);
    return fd;
  }
  ::close(fd);
  return -1;
}

class DeadSocketsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-dead-sockets-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::filesystem::create_directories(dir_ + "/registry");
    std::filesystem::create_directories(dir_ + "/data");
    own_ = SocketLayout::For(dir_ + "/data", dir_ + "/registry", "vfio.example.io", "uid-new");
  }
  void TearDown() override {
    for (int fd : listening_) ::close(fd);
    std::filesystem::remove_all(dir_);
  }
  std::string Registry(const std::string& name) const { return dir_ + "/registry/" + name; }
  std::string Data(const std::string& name) const { return dir_ + "/data/" + name; }
  void Live(const std::string& path) { listening_.push_back(BindSocket(path, true)); }

  std::string dir_;
  SocketLayout own_;
  std::vector<int> listening_;
};

TEST_F(DeadSocketsTest, RemovesTheSocketsOfADeadEarlierPodOnceOldEnough) {
  BindSocket(Registry("vfio.example.io-uid-old-reg.sock"), false);
  BindSocket(Data("dra-uid-old.sock"), false);
  BindSocket(Registry("vfio.example.io-reg.sock"), false);
  BindSocket(Data("dra.sock"), false);

  // Just bound: a live instance between its bind and its listen looks the same, so they stay.
  DeadSocketSweep young = RemoveDeadSockets(own_, "vfio.example.io", system_clock::now());
  EXPECT_TRUE(young.removed.empty());
  EXPECT_TRUE(std::filesystem::exists(Registry("vfio.example.io-uid-old-reg.sock")));

  DeadSocketSweep old =
      RemoveDeadSockets(own_, "vfio.example.io", system_clock::now() + seconds(60));
  EXPECT_EQ(old.removed.size(), 4U);
  EXPECT_TRUE(old.problems.empty());
  for (const std::string& path :
       {Registry("vfio.example.io-uid-old-reg.sock"), Data("dra-uid-old.sock"),
        Registry("vfio.example.io-reg.sock"), Data("dra.sock")}) {
    EXPECT_FALSE(std::filesystem::exists(path)) << path;
  }
}

TEST_F(DeadSocketsTest, LeavesLiveSocketsOwnSocketsOtherDriversAndFilesThatAreNotSockets) {
  Live(Registry("vfio.example.io-uid-other-reg.sock"));  // a rolling update's other pod
  Live(Data("dra-uid-other.sock"));
  BindSocket(own_.registration_socket, false);  // ours: RemoveStaleSocket's, before our bind
  BindSocket(own_.dra_socket, false);
  BindSocket(Registry("other.example.io-uid-old-reg.sock"), false);
  BindSocket(Registry("vfio.example.io-uid-old-reg.sock.tmp"), false);
  std::ofstream(Registry("vfio.example.io-uid-file-reg.sock")) << "not a socket";

  DeadSocketSweep sweep =
      RemoveDeadSockets(own_, "vfio.example.io", system_clock::now() + seconds(60));
  EXPECT_TRUE(sweep.removed.empty()) << sweep.removed.front();
  EXPECT_TRUE(sweep.problems.empty());
  for (const std::string& path :
       {Registry("vfio.example.io-uid-other-reg.sock"), Data("dra-uid-other.sock"),
        own_.registration_socket, own_.dra_socket, Registry("other.example.io-uid-old-reg.sock"),
        Registry("vfio.example.io-uid-old-reg.sock.tmp"),
        Registry("vfio.example.io-uid-file-reg.sock")}) {
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
  }
}

TEST_F(DeadSocketsTest, AMissingDirectoryIsNoProblem) {
  std::filesystem::remove_all(dir_ + "/registry");
  DeadSocketSweep sweep =
      RemoveDeadSockets(own_, "vfio.example.io", system_clock::now() + seconds(60));
  EXPECT_TRUE(sweep.removed.empty());
  EXPECT_TRUE(sweep.problems.empty());
}

}  // namespace
}  // namespace vfio_dra::plugin
