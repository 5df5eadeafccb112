// The fake API server's RBAC authorizer (test/tools/fake_rbac.h): request attributes as the
// kube-apiserver resolves them, rule matching, bindings, the Forbidden Status, and file errors.
#include "fake_rbac.h"

#include <gtest/gtest.h>

namespace vfio_dra::testing {
namespace {

using nlohmann::json;

// "verb group resource[/sub] ns name" for compact expectations.
std::string Resolve(const std::string& method, const std::string& path,
                    const std::multimap<std::string, std::string>& query = {}) {
  const RequestAttributes a = ResolveRequest(method, path, query);
  if (!a.resource_request) return "nonresource " + a.verb + " " + a.path;
  return a.verb + " " + (a.api_group.empty() ? "core" : a.api_group) + "/" + a.api_version + " " +
         a.resource + (a.subresource.empty() ? "" : "/" + a.subresource) + " ns=" + a.namespace_ +
         " name=" + a.name;
}

TEST(FakeRbacResolve, PathsBecomeTheAttributesTheRealServerDerives) {
  EXPECT_EQ(Resolve("GET", "/api/v1/namespaces/vms/pods/p"), "get core/v1 pods ns=vms name=p");
  EXPECT_EQ(Resolve("GET", "/api/v1/nodes/node-1"), "get core/v1 nodes ns= name=node-1");
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/c"),
            "get resource.k8s.io/v1 resourceclaims ns=vms name=c");
  EXPECT_EQ(
      Resolve("PATCH", "/apis/resource.k8s.io/v1beta1/namespaces/vms/resourceclaims/c/status"),
      "patch resource.k8s.io/v1beta1 resourceclaims/status ns=vms name=c");
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1/resourceslices"),
            "list resource.k8s.io/v1 resourceslices ns= name=");
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1/resourceslices", {{"watch", "1"}}),
            "watch resource.k8s.io/v1 resourceslices ns= name=");
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1/resourceslices", {{"watch", "true"}}),
            "watch resource.k8s.io/v1 resourceslices ns= name=");
  // A Go bool parameter: only 0 and false (any case) are false.
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1/resourceslices", {{"watch", "False"}}),
            "list resource.k8s.io/v1 resourceslices ns= name=");
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1/resourceslices", {{"watch", "yes"}}),
            "watch resource.k8s.io/v1 resourceslices ns= name=");
  EXPECT_EQ(Resolve("POST", "/apis/resource.k8s.io/v1/resourceslices"),
            "create resource.k8s.io/v1 resourceslices ns= name=");
  EXPECT_EQ(Resolve("PUT", "/apis/resource.k8s.io/v1/resourceslices/s"),
            "update resource.k8s.io/v1 resourceslices ns= name=s");
  EXPECT_EQ(Resolve("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s"),
            "delete resource.k8s.io/v1 resourceslices ns= name=s");
  EXPECT_EQ(Resolve("DELETE", "/apis/resource.k8s.io/v1/resourceslices"),
            "deletecollection resource.k8s.io/v1 resourceslices ns= name=");
  EXPECT_EQ(Resolve("HEAD", "/api/v1/namespaces/vms/pods/p"), "get core/v1 pods ns=vms name=p");
  // A list selecting one name by field is authorized for that name (resourceNames apply).
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1/resourceslices",
                    {{"fieldSelector", "spec.nodeName=n1,metadata.name=s1"}}),
            "list resource.k8s.io/v1 resourceslices ns= name=s1");
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1/resourceslices",
                    {{"fieldSelector", "metadata.name!=s1"}}),
            "list resource.k8s.io/v1 resourceslices ns= name=");
  // Namespaces themselves, and their own subresources.
  EXPECT_EQ(Resolve("GET", "/api/v1/namespaces"), "list core/v1 namespaces ns= name=");
  EXPECT_EQ(Resolve("GET", "/api/v1/namespaces/vms"), "get core/v1 namespaces ns=vms name=vms");
  EXPECT_EQ(Resolve("PUT", "/api/v1/namespaces/vms/status"),
            "update core/v1 namespaces/status ns=vms name=vms");
  EXPECT_EQ(Resolve("GET", "/api/v1/namespaces/vms/pods"), "list core/v1 pods ns=vms name=");
  // The deprecated verb prefix.
  EXPECT_EQ(Resolve("GET", "/api/v1/watch/namespaces/vms/pods/p"),
            "watch core/v1 pods ns=vms name=p");
}

TEST(FakeRbacResolve, DiscoveryAndOtherPathsAreNonResourceRequests) {
  EXPECT_EQ(Resolve("GET", "/version"), "nonresource get /version");
  EXPECT_EQ(Resolve("GET", "/api"), "nonresource get /api");
  EXPECT_EQ(Resolve("GET", "/api/v1"), "nonresource get /api/v1");
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io"), "nonresource get /apis/resource.k8s.io");
  EXPECT_EQ(Resolve("GET", "/apis/resource.k8s.io/v1"), "nonresource get /apis/resource.k8s.io/v1");
  EXPECT_EQ(Resolve("POST", "/metrics"), "nonresource post /metrics");
}

