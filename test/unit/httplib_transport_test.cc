// The parts of HttplibTransport that decide before any byte is sent: how a kubeconfig's server
// URL splits into host, port and path prefix, which proxy settings the plugin refuses to ignore,
// and the no_proxy matching behind that.
#include "kube/httplib_transport.h"

#include <gtest/gtest.h>

namespace vfio_dra::kube {
namespace {

TEST(ServerEndpointTest, HostsPortsAndPathPrefixes) {
  auto plain = ServerEndpoint::Parse("https://10.96.0.1:443", "in-cluster");
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_TRUE(plain->tls);
  EXPECT_EQ(plain->host, "10.96.0.1");
  EXPECT_EQ(plain->port, 443);
  EXPECT_EQ(plain->path_prefix, "");
  EXPECT_EQ(plain->host_header, "10.96.0.1");

  auto prefixed = ServerEndpoint::Parse("https://rancher.example.com/k8s/clusters/c-1/", "kc");
  ASSERT_TRUE(prefixed.ok()) << prefixed.error().message;
  EXPECT_EQ(prefixed->host, "rancher.example.com");
  EXPECT_EQ(prefixed->port, 443);
  EXPECT_EQ(prefixed->path_prefix, "/k8s/clusters/c-1");

  auto v6 = ServerEndpoint::Parse("https://[fd00::1]:6443", "kc");
  ASSERT_TRUE(v6.ok()) << v6.error().message;
  EXPECT_EQ(v6->host, "fd00::1");
  EXPECT_EQ(v6->port, 6443);
  EXPECT_EQ(v6->host_header, "[fd00::1]:6443");

  auto http = ServerEndpoint::Parse("http://127.0.0.1:8080", "kc");
  ASSERT_TRUE(http.ok()) << http.error().message;
  EXPECT_FALSE(http->tls);
  EXPECT_EQ(http->host_header, "127.0.0.1:8080");
}

TEST(ServerEndpointTest, BadUrlsAreRefusedNamingTheSource) {
  for (const char* bad : {"10.0.0.1:6443", "ftp://h", "https://", "https://h:0", "https://h:99999",
                          "https://h:12ab", "https://[fd00::1", "https://[fd00::1]x"}) {
    auto endpoint = ServerEndpoint::Parse(bad, "/etc/kubeconfig");
    ASSERT_FALSE(endpoint.ok()) << bad;
    EXPECT_NE(endpoint.error().message.find("/etc/kubeconfig"), std::string::npos)
        << endpoint.error().message;
  }
}

TEST(NoProxyTest, NamesSuffixesAddressesAndRanges) {
  EXPECT_TRUE(NoProxyCovers("*", "anything"));
  EXPECT_TRUE(NoProxyCovers("localhost, 10.96.0.1", "10.96.0.1"));
  EXPECT_TRUE(NoProxyCovers(".svc,.cluster.local", "kubernetes.default.svc"));
  EXPECT_TRUE(NoProxyCovers("example.com", "api.example.com"));
  EXPECT_TRUE(NoProxyCovers("EXAMPLE.com", "Api.Example.COM"));
  EXPECT_TRUE(NoProxyCovers("10.96.0.0/12", "10.96.0.1"));
  EXPECT_TRUE(NoProxyCovers("api.example.com:6443", "api.example.com"));
  EXPECT_TRUE(NoProxyCovers("[fd00::1]:6443", "fd00::1"));
  EXPECT_FALSE(NoProxyCovers("", "10.96.0.1"));
  EXPECT_FALSE(NoProxyCovers("example.com", "badexample.com"));
  EXPECT_FALSE(NoProxyCovers("10.96.0.0/16", "10.97.0.1"));
  EXPECT_FALSE(NoProxyCovers("10.96.0.0/40", "10.96.0.1"));
}

TEST(ConnectionPolicyTest, AProxyThatWouldApplyIsRefusedWithWhatToDo) {
  ClientConfig config;
  config.server = "https://10.96.0.1:443";
  config.source = "in-cluster";
  auto endpoint = ServerEndpoint::Parse(config.server, config.source);
  ASSERT_TRUE(endpoint.ok());
  ProxyEnvironment proxies;
  EXPECT_TRUE(CheckConnectionPolicy(config, *endpoint, proxies).ok());
  proxies.https_proxy = "http://proxy:3128";
  const Status refused = CheckConnectionPolicy(config, *endpoint, proxies);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("add 10.96.0.1 to NO_PROXY"), std::string::npos)
      << refused.error().message;
  proxies.no_proxy = "10.0.0.0/8";
  EXPECT_TRUE(CheckConnectionPolicy(config, *endpoint, proxies).ok());
  // http_proxy does not apply to an https server.
  proxies = ProxyEnvironment{};
  proxies.http_proxy = "http://proxy:3128";
  EXPECT_TRUE(CheckConnectionPolicy(config, *endpoint, proxies).ok());
}

TEST(ConnectionPolicyTest, ABearerTokenGoesOverPlainHttpOnlyToLoopback) {
  ClientConfig config;
  config.token = "secret";
  config.source = "kc";
  for (const char* server : {"http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:80"}) {
    config.server = server;
    auto endpoint = ServerEndpoint::Parse(config.server, config.source);
    ASSERT_TRUE(endpoint.ok()) << server;
    EXPECT_TRUE(CheckConnectionPolicy(config, *endpoint, {}).ok()) << server;
  }
  config.server = "http://10.0.0.1:8080";
  auto endpoint = ServerEndpoint::Parse(config.server, config.source);
  ASSERT_TRUE(endpoint.ok());
  const Status refused = CheckConnectionPolicy(config, *endpoint, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("plain http"), std::string::npos);
}

}  // namespace
}  // namespace vfio_dra::kube
