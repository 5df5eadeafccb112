// KubeVirt's kubevirt.io/dra-networks annotation: parsing (absent, other claims' entries,
// malformed) and finding the MAC a claim's pod asks for, through an existing claim's pod claim
// name or a template claim's annotation.
#include "prepare/kubevirt_networks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace vfio_dra::prepare {
namespace {

using ::testing::HasSubstr;

class FakePods final : public kube::PodReader {
 public:
  std::map<std::string, kube::Pod> pods;
  int reads = 0;
  Result<kube::Pod> Get(const std::string& namespace_, const std::string& name, Deadline) override {
    ++reads;
    auto it = pods.find(namespace_ + "/" + name);
    if (it == pods.end()) return MakeError(ErrorKind::kNotFound, "pod " + name + " not found");
    return it->second;
  }
};

kube::Pod Pod(const std::string& name, const std::string& uid,
              std::optional<std::string> annotation) {
  kube::Pod pod;
  pod.namespace_ = "vms";
  pod.name = name;
  pod.uid = uid;
  if (annotation) pod.annotations[kKubevirtDraNetworksAnnotation] = *annotation;
  return pod;
}

kube::ResourceClaim ClaimUsedBy(const std::string& name, const std::vector<std::string>& pods) {
  kube::ResourceClaim claim;
  claim.namespace_ = "vms";
  claim.name = name;
  claim.uid = "c1";
  for (const std::string& pod : pods) claim.reserved_for.push_back({"", "pods", pod, "uid-" + pod});
  return claim;
}

TEST(KubevirtNetworks, ParsesEntriesAndToleratesFieldsItDoesNotKnow) {
  auto parsed = ParseKubevirtNetworks(
      R"([{"claimName":"sriov","requestName":"vf","mac":"02:00:00:00:BE:EF"},
          {"claimName":"other","requestName":"vf","future":1},
          {"claimName":"sriov","requestName":"vf2","mac":null}])");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_EQ((*parsed)[0].mac, "02:00:00:00:be:ef");
  EXPECT_EQ((*parsed)[1].mac, std::nullopt);
  EXPECT_EQ((*parsed)[2].request_name, "vf2");
  EXPECT_TRUE(ParseKubevirtNetworks("[]")->empty());
}

TEST(KubevirtNetworks, AMalformedAnnotationIsQuotedInTheError) {
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"{not json", "it is not JSON"},
           {R"({"claimName":"a"})", "it is not a JSON list"},
           {R"(["a"])", "entry 0 is no object"},
           {R"([{"requestName":"vf"}])", "needs a non-empty string \"claimName\""},
           {R"([{"claimName":"a","requestName":"vf","mac":"01:00:5e:00:00:01"}])",
            "not a unicast MAC"},
           {R"([{"claimName":"a","requestName":"vf"},{"claimName":"a","requestName":"vf"}])",
            "named twice"}}) {
    auto parsed = ParseKubevirtNetworks(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_THAT(parsed.error().message, HasSubstr("kubevirt.io/dra-networks")) << text;
    EXPECT_THAT(parsed.error().message, HasSubstr(why)) << text;
    EXPECT_THAT(parsed.error().message, HasSubstr(text.substr(0, 8))) << text;
  }
}

TEST(KubevirtNetworks, AnExistingClaimIsFoundThroughThePodsClaimName) {
  FakePods pods;
  kube::Pod pod = Pod("virt-launcher-a", "uid-virt-launcher-a",
                      R"([{"claimName":"nic","requestName":"vf","mac":"02:00:00:00:00:0a"},
                          {"claimName":"gpu","requestName":"vf","mac":"02:00:00:00:00:0b"}])");
  pod.resource_claims.push_back({"nic", std::string("sriov-claim"), std::nullopt});
  pods.pods["vms/virt-launcher-a"] = pod;
  auto macs = KubevirtNetworkRequests(&pods).MacsFor(
      ClaimUsedBy("sriov-claim", {"virt-launcher-a"}), Deadline());
  ASSERT_TRUE(macs.ok()) << macs.error().message;
  EXPECT_EQ(*macs, (std::map<std::string, std::string>{{"vf", "02:00:00:00:00:0a"}}));
}