RequestAttributes Request(const std::string& method, const std::string& path) {
  return ResolveRequest(method, path, {});
}

TEST(FakeRbacRules, MatchAsKubernetesMatchesThem) {
  const PolicyRule status{.verbs = {"patch"},
                          .api_groups = {"resource.k8s.io"},
                          .resources = {"resourceclaims/status"}};
  const std::string claim = "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/c";
  EXPECT_TRUE(RuleAllows(status, Request("PATCH", claim + "/status")));
  EXPECT_FALSE(RuleAllows(status, Request("PATCH", claim)));  // the main resource is separate
  EXPECT_FALSE(RuleAllows(status, Request("PUT", claim + "/status")));
  EXPECT_FALSE(RuleAllows(status, Request("PATCH", "/api/v1/namespaces/vms/resourceclaims/c")));

  const PolicyRule any_status{.verbs = {"*"}, .api_groups = {"*"}, .resources = {"*/status"}};
  EXPECT_TRUE(RuleAllows(any_status, Request("PATCH", claim + "/status")));
  EXPECT_FALSE(RuleAllows(any_status, Request("GET", claim)));
  const PolicyRule everything{.verbs = {"*"}, .api_groups = {"*"}, .resources = {"*"}};
  EXPECT_TRUE(RuleAllows(everything, Request("PATCH", claim + "/status")));
  EXPECT_FALSE(RuleAllows(everything, Request("GET", "/metrics")));  // not a resource

  // resourceNames never match a request without a name.
  const PolicyRule named{.verbs = {"get", "list", "create"},
                         .api_groups = {"resource.k8s.io"},
                         .resources = {"resourceslices"},
                         .resource_names = {"s1"}};
  const std::string slices = "/apis/resource.k8s.io/v1/resourceslices";
  EXPECT_TRUE(RuleAllows(named, Request("GET", slices + "/s1")));
  EXPECT_FALSE(RuleAllows(named, Request("GET", slices + "/s2")));
  EXPECT_FALSE(RuleAllows(named, Request("GET", slices)));
  EXPECT_FALSE(RuleAllows(named, Request("POST", slices)));
  EXPECT_TRUE(
      RuleAllows(named, ResolveRequest("GET", slices, {{"fieldSelector", "metadata.name=s1"}})));

  // The 1.36 per-driver right is a legitimate rule no plain request matches.
  const PolicyRule driver{.verbs = {"associated-node:patch", "associated-node:update"},
                          .api_groups = {"resource.k8s.io"},
                          .resources = {"resourceclaims/driver"},
                          .resource_names = {"vfio.dra.io"}};
  EXPECT_FALSE(RuleAllows(driver, Request("PATCH", claim + "/status")));
  EXPECT_FALSE(RuleAllows(driver, Request("PATCH", claim + "/driver")));

  const PolicyRule metrics{.verbs = {"get"}, .non_resource_urls = {"/metrics", "/debug/*"}};
  EXPECT_TRUE(RuleAllows(metrics, Request("GET", "/metrics")));
  EXPECT_TRUE(RuleAllows(metrics, Request("GET", "/debug/pprof")));
  EXPECT_FALSE(RuleAllows(metrics, Request("POST", "/metrics")));
}

constexpr const char* kUser = "system:serviceaccount:vfio-dra:vfio-dra-plugin";

RbacAuthorizer MustParse(const std::string& text) {
  auto parsed = RbacAuthorizer::Parse(text, "rbac.yaml", kUser);
  EXPECT_TRUE(parsed.ok()) << parsed.error().message;
  return parsed.ok() ? *parsed : *RbacAuthorizer::Parse("", "empty", kUser);
}

constexpr const char* kPodReader = R"(apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-reader}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get"]
)";

