// fake_rbac: the kube-apiserver's RBAC authorizer, for the fake API server. It reads the roles and
// bindings of a manifest file (what `kubectl apply -f` would create from it) and decides, for the
// one user all requests come from, as the real server does: the request attributes are derived
// from the URL as k8s.io/apiserver's RequestInfoFactory derives them, the rules match as
// pkg/apis/rbac/v1's evaluation helpers match them, and a denial is the Status body
// responsewriters.Forbidden writes. So a test that runs the plugin under the shipped
// deploy/daemonset/rbac.yaml fails, as a cluster would, when a rule the plugin needs is missing.
//
// The rules every authenticated user holds in a real cluster (system:discovery,
// system:public-info-viewer, system:basic-user) are built in. Aggregated ClusterRoles are refused:
// their rules come from a controller the fake does not run.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/result.h"

namespace vfio_dra::testing {

// What a request asks for, in the terms RBAC decides on.
struct RequestAttributes {
  bool resource_request = false;
  std::string verb;
  std::string path;  // what nonResourceURLs match
  std::string api_group;
  std::string api_version;
  std::string namespace_;
  std::string resource;
  std::string subresource;
  std::string name;
};

// The attributes of `method` on `path` (decoded, as in the request line) with the decoded query
// parameters `query` (the watch and fieldSelector parameters turn a collection GET into watch,
// or give a list the name it selects).
RequestAttributes ResolveRequest(const std::string& method, const std::string& path,
                                 const std::multimap<std::string, std::string>& query);

// The initializers let a rule be written with only the fields it uses (.verbs = ..., ...).
struct PolicyRule {
  std::vector<std::string> verbs = {};
  std::vector<std::string> api_groups = {};
  std::vector<std::string> resources = {};
  std::vector<std::string> resource_names = {};
  std::vector<std::string> non_resource_urls = {};
};

bool RuleAllows(const PolicyRule& rule, const RequestAttributes& request);

struct RbacDecision {
  bool allowed = false;
  // For a denial, what the authorizer adds to the message (a bound role that does not exist);
  // usually empty.
  std::string reason;
};

class RbacAuthorizer {
 public:
  // Reads every document of the YAML `text` (from `source`, which errors name): ClusterRoles,
  // Roles and the bindings of either; other kinds are skipped. A malformed role or binding is an
  // error, as the real server would refuse to store it.
  static Result<RbacAuthorizer> Parse(const std::string& text, const std::string& source,
                                      const std::string& user);
  static Result<RbacAuthorizer> Load(const std::string& path, const std::string& user);

  RbacDecision Authorize(const RequestAttributes& request) const;
  const std::string& user() const { return user_; }

 private:
  struct RoleRef {
    std::string kind;  // "ClusterRole" or "Role"
    std::string name;
  };
  struct Binding {
    std::string namespace_;  // empty for a ClusterRoleBinding
    RoleRef role;
  };

  std::string user_;
  std::vector<std::string> groups_;
  std::map<std::string, std::vector<PolicyRule>> cluster_roles_;
  std::map<std::string, std::vector<PolicyRule>> roles_;  // "namespace/name"
  std::vector<Binding> bindings_;                         // only those naming the user
};

// The 403 Status the real server answers when `user` may not do `request`.
nlohmann::json ForbiddenStatus(const RequestAttributes& request, const std::string& user,
                               const std::string& reason = "");

// The service account the plugin's DaemonSet runs as, which the shipped rbac.yaml binds.
inline constexpr const char* kPluginServiceAccountUser =
    "system:serviceaccount:vfio-dra:vfio-dra-plugin";

// The path of this source tree's deploy/daemonset/rbac.yaml.
std::string ShippedRbacFile();

}  // namespace vfio_dra::testing
