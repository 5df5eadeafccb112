#include "kube/pod.h"

#include <gtest/gtest.h>

#include <deque>

#include "unit/fake_clock.h"

namespace vfio_dra::kube {
namespace {

using nlohmann::json;

Result<Pod> Parse(const char* text) { return ParsePod(json::parse(text)); }

void ExpectFieldError(const char* text, const std::string& field) {
  auto pod = Parse(text);
  ASSERT_FALSE(pod.ok()) << text;
  EXPECT_EQ(pod.error().kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(pod.error().message.find("Pod field " + field), std::string::npos)
      << pod.error().message;
}

TEST(Pod, ParsesMetadataClaimsAndClaimStatuses) {
  auto pod = Parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"namespace": "vms", "name": "virt-launcher-vm1-x7k2p", "uid": "pod-1",
                 "annotations": {"kubevirt.io/dra-networks": "[]", "other": "x"}},
    "spec": {"resourceClaims": [
      {"name": "gpu", "resourceClaimName": "shared-gpu"},
      {"name": "sriov", "resourceClaimTemplateName": "sriov-tmpl"}]},
    "status": {"phase": "Pending", "resourceClaimStatuses": [
      {"name": "sriov", "resourceClaimName": "virt-launcher-vm1-x7k2p-sriov-abcde"},
      {"name": "unneeded"}]}
  })");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  EXPECT_EQ(pod->namespace_, "vms");
  EXPECT_EQ(pod->name, "virt-launcher-vm1-x7k2p");
  EXPECT_EQ(pod->uid, "pod-1");
  EXPECT_EQ(pod->annotations.at("kubevirt.io/dra-networks"), "[]");
  ASSERT_EQ(pod->resource_claims.size(), 2u);
  EXPECT_EQ(pod->resource_claims[0].resource_claim_name.value(), "shared-gpu");
  EXPECT_FALSE(pod->resource_claims[0].resource_claim_template_name.has_value());
  EXPECT_EQ(pod->resource_claims[1].resource_claim_template_name.value(), "sriov-tmpl");
  EXPECT_FALSE(pod->resource_claims[1].resource_claim_name.has_value());
  ASSERT_EQ(pod->resource_claim_statuses.size(), 2u);
  EXPECT_EQ(pod->resource_claim_statuses[0].resource_claim_name.value(),
            "virt-launcher-vm1-x7k2p-sriov-abcde");
  EXPECT_FALSE(pod->resource_claim_statuses[1].resource_claim_name.has_value());
}

TEST(Pod, PodClaimNameOfFindsDirectAndTemplateClaims) {
  auto pod = Parse(R"({"metadata": {"name": "p"},
    "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"},
                                {"name": "nic", "resourceClaimTemplateName": "nic-tmpl"},
                                {"name": "unneeded", "resourceClaimTemplateName": "t"}]},
    "status": {"resourceClaimStatuses": [{"name": "nic", "resourceClaimName": "p-nic-x1"},
                                         {"name": "unneeded", "resourceClaimName": null}]}})");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  EXPECT_EQ(pod->PodClaimNameOf("shared-gpu"), "gpu");
  EXPECT_EQ(pod->PodClaimNameOf("p-nic-x1"), "nic");
  EXPECT_EQ(pod->PodClaimNameOf("gpu"), std::nullopt);  // a pod claim name is not a claim name
  EXPECT_EQ(pod->PodClaimNameOf("nic-tmpl"), std::nullopt);
  EXPECT_EQ(pod->PodClaimNameOf(""), std::nullopt);
}

TEST(Pod, SpecWinsOverStatusForTheSameClaim) {
  auto pod = Parse(R"({"metadata": {"name": "p"},
    "spec": {"resourceClaims": [{"name": "direct", "resourceClaimName": "c"}]},
    "status": {"resourceClaimStatuses": [{"name": "generated", "resourceClaimName": "c"}]}})");
  ASSERT_TRUE(pod.ok());
  EXPECT_EQ(pod->PodClaimNameOf("c"), "direct");
}

TEST(Pod, AbsentOptionalFieldsAreFine) {
  auto pod = Parse(R"({"metadata": {"name": "p", "annotations": null}, "spec": null})");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  EXPECT_EQ(pod->name, "p");
  EXPECT_TRUE(pod->annotations.empty());
  EXPECT_TRUE(pod->resource_claims.empty());
  EXPECT_TRUE(pod->resource_claim_statuses.empty());
  EXPECT_EQ(pod->PodClaimNameOf("c"), std::nullopt);
}