TEST(FakeRbacAuthorizer, OnlyRolesBoundToTheUserCount) {
  const std::string pod = "/api/v1/namespaces/vms/pods/p";
  // No binding at all.
  EXPECT_FALSE(MustParse(kPodReader).Authorize(Request("GET", pod)).allowed);
  // Bound to another service account, and to the right name in another namespace.
  const RbacAuthorizer other = MustParse(std::string(kPodReader) + R"(---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: b}
subjects:
  - {kind: ServiceAccount, name: someone-else, namespace: vfio-dra}
  - {kind: ServiceAccount, name: vfio-dra-plugin, namespace: default}
  - {kind: User, apiGroup: rbac.authorization.k8s.io, name: vfio-dra-plugin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
)");
  EXPECT_FALSE(other.Authorize(Request("GET", pod)).allowed);
  // Bound by user name, and through the service account's groups.
  for (const std::string& subject :
       {"{kind: User, apiGroup: rbac.authorization.k8s.io, name: " + std::string(kUser) + "}",
        std::string("{kind: Group, apiGroup: rbac.authorization.k8s.io, name: "
                    "\"system:serviceaccounts:vfio-dra\"}"),
        std::string("{kind: Group, apiGroup: rbac.authorization.k8s.io, name: "
                    "\"system:authenticated\"}"),
        std::string("{kind: ServiceAccount, name: vfio-dra-plugin, namespace: vfio-dra}")}) {
    const RbacAuthorizer bound = MustParse(std::string(kPodReader) + R"(---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: b}
subjects: [)" + subject + R"(]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
)");
    EXPECT_TRUE(bound.Authorize(Request("GET", pod)).allowed) << subject;
    EXPECT_FALSE(bound.Authorize(Request("DELETE", pod)).allowed) << subject;
  }
}

TEST(FakeRbacAuthorizer, RoleBindingsGrantInTheirNamespaceOnly) {
  const RbacAuthorizer rbac = MustParse(std::string(kPodReader) + R"(---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: claims, namespace: vms}
rules:
  - {apiGroups: [resource.k8s.io], resources: [resourceclaims], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: claims, namespace: vms}
subjects:
  - {kind: ServiceAccount, name: vfio-dra-plugin, namespace: vfio-dra}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: claims}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: pods, namespace: vfio-dra}
subjects:
  - {kind: ServiceAccount, name: vfio-dra-plugin}  # the binding's namespace
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
)");
  EXPECT_TRUE(
      rbac.Authorize(Request("GET", "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/c"))
          .allowed);
  EXPECT_FALSE(
      rbac.Authorize(Request("GET", "/apis/resource.k8s.io/v1/namespaces/web/resourceclaims/c"))
          .allowed);
  EXPECT_FALSE(rbac.Authorize(Request("GET", "/apis/resource.k8s.io/v1/resourceclaims")).allowed);
  EXPECT_TRUE(rbac.Authorize(Request("GET", "/api/v1/namespaces/vfio-dra/pods/p")).allowed);
  EXPECT_FALSE(rbac.Authorize(Request("GET", "/api/v1/namespaces/vms/pods/p")).allowed);
}

TEST(FakeRbacAuthorizer, DiscoveryIsEveryonesAndAMissingRoleIsTheReason) {
  const RbacAuthorizer rbac = MustParse(R"(
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: b}
subjects: [{kind: ServiceAccount, name: vfio-dra-plugin, namespace: vfio-dra}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: not-there}
)");
  for (const char* path : {"/version", "/api", "/api/v1", "/apis", "/apis/resource.k8s.io",
                           "/apis/resource.k8s.io/v1", "/healthz", "/openapi/v3"}) {
    EXPECT_TRUE(rbac.Authorize(Request("GET", path)).allowed) << path;
  }
  EXPECT_FALSE(rbac.Authorize(Request("GET", "/metrics")).allowed);
  const RbacDecision denied = rbac.Authorize(Request("GET", "/api/v1/nodes/n"));
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.reason, "RBAC: clusterrole.rbac.authorization.k8s.io \"not-there\" not found");
}

TEST(FakeRbacForbidden, TheStatusIsWordedAsTheRealServersIs) {
  const std::string user = kUser;
  EXPECT_EQ(ForbiddenStatus(Request("GET", "/api/v1/namespaces/vms/pods/virt-launcher-x"), user),
            json::parse(R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
              "message":"pods \"virt-launcher-x\" is forbidden: User \"system:serviceaccount:vfio-dra:vfio-dra-plugin\" cannot get resource \"pods\" in API group \"\" in the namespace \"vms\"",
              "reason":"Forbidden","details":{"name":"virt-launcher-x","kind":"pods"},"code":403})"));
  const json status = ForbiddenStatus(
      Request("PATCH", "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/c/status"), user);
  EXPECT_EQ(status["message"],
            "resourceclaims.resource.k8s.io \"c\" is forbidden: User "
            "\"system:serviceaccount:vfio-dra:vfio-dra-plugin\" cannot patch resource "
            "\"resourceclaims/status\" in API group \"resource.k8s.io\" in the namespace \"vms\"");
  EXPECT_EQ(status["details"],
            json({{"name", "c"}, {"group", "resource.k8s.io"}, {"kind", "resourceclaims"}}));
  EXPECT_EQ(
      ForbiddenStatus(Request("GET", "/apis/resource.k8s.io/v1/resourceslices"), user)["message"],
      "resourceslices.resource.k8s.io is forbidden: User "
      "\"system:serviceaccount:vfio-dra:vfio-dra-plugin\" cannot list resource "
      "\"resourceslices\" in API group \"resource.k8s.io\" at the cluster scope");
  EXPECT_EQ(ForbiddenStatus(Request("GET", "/api/v1/nodes/n1"), user, "RBAC: x")["message"],
            "nodes \"n1\" is forbidden: User \"system:serviceaccount:vfio-dra:vfio-dra-plugin\" "
            "cannot get resource \"nodes\" in API group \"\" at the cluster scope: RBAC: x");
  const json path = ForbiddenStatus(Request("GET", "/metrics"), user);
  EXPECT_EQ(path["message"],
            "forbidden: User \"system:serviceaccount:vfio-dra:vfio-dra-plugin\" cannot get path "
            "\"/metrics\"");
  EXPECT_EQ(path["details"], json::object());
}