TEST(KubevirtNetworks, ATemplateClaimIsFoundThroughItsPodClaimNameAnnotation) {
  FakePods pods;
  pods.pods["vms/virt-launcher-b"] =
      Pod("virt-launcher-b", "uid-virt-launcher-b",
          R"([{"claimName":"nic","requestName":"vf","mac":"02:00:00:00:00:0c"}])");
  kube::ResourceClaim claim = ClaimUsedBy("virt-launcher-b-nic-x7k2p", {"virt-launcher-b"});
  claim.annotations[kube::kPodClaimNameAnnotation] = "nic";
  auto macs = KubevirtNetworkRequests(&pods).MacsFor(claim, Deadline());
  ASSERT_TRUE(macs.ok()) << macs.error().message;
  EXPECT_EQ(macs->at("vf"), "02:00:00:00:00:0c");
}

TEST(KubevirtNetworks, NoAnnotationOrNoMatchingEntryAsksForNothing) {
  FakePods pods;
  pods.pods["vms/plain"] = Pod("plain", "uid-plain", std::nullopt);
  kube::ResourceClaim claim = ClaimUsedBy("nic-claim", {"plain"});
  claim.annotations[kube::kPodClaimNameAnnotation] = "nic";
  EXPECT_TRUE(KubevirtNetworkRequests(&pods).MacsFor(claim, Deadline())->empty());
  pods.pods["vms/plain"] = Pod("plain", "uid-plain", R"([{"claimName":"other","requestName":"vf",
                                                          "mac":"02:00:00:00:00:01"}])");
  EXPECT_TRUE(KubevirtNetworkRequests(&pods).MacsFor(claim, Deadline())->empty());
  // Without a pod reader (no API server) nothing is read or asked.
  EXPECT_TRUE(KubevirtNetworkRequests(nullptr).MacsFor(claim, Deadline())->empty());
}

TEST(KubevirtNetworks, AMalformedAnnotationFailsTheClaimNamingThePod) {
  FakePods pods;
  pods.pods["vms/bad"] = Pod("bad", "uid-bad", "[{\"claimName\":1}]");
  kube::ResourceClaim claim = ClaimUsedBy("nic-claim", {"bad"});
  claim.annotations[kube::kPodClaimNameAnnotation] = "nic";
  auto macs = KubevirtNetworkRequests(&pods).MacsFor(claim, Deadline());
  ASSERT_FALSE(macs.ok());
  EXPECT_THAT(macs.error().message, HasSubstr("pod vms/bad"));
  EXPECT_THAT(macs.error().message, HasSubstr("[{\"claimName\":1}]"));
}

TEST(KubevirtNetworks, TwoPodsAskingDifferentMacsForOneVfIsAnError) {
  FakePods pods;
  pods.pods["vms/a"] =
      Pod("a", "uid-a", R"([{"claimName":"nic","requestName":"vf","mac":"02:00:00:00:00:01"}])");
  pods.pods["vms/b"] =
      Pod("b", "uid-b", R"([{"claimName":"nic","requestName":"vf","mac":"02:00:00:00:00:02"}])");
  kube::ResourceClaim claim = ClaimUsedBy("shared", {"a", "b"});
  claim.annotations[kube::kPodClaimNameAnnotation] = "nic";
  auto macs = KubevirtNetworkRequests(&pods).MacsFor(claim, Deadline());
  ASSERT_FALSE(macs.ok());
  EXPECT_THAT(macs.error().message, HasSubstr("only one"));
}

TEST(KubevirtNetworks, APodThatCannotBeReadFailsTheClaimAndAReplacedPodIsSkipped) {
  FakePods pods;
  auto missing = KubevirtNetworkRequests(&pods).MacsFor(ClaimUsedBy("c", {"gone"}), Deadline());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message, HasSubstr("cannot read pod vms/gone"));
  // A pod of the same name but another UID is not the one the claim is reserved for.
  pods.pods["vms/gone"] = Pod(
      "gone", "another-uid", R"([{"claimName":"c","requestName":"vf","mac":"02:00:00:00:00:01"}])");
  kube::ResourceClaim claim = ClaimUsedBy("c", {"gone"});
  claim.annotations[kube::kPodClaimNameAnnotation] = "c";
  EXPECT_TRUE(KubevirtNetworkRequests(&pods).MacsFor(claim, Deadline())->empty());
}

}  // namespace
}  // namespace vfio_dra::prepare
