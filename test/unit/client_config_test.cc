#include "kube/client_config.h"

#include <gtest/gtest.h>

namespace vfio_dra::kube {
namespace {

constexpr const char* kFull = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: other
  cluster:
    server: https://other:6443
- name: c1
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority: certs/ca.crt
contexts:
- name: dev
  context:
    cluster: c1
    user: u1
users:
- name: u1
  user:
    tokenFile: token
    client-certificate-data: aGVsbG8=
    client-key-data: d29ybGQ=
)";

TEST(Kubeconfig, ParsesCurrentContextAndResolvesRelativePaths) {
  auto config = ParseKubeconfig(kFull, "/etc/kube/config");
  ASSERT_TRUE(config.ok()) << config.error().message;
  EXPECT_EQ(config->server, "https://10.0.0.1:6443");
  EXPECT_EQ(config->ca_file, "/etc/kube/certs/ca.crt");
  EXPECT_EQ(config->token_file, "/etc/kube/token");
  EXPECT_EQ(config->client_cert_data, "hello");
  EXPECT_EQ(config->client_key_data, "world");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
}

TEST(Kubeconfig, RefusesExecPluginsNamingTheEntryAndLine) {
  const std::string text = R"(current-context: dev
clusters:
- name: c1
  cluster:
    server: https://x
contexts:
- name: dev
  context: {cluster: c1, user: u1}
users:
- name: u1
  user:
    exec:
      command: aws
)";
  auto config = ParseKubeconfig(text, "/k/config");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.error().message.find("/k/config:13"), std::string::npos)
      << config.error().message;
  EXPECT_NE(config.error().message.find("users[u1].user.exec"), std::string::npos);
  EXPECT_NE(config.error().message.find("not supported"), std::string::npos);
}

TEST(Kubeconfig, ReportsMissingContextClusterAndServer) {
  EXPECT_NE(ParseKubeconfig("clusters: []\n", "f").error().message.find("current-context"),
            std::string::npos);
  auto no_ctx = ParseKubeconfig("current-context: x\ncontexts: []\n", "f");
  EXPECT_NE(no_ctx.error().message.find("no entry named \"x\""), std::string::npos);
  auto bad_server = ParseKubeconfig(
      "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n"
      "  cluster: {server: 'ftp://x'}\n",
      "f");
  ASSERT_FALSE(bad_server.ok());
  EXPECT_NE(bad_server.error().message.find("https://"), std::string::npos);
}

TEST(Kubeconfig, ReportsYamlSyntaxErrorsWithLine) {
  auto config = ParseKubeconfig("current-context: [\n", "/x/kc");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.error().message.find("/x/kc:"), std::string::npos);
}

TEST(Kubeconfig, RejectsBadBase64AndHalfAClientCertificate) {
  const std::string head =
      "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n"
      "- name: c\n  cluster: {server: 'https://x'}\nusers:\n- name: u\n  user:\n";
  auto bad = ParseKubeconfig(head +
                                 "    client-certificate-data: '***'\n"
                                 "    client-key-data: aGVsbG8=\n",
                             "f");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("client-certificate-data"), std::string::npos);
  auto half = ParseKubeconfig(head + "    client-certificate: c.pem\n", "f");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.error().message.find("both the certificate and the key"), std::string::npos);
}

TEST(InClusterConfig, BuildsFromServiceEnvironment) {
  InClusterEnvironment env{"fd00::1", "443", "/var/run/secrets/kubernetes.io/serviceaccount"};
  auto config = InClusterConfig(env);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->server, "https://[fd00::1]:443");
  EXPECT_EQ(config->token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token");
  EXPECT_EQ(config->ca_file, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
  auto outside = InClusterConfig(InClusterEnvironment{});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.error().message.find("--kubeconfig"), std::string::npos);
}

}  // namespace
}  // namespace vfio_dra::kube