std::string ParseError(const std::string& text) {
  auto parsed = RbacAuthorizer::Parse(text, "/x/rbac.yaml", kUser);
  return parsed.ok() ? "(accepted)" : parsed.error().message;
}

TEST(FakeRbacFile, MalformedRolesAndBindingsAreReportedWithFileAndLine) {
  EXPECT_EQ(ParseError("kind: ClusterRole\nrules: [\n"),
            "invalid RBAC file /x/rbac.yaml:3: end of sequence flow not found");
  const std::string header =
      "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n";
  EXPECT_EQ(ParseError(header + "rules:\n  - apiGroups: ['']\n    resource: [pods]\n"
                                "    verbs: [get]\n"),
            "invalid RBAC file /x/rbac.yaml:6: ClusterRole r: rules[0]: unknown field "
            "\"resource\"");
  EXPECT_EQ(ParseError(header + "rules:\n  - {apiGroups: [''], resources: [pods]}\n"),
            "invalid RBAC file /x/rbac.yaml:5: ClusterRole r: rules[0].verbs: Required value: "
            "verbs must contain at least one value");
  EXPECT_EQ(ParseError(header + "rules:\n  - {resources: [pods], verbs: [get]}\n"),
            "invalid RBAC file /x/rbac.yaml:5: ClusterRole r: rules[0].apiGroups: Required "
            "value: resource rules must supply at least one api group");
  EXPECT_EQ(ParseError(header + "rules:\n  - {apiGroups: [''], resources: pods, verbs: [get]}\n"),
            "invalid RBAC file /x/rbac.yaml:5: ClusterRole r: rules[0].resources: must be a "
            "list of strings");
  EXPECT_NE(ParseError("apiVersion: v1\nkind: ClusterRole\nmetadata: {name: r}\n")
                .find("ClusterRole r: apiVersion: must be rbac.authorization.k8s.io/v1"),
            std::string::npos);
  EXPECT_NE(ParseError(header + "---\n" + header).find("defined twice (first at line 1)"),
            std::string::npos);
  EXPECT_NE(ParseError("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: "
                       "{name: r}\n")
                .find("Role r: metadata.namespace: Required value"),
            std::string::npos);
  EXPECT_NE(ParseError(header + "aggregationRule: {clusterRoleSelectors: []}\n")
                .find("aggregationRule: not supported"),
            std::string::npos);
  const std::string binding =
      "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: b}\n";
  EXPECT_EQ(ParseError(binding + "subjects: [{kind: ServiceAccount, name: sa}]\n"
                                 "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: "
                                 "ClusterRole, name: r}\n"),
            "invalid RBAC file /x/rbac.yaml:4: ClusterRoleBinding b: subjects[0].namespace: "
            "Required value");
  EXPECT_NE(ParseError(binding + "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, "
                                 "name: r}\n")
                .find("roleRef.kind: Unsupported value: \"Role\": supported values: "
                      "\"ClusterRole\""),
            std::string::npos);
  EXPECT_NE(ParseError(binding).find("ClusterRoleBinding b: roleRef: Required value"),
            std::string::npos);
  EXPECT_NE(ParseError("- a list\n").find("document 1: must be a mapping"), std::string::npos);
  // Other kinds, empty documents and an empty role are fine.
  EXPECT_EQ(
      ParseError("---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n---\n" + header),
      "(accepted)");
}

TEST(FakeRbacFile, TheShippedFileLoads) {
  auto shipped = RbacAuthorizer::Load(ShippedRbacFile(), kUser);
  ASSERT_TRUE(shipped.ok()) << shipped.error().message;
  EXPECT_TRUE(shipped->Authorize(Request("GET", "/api/v1/namespaces/vms/pods/p")).allowed);
  auto missing = RbacAuthorizer::Load("/nonexistent/rbac.yaml", kUser);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("cannot read RBAC file /nonexistent/rbac.yaml"),
            std::string::npos)
      << missing.error().message;
}

}  // namespace
}  // namespace vfio_dra::testing
