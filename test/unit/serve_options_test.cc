#include "cmd/serve_options.h"

#include <gtest/gtest.h>

#include "base/k8s_names.h"
#include "plugin/plugin_server.h"

namespace vfio_dra::cmd {
namespace {

ServeOptions Valid() {
  ServeOptions o;
  o.node_name = "worker-1";
  return o;
}

TEST(ServeOptions, DefaultsThePluginDataDirFromTheDriverName) {
  ServeOptions o = Valid();
  o.driver_name = "gpu.example.com";
  ASSERT_TRUE(FinalizeServeOptions(o).ok());
  EXPECT_EQ(o.plugin_data_dir, "/var/lib/kubelet/plugins/gpu.example.com");
}

TEST(ServeOptions, RejectsBadValuesNamingTheFlag) {
  struct Case {
    void (*mutate)(ServeOptions&);
    const char* flag;
  } cases[] = {
      {[](ServeOptions& o) { o.driver_name = "Vfio.DRA.io"; }, "--driver-name"},
      {[](ServeOptions& o) { o.driver_name = std::string(64, 'a'); }, "--driver-name"},
      {[](ServeOptions& o) { o.driver_name = "a..b"; }, "--driver-name"},
      {[](ServeOptions& o) { o.node_name = ""; }, "--node-name"},
      {[](ServeOptions& o) { o.node_name = "Node_1"; }, "--node-name"},
      {[](ServeOptions& o) { o.pod_uid = "../evil"; }, "--pod-uid"},
      {[](ServeOptions& o) { o.sysfs_root = "relative/sys"; }, "--sysfs-root"},
      {[](ServeOptions& o) { o.cdi_dir = ""; }, "--cdi-dir"},
      {[](ServeOptions& o) { o.kube_api_burst = 0; }, "--kube-api-burst"},
      {[](ServeOptions& o) { o.verbosity = 11; }, "-v"},
      {[](ServeOptions& o) { o.close_idle_connections_seconds = -1; }, "--close-idle-connections"},
      {[](ServeOptions& o) { o.close_idle_connections_seconds = 86401; },
       "--close-idle-connections"},
      // Endpoints a 1.38 kubelet refuses to register: '%', '?' or '#' in the path, 108+ bytes.
      {[](ServeOptions& o) { o.plugin_data_dir = "/var/lib/kubelet/plugins/%2e%2e"; },
       "--plugin-data-dir"},
      {[](ServeOptions& o) { o.plugin_data_dir = "/var/lib/kubelet/plugins/a?b"; },
       "--plugin-data-dir"},
      {[](ServeOptions& o) { o.plugin_data_dir = "/var/lib/kubelet/plugins/a#b"; },
       "--plugin-data-dir"},
      {[](ServeOptions& o) { o.plugin_data_dir = "/" + std::string(100, 'p'); },
       "--plugin-data-dir"},
      {[](ServeOptions& o) { o.registrar_dir = "/" + std::string(100, 'r'); }, "--registrar-dir"},
  };
  for (const Case& c : cases) {
    ServeOptions o = Valid();
    c.mutate(o);
    Status s = FinalizeServeOptions(o);
    ASSERT_FALSE(s.ok()) << c.flag;
    EXPECT_EQ(s.error().message.rfind(std::string(c.flag) + ":", 0), 0u) << s.error().message;
  }
}

// By default the kubelet's idle connection is closed well before its own 30-minute idle timer;
// zero (never) is allowed.
TEST(ServeOptions, ClosesIdleConnectionsBeforeTheKubeletsIdleTimerByDefault) {
  ServeOptions o = Valid();
  ASSERT_TRUE(FinalizeServeOptions(o).ok());
  EXPECT_GT(o.close_idle_connections_seconds, 0);
  EXPECT_LT(o.close_idle_connections_seconds, 30 * 60);
  o.close_idle_connections_seconds = 0;
  EXPECT_TRUE(FinalizeServeOptions(o).ok());
}

// The kubelet's limit is a path shorter than 108 bytes; "/dra.sock" is 9 of them.
TEST(ServeOptions, AcceptsTheLongestEndpointTheKubeletRegisters) {
  ServeOptions o = Valid();
  o.plugin_data_dir = "/" + std::string(97, 'p');  // 98 + 9 = 107 bytes
  ASSERT_TRUE(FinalizeServeOptions(o).ok());
  o.plugin_data_dir += "p";
  Status s = FinalizeServeOptions(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("108 bytes long, the limit is 107"), std::string::npos)
      << s.error().message;
}

TEST(SocketLayout, UsesPodUidForRollingUpdates) {
  ServeOptions o = Valid();
  ASSERT_TRUE(FinalizeServeOptions(o).ok());
  plugin::SocketLayout plain =
      plugin::SocketLayout::For(o.plugin_data_dir, o.registrar_dir, o.driver_name, o.pod_uid);
  EXPECT_EQ(plain.dra_socket, "/var/lib/kubelet/plugins/vfio.dra.io/dra.sock");
  EXPECT_EQ(plain.registration_socket, "/var/lib/kubelet/plugins_registry/vfio.dra.io-reg.sock");
  o.pod_uid = "1234-abcd";
  plugin::SocketLayout rolling =
      plugin::SocketLayout::For(o.plugin_data_dir, o.registrar_dir, o.driver_name, o.pod_uid);
  EXPECT_EQ(rolling.dra_socket, "/var/lib/kubelet/plugins/vfio.dra.io/dra-1234-abcd.sock");
  EXPECT_EQ(rolling.registration_socket,
            "/var/lib/kubelet/plugins_registry/vfio.dra.io-1234-abcd-reg.sock");
  EXPECT_EQ(rolling.lock_file, "/var/lib/kubelet/plugins/vfio.dra.io/serialize.lock");
}

TEST(NameRules, DnsLabelAndSubdomain) {
  EXPECT_TRUE(IsDnsLabel("a-1"));
  EXPECT_FALSE(IsDnsLabel("-a"));
  EXPECT_FALSE(IsDnsLabel("a.b"));
  EXPECT_FALSE(IsDnsLabel(std::string(64, 'a')));
  EXPECT_TRUE(IsDnsSubdomain("a.b-c.d"));
  EXPECT_FALSE(IsDnsSubdomain("a..b"));
  EXPECT_FALSE(IsDnsSubdomain("a/b"));
  EXPECT_FALSE(IsDnsSubdomain(std::string("a\0b", 3)));
  EXPECT_FALSE(IsDnsSubdomain(std::string(254, 'a')));
}

}  // namespace
}  // namespace vfio_dra::cmd