TEST(Pod, WrongTypesAreErrorsNamingTheField) {
  ExpectFieldError(R"([])", "(object)");
  ExpectFieldError(R"({"spec": {}})", "metadata");
  ExpectFieldError(R"({"metadata": {"name": 5}})", "metadata.name");
  ExpectFieldError(R"({"metadata": {"annotations": []}})", "metadata.annotations");
  ExpectFieldError(R"({"metadata": {"annotations": {"kubevirt.io/dra-networks": ["x"]}}})",
                   "metadata.annotations[kubevirt.io/dra-networks]");
  ExpectFieldError(R"({"metadata": {}, "spec": []})", "spec");
  ExpectFieldError(R"({"metadata": {}, "spec": {"resourceClaims": {}}})", "spec.resourceClaims");
  ExpectFieldError(R"({"metadata": {}, "spec": {"resourceClaims": ["gpu"]}})",
                   "spec.resourceClaims[0]");
  ExpectFieldError(R"({"metadata": {}, "spec": {"resourceClaims": [{"resourceClaimName": "c"}]}})",
                   "spec.resourceClaims[0].name is required");
  ExpectFieldError(
      R"({"metadata": {}, "spec": {"resourceClaims": [{"name": "a", "resourceClaimName": 1}]}})",
      "spec.resourceClaims[0].resourceClaimName must be a string");
  ExpectFieldError(R"({"metadata": {}, "spec": {"resourceClaims": [
                        {"name": "a", "resourceClaimName": "c"},
                        {"name": "b", "resourceClaimTemplateName": false}]}})",
                   "spec.resourceClaims[1].resourceClaimTemplateName");
  ExpectFieldError(R"({"metadata": {}, "status": "Running"})", "status");
  ExpectFieldError(R"({"metadata": {}, "status": {"resourceClaimStatuses": [
                        {"name": "a", "resourceClaimName": 7}]}})",
                   "status.resourceClaimStatuses[0].resourceClaimName must be a string");
}

// Answers every request with one canned response and records the requests.
class CannedTransport final : public HttpTransport {
 public:
  CannedTransport(int status, std::string body) : status_(status), body_(std::move(body)) {}
  Result<HttpResponse> Send(const HttpRequest& request) override {
    sent.push_back(request);
    HttpResponse response;
    response.status = status_;
    response.body = body_;
    return response;
  }
  Result<HttpResponse> Stream(const HttpRequest& request, const BodyChunkHandler&,
                              std::stop_token) override {
    return Send(request);
  }
  std::vector<HttpRequest> sent;

 private:
  int status_;
  std::string body_;
};

class ApiPodReaderTest : public ::testing::Test {
 protected:
  Result<Pod> Get(int status, const std::string& body) {
    CannedTransport transport(status, body);
    ApiClientOptions options;
    options.qps = 0;
    options.max_retries = 0;
    ApiClient client(transport, tokens_, clock_, Logger::Discard(), options);
    ApiPodReader reader(client);
    auto pod = reader.Get("vm ns", "virt-launcher-1", Deadline());
    sent_ = transport.sent;
    return pod;
  }
  testing::FakeClock clock_;
  TokenSource tokens_{"", "", clock_};
  std::vector<HttpRequest> sent_;
};

TEST_F(ApiPodReaderTest, GetsThePodByNamespaceAndName) {
  auto pod = Get(200, R"({"metadata": {"namespace": "vm ns", "name": "virt-launcher-1"}})");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  EXPECT_EQ(pod->name, "virt-launcher-1");
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].method, "GET");
  EXPECT_EQ(sent_[0].path_and_query, "/api/v1/namespaces/vm%20ns/pods/virt-launcher-1");
}

TEST_F(ApiPodReaderTest, MalformedAnswersAreErrorsNotCrashes) {
  for (const char* body : {"not json", "[1,2]", R"({"metadata": {"annotations": {"a": 1}}})"}) {
    auto pod = Get(200, body);
    ASSERT_FALSE(pod.ok()) << body;
    EXPECT_NE(pod.error().message.find("cannot parse Pod vm ns/virt-launcher-1"), std::string::npos)
        << pod.error().message;
  }
}

TEST_F(ApiPodReaderTest, ForbiddenNamesTheMissingRule) {
  auto pod = Get(403, R"({"kind": "Status", "apiVersion": "v1", "status": "Failure",
    "message": "pods \"virt-launcher-1\" is forbidden: User \"system:serviceaccount:vfio-dra:vfio-dra-plugin\" cannot get resource \"pods\"",
    "reason": "Forbidden", "code": 403})");
  ASSERT_FALSE(pod.ok());
  EXPECT_EQ(pod.error().kind, ErrorKind::kPermissionDenied);
  EXPECT_NE(pod.error().message.find("cannot get resource \"pods\""), std::string::npos);
  EXPECT_NE(pod.error().message.find("get on pods; see deploy/daemonset/rbac.yaml"),
            std::string::npos)
      << pod.error().message;
}

TEST_F(ApiPodReaderTest, MissingPodIsNotFound) {
  auto pod = Get(404, R"({"kind": "Status", "apiVersion": "v1", "status": "Failure",
    "message": "pods \"virt-launcher-1\" not found", "reason": "NotFound",
    "details": {"name": "virt-launcher-1", "kind": "pods"}, "code": 404})");
  ASSERT_FALSE(pod.ok());
  EXPECT_EQ(pod.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(pod.error().message.find("Pod vm ns/virt-launcher-1 not found"), std::string::npos);
}

}  // namespace
}  // namespace vfio_dra::kube
