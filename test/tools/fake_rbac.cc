#include "fake_rbac.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>

#include "base/file_io.h"

namespace vfio_dra::testing {
namespace {

using nlohmann::json;

constexpr const char* kRbacGroup = "rbac.authorization.k8s.io";
constexpr const char* kRbacApiVersion = "rbac.authorization.k8s.io/v1";
constexpr const char* kServiceAccountPrefix = "system:serviceaccount:";

bool Contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

// strings.Split(strings.Trim(path, "/"), "/"): inner empty segments stay, unlike the fake
// server's own path splitting, because the resolver keeps them.
std::vector<std::string> SplitPathAsGo(const std::string& path) {
  const size_t begin = path.find_first_not_of('/');
  if (begin == std::string::npos) return {};
  const size_t end = path.find_last_not_of('/');
  const std::string trimmed = path.substr(begin, end - begin + 1);
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t slash = trimmed.find('/', start);
    parts.push_back(trimmed.substr(start, slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return parts;
}

std::string Lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The name a field selector pins with metadata.name=<name> or metadata.name==<name>
// (fields.Selector.RequiresExactMatch), if it is a valid path segment; else "".
std::string ExactNameOf(const std::string& selector) {
  size_t start = 0;
  while (start <= selector.size()) {
    size_t comma = selector.find(',', start);
    if (comma == std::string::npos) comma = selector.size();
    const std::string term = selector.substr(start, comma - start);
    start = comma + 1;
    if (term.find("!=") != std::string::npos) continue;
    const size_t eq = term.find('=');
    if (eq == std::string::npos || term.substr(0, eq) != "metadata.name") continue;
    std::string value = term.substr(eq + 1);
    if (!value.empty() && value[0] == '=') value.erase(0, 1);
    // path.IsValidPathSegmentName
    if (value == "." || value == ".." || value.find_first_of("/%") != std::string::npos) {
      return "";
    }
    return value;
  }
  return "";
}

// A Go bool query parameter: anything but "0" and "false" (any case) is true.
bool QueryBool(const std::multimap<std::string, std::string>& query, const std::string& key) {
  auto it = query.find(key);
  if (it == query.end()) return false;
  return it->second != "0" && Lower(it->second) != "false";
}

bool VerbMatches(const PolicyRule& rule, const std::string& verb) {
  return Contains(rule.verbs, "*") || Contains(rule.verbs, verb);
}

bool ApiGroupMatches(const PolicyRule& rule, const std::string& group) {
  return Contains(rule.api_groups, "*") || Contains(rule.api_groups, group);
}

bool ResourceMatches(const PolicyRule& rule, const std::string& combined,
                     const std::string& subresource) {
  for (const std::string& resource : rule.resources) {
    if (resource == "*" || resource == combined) return true;
    if (!subresource.empty() && resource == "*/" + subresource) return true;
  }
  return false;
}

bool ResourceNameMatches(const PolicyRule& rule, const std::string& name) {
  return rule.resource_names.empty() || Contains(rule.resource_names, name);
}

bool NonResourceUrlMatches(const PolicyRule& rule, const std::string& path) {
  for (const std::string& url : rule.non_resource_urls) {
    if (url == "*" || url == path) return true;
    if (!url.empty() && url.back() == '*' && path.rfind(url.substr(0, url.size() - 1), 0) == 0) {
      return true;
    }
  }
  return false;
}

// The bootstrap roles bound to system:authenticated in every cluster: system:discovery,
// system:public-info-viewer and system:basic-user.
const std::vector<PolicyRule>& DefaultRules() {
  static const std::vector<PolicyRule> rules = {
      {.verbs = {"get"},
       .non_resource_urls = {"/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                             "/openapi/*", "/readyz", "/version", "/version/"}},
      {.verbs = {"create"},
       .api_groups = {"authorization.k8s.io"},
       .resources = {"selfsubjectaccessreviews", "selfsubjectrulesreviews"}},
      {.verbs = {"create"},
       .api_groups = {"authentication.k8s.io"},
       .resources = {"selfsubjectreviews"}},
  };
  return rules;
}

// The groups the authenticator gives `user`: a service account's token carries its own two.
std::vector<std::string> GroupsOf(const std::string& user) {
  std::vector<std::string> groups;
  if (user.rfind(kServiceAccountPrefix, 0) == 0) {
    const std::string rest = user.substr(std::string(kServiceAccountPrefix).size());
    groups.emplace_back("system:serviceaccounts");
    groups.push_back("system:serviceaccounts:" + rest.substr(0, rest.find(':')));
  }
  groups.emplace_back("system:authenticated");
  return groups;
}

// Go's %q for the names and paths in a Forbidden message.
std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      constexpr const char* kHex = "0123456789abcdef";
      const auto byte = static_cast<unsigned char>(c);
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// utilerrors.NewAggregate(...).Error(): one message as it is, several deduplicated in brackets.
std::string Aggregate(const std::vector<std::string>& errors) {
  if (errors.size() == 1) return errors[0];
  std::vector<std::string> seen;
  for (const std::string& e : errors) {
    if (!Contains(seen, e)) seen.push_back(e);
  }
  std::string joined;
  for (const std::string& e : seen) joined += (joined.empty() ? "" : ", ") + e;
  return seen.size() == 1 ? joined : "[" + joined + "]";
}

struct ParsedBinding {
  std::string namespace_;
  std::string role_kind;
  std::string role_name;
  bool applies = false;  // one of its subjects is the user
};

struct ParsedPolicy {
  std::map<std::string, std::vector<PolicyRule>> cluster_roles;
  std::map<std::string, std::vector<PolicyRule>> roles;  // "namespace/name"
  std::vector<ParsedBinding> bindings;
  std::map<std::string, int> lines;  // "kind namespace/name" -> the line it was first defined at
};

// Reads the fields of one object, naming the file, line and object in every problem.
class ObjectReader {
 public:
  ObjectReader(const std::string& source, std::string object)
      : source_(source), object_(std::move(object)) {}

  void Rename(std::string object) { object_ = std::move(object); }

  Error Problem(const YAML::Node& node, const std::string& field,
                const std::string& problem) const {
    std::string where = source_;
    if (node.IsDefined() && node.Mark().line >= 0) {
      where += ":" + std::to_string(node.Mark().line + 1);
    }
    return MakeError(ErrorKind::kInvalidArgument, "invalid RBAC file " + where + ": " + object_ +
                                                      ": " + (field.empty() ? "" : field + ": ") +
                                                      problem);
  }

  // Strict field validation (kubectl's default): a misspelt field is an error, not ignored.
  Status CheckKeys(const YAML::Node& map, const std::string& field,
                   std::initializer_list<const char*> known) const {
    if (!map.IsMap()) return Problem(map, field, "must be a mapping");
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      if (std::none_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) {
        return Problem(kv.first, field, "unknown field " + Quote(key));
      }
    }
    return Status::Ok();
  }

  // An optional string field of `map` ("" when absent or null).
  Result<std::string> String(const YAML::Node& map, const char* key,
                             const std::string& field) const {
    const YAML::Node value = map[key];
    if (!value.IsDefined() || value.IsNull()) return std::string();
    if (!value.IsScalar()) return Problem(value, Join(field, key), "must be a string");
    return value.Scalar();
  }

  // An optional list of strings.
  Result<std::vector<std::string>> Strings(const YAML::Node& map, const char* key,
                                           const std::string& field) const {
    const YAML::Node value = map[key];
    std::vector<std::string> out;
    if (!value.IsDefined() || value.IsNull()) return out;
    if (!value.IsSequence()) return Problem(value, Join(field, key), "must be a list of strings");
    for (const YAML::Node& item : value) {
      if (!item.IsScalar()) return Problem(item, Join(field, key), "must be a list of strings");
      out.push_back(item.Scalar());
    }
    return out;
  }

  static std::string Join(const std::string& field, const std::string& key) {
    return field.empty() ? key : field + "." + key;
  }

 private:
  const std::string& source_;
  std::string object_;
};

// pkg/apis/rbac/validation ValidatePolicyRule.
Result<PolicyRule> ReadRule(const ObjectReader& reader, const YAML::Node& node,
                            const std::string& field, bool namespaced) {
  if (Status s = reader.CheckKeys(
          node, field, {"apiGroups", "resources", "resourceNames", "verbs", "nonResourceURLs"});
      !s.ok()) {
    return s.error();
  }
  PolicyRule rule;
  const std::pair<const char*, std::vector<std::string>*> lists[] = {
      {"verbs", &rule.verbs},
      {"apiGroups", &rule.api_groups},
      {"resources", &rule.resources},
      {"resourceNames", &rule.resource_names},
      {"nonResourceURLs", &rule.non_resource_urls}};
  for (const auto& [key, out] : lists) {
    auto values = reader.Strings(node, key, field);
    if (!values.ok()) return values.error();
    *out = std::move(*values);
  }
  if (rule.verbs.empty()) {
    return reader.Problem(node, field + ".verbs",
                          "Required value: verbs must contain at least one value");
  }
  if (!rule.non_resource_urls.empty()) {
    if (namespaced) {
      return reader.Problem(node, field + ".nonResourceURLs",
                            "Invalid value: namespaced rules cannot apply to non-resource URLs");
    }
    if (!rule.api_groups.empty() || !rule.resources.empty()) {
      return reader.Problem(
          node, field + ".nonResourceURLs",
          "Invalid value: rules cannot apply to both regular resources and non-resource URLs");
    }
    return rule;
  }
  if (rule.api_groups.empty()) {
    return reader.Problem(node, field + ".apiGroups",
                          "Required value: resource rules must supply at least one api group");
  }
  if (rule.resources.empty()) {
    return reader.Problem(node, field + ".resources",
                          "Required value: resource rules must supply at least one resource");
  }
  return rule;
}

Status ReadRole(const ObjectReader& reader, const YAML::Node& doc, bool namespaced,
                std::vector<PolicyRule>& rules) {
  if (doc["aggregationRule"].IsDefined() && !doc["aggregationRule"].IsNull()) {
    return reader.Problem(doc["aggregationRule"], "aggregationRule",
                          "not supported by the fake API server (the aggregation controller "
                          "fills in such a role's rules)");
  }
  const YAML::Node list = doc["rules"];
  if (!list.IsDefined() || list.IsNull()) return Status::Ok();  // a role granting nothing
  if (!list.IsSequence()) return reader.Problem(list, "rules", "must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    auto rule = ReadRule(reader, list[i], "rules[" + std::to_string(i) + "]", namespaced);
    if (!rule.ok()) return rule.error();
    rules.push_back(std::move(*rule));
  }
  return Status::Ok();
}

// pkg/apis/rbac/validation ValidateRoleBindingSubject, and whether the subject is `user`
// (rbac.appliesToUser: a ServiceAccount without a namespace is in the binding's).
Result<bool> ReadSubject(const ObjectReader& reader, const YAML::Node& node,
                         const std::string& field, const std::string& binding_namespace,
                         const std::string& user, const std::vector<std::string>& groups) {
  if (Status s = reader.CheckKeys(node, field, {"kind", "apiGroup", "name", "namespace"});
      !s.ok()) {
    return s.error();
  }
  auto kind = reader.String(node, "kind", field);
  if (!kind.ok()) return kind.error();
  auto api_group = reader.String(node, "apiGroup", field);
  if (!api_group.ok()) return api_group.error();
  auto name = reader.String(node, "name", field);
  if (!name.ok()) return name.error();
  auto namespace_ = reader.String(node, "namespace", field);
  if (!namespace_.ok()) return namespace_.error();
  if (name->empty()) return reader.Problem(node, field + ".name", "Required value");
  if (*kind == "ServiceAccount") {
    if (!api_group->empty()) {
      return reader.Problem(node, field + ".apiGroup",
                            "Unsupported value: " + Quote(*api_group) + ": supported values: \"\"");
    }
    if (binding_namespace.empty() && namespace_->empty()) {
      return reader.Problem(node, field + ".namespace", "Required value");
    }
    const std::string ns = namespace_->empty() ? binding_namespace : *namespace_;
    return user == kServiceAccountPrefix + ns + ":" + *name;
  }
  if (*kind == "User" || *kind == "Group") {
    if (*api_group != kRbacGroup) {
      return reader.Problem(
          node, field + ".apiGroup",
          "Unsupported value: " + Quote(*api_group) + ": supported values: " + Quote(kRbacGroup));
    }
    return *kind == "User" ? user == *name : Contains(groups, *name);
  }
  return reader.Problem(node, field + ".kind",
                        "Unsupported value: " + Quote(*kind) +
                            ": supported values: \"ServiceAccount\", \"User\", \"Group\"");
}

Result<ParsedBinding> ReadBinding(const ObjectReader& reader, const YAML::Node& doc,
                                  const std::string& namespace_, const std::string& user,
                                  const std::vector<std::string>& groups) {
  ParsedBinding binding;
  binding.namespace_ = namespace_;
  const YAML::Node ref = doc["roleRef"];
  if (!ref.IsDefined() || ref.IsNull()) return reader.Problem(doc, "roleRef", "Required value");
  if (Status s = reader.CheckKeys(ref, "roleRef", {"apiGroup", "kind", "name"}); !s.ok()) {
    return s.error();
  }
  auto api_group = reader.String(ref, "apiGroup", "roleRef");
  if (!api_group.ok()) return api_group.error();
  auto kind = reader.String(ref, "kind", "roleRef");
  if (!kind.ok()) return kind.error();
  auto name = reader.String(ref, "name", "roleRef");
  if (!name.ok()) return name.error();
  if (*api_group != kRbacGroup) {
    return reader.Problem(
        ref, "roleRef.apiGroup",
        "Unsupported value: " + Quote(*api_group) + ": supported values: " + Quote(kRbacGroup));
  }
  const bool kind_ok = *kind == "ClusterRole" || (!namespace_.empty() && *kind == "Role");
  if (!kind_ok) {
    return reader.Problem(
        ref, "roleRef.kind",
        "Unsupported value: " + Quote(*kind) + ": supported values: " +
            (namespace_.empty() ? "\"ClusterRole\"" : "\"Role\", \"ClusterRole\""));
  }
  if (name->empty()) return reader.Problem(ref, "roleRef.name", "Required value");
  binding.role_kind = *kind;
  binding.role_name = *name;
  const YAML::Node subjects = doc["subjects"];
  if (!subjects.IsDefined() || subjects.IsNull()) return binding;  // binds nobody
  if (!subjects.IsSequence()) return reader.Problem(subjects, "subjects", "must be a list");
  for (size_t i = 0; i < subjects.size(); ++i) {
    auto applies = ReadSubject(reader, subjects[i], "subjects[" + std::to_string(i) + "]",
                               namespace_, user, groups);
    if (!applies.ok()) return applies.error();
    binding.applies = binding.applies || *applies;
  }
  return binding;
}

Status ReadDocument(const std::string& source, const YAML::Node& doc, size_t index,
                    const std::string& user, const std::vector<std::string>& groups,
                    ParsedPolicy& policy) {
  ObjectReader reader(source, "document " + std::to_string(index + 1));
  if (doc.IsNull()) return Status::Ok();  // an empty document, as after a trailing "---"
  if (!doc.IsMap()) return reader.Problem(doc, "", "must be a mapping");
  auto kind = reader.String(doc, "kind", "");
  if (!kind.ok()) return kind.error();
  if (kind->empty()) return reader.Problem(doc, "kind", "Required value");
  const bool cluster_role = *kind == "ClusterRole";
  const bool role = *kind == "Role";
  const bool cluster_binding = *kind == "ClusterRoleBinding";
  const bool binding = *kind == "RoleBinding";
  if (!cluster_role && !role && !cluster_binding && !binding) return Status::Ok();
  const bool namespaced = role || binding;

  const YAML::Node metadata = doc["metadata"];
  if (!metadata.IsDefined() || metadata.IsNull()) {
    return reader.Problem(doc, "metadata.name", "Required value");
  }
  if (!metadata.IsMap()) return reader.Problem(metadata, "metadata", "must be a mapping");
  auto name = reader.String(metadata, "name", "metadata");
  if (!name.ok()) return name.error();
  auto namespace_ = reader.String(metadata, "namespace", "metadata");
  if (!namespace_.ok()) return namespace_.error();
  if (name->empty()) return reader.Problem(metadata, "metadata.name", "Required value");
  if (!namespaced) namespace_ = std::string();  // ignored on cluster-scoped objects
  const std::string id = namespace_->empty() ? *name : *namespace_ + "/" + *name;
  reader.Rename(*kind + " " + id);
  if (namespaced && namespace_->empty()) {
    // kubectl would put it into the current context's namespace; a test file must say which.
    return reader.Problem(metadata, "metadata.namespace", "Required value");
  }

  if (Status s = reader.CheckKeys(
          doc, "",
          cluster_role ? std::initializer_list<const char*>{"apiVersion", "kind", "metadata",
                                                            "rules", "aggregationRule"}
          : role ? std::initializer_list<const char*>{"apiVersion", "kind", "metadata", "rules"}
                 : std::initializer_list<const char*>{"apiVersion", "kind", "metadata", "subjects",
                                                      "roleRef"});
      !s.ok()) {
    return s;
  }
  auto api_version = reader.String(doc, "apiVersion", "");
  if (!api_version.ok()) return api_version.error();
  if (*api_version != kRbacApiVersion) {
    return reader.Problem(
        doc, "apiVersion",
        "must be " + std::string(kRbacApiVersion) + ", not " + Quote(*api_version));
  }
  const std::string key = *kind + " " + id;
  if (auto it = policy.lines.find(key); it != policy.lines.end()) {
    return reader.Problem(doc, "",
                          "defined twice (first at line " + std::to_string(it->second) + ")");
  }
  policy.lines[key] = doc.Mark().line + 1;

  if (cluster_role || role) {
    std::vector<PolicyRule>& rules = cluster_role ? policy.cluster_roles[id] : policy.roles[id];
    return ReadRole(reader, doc, role, rules);
  }
  auto parsed = ReadBinding(reader, doc, *namespace_, user, groups);
  if (!parsed.ok()) return parsed.error();
  policy.bindings.push_back(std::move(*parsed));
  return Status::Ok();
}

}  // namespace

RequestAttributes ResolveRequest(const std::string& method, const std::string& path,
                                 const std::multimap<std::string, std::string>& query) {
  // k8s.io/apiserver/pkg/endpoints/request RequestInfoFactory.NewRequestInfo, with the
  // kube-apiserver's prefixes: "api" (groupless) and "apis".
  RequestAttributes info;
  info.path = path;
  info.verb = Lower(method);
  std::vector<std::string> parts = SplitPathAsGo(path);
  if (parts.size() < 3 || (parts[0] != "api" && parts[0] != "apis")) return info;
  const bool groupless = parts[0] == "api";
  parts.erase(parts.begin());
  if (!groupless) {
    if (parts.size() < 3) return info;
    info.api_group = parts[0];
    parts.erase(parts.begin());
  }
  info.resource_request = true;
  info.api_version = parts[0];
  parts.erase(parts.begin());

  if (parts[0] == "proxy" || parts[0] == "watch") {
    // The deprecated /watch/ and /proxy/ path prefixes name the verb themselves.
    info.verb = parts[0];
    parts.erase(parts.begin());
    // The real resolver refuses a bare /watch; nothing then matches a rule.
    if (parts.empty()) return info;
  } else if (method == "POST") {
    info.verb = "create";
  } else if (method == "GET" || method == "HEAD") {
    info.verb = "get";
  } else if (method == "PUT") {
    info.verb = "update";
  } else if (method == "PATCH") {
    info.verb = "patch";
  } else if (method == "DELETE") {
    info.verb = "delete";
  } else {
    info.verb = "";
  }

  if (parts[0] == "namespaces" && parts.size() > 1) {
    info.namespace_ = parts[1];
    // namespaces/<ns>/status and /finalize are the namespace's own subresources.
    if (parts.size() > 2 && parts[2] != "status" && parts[2] != "finalize") {
      parts.erase(parts.begin(), parts.begin() + 2);
    }
  }
  if (parts.size() >= 3 && info.verb != "proxy") info.subresource = parts[2];
  if (parts.size() >= 2) info.name = parts[1];
  info.resource = parts[0];

  if (info.name.empty() && info.verb == "get") {
    info.verb = QueryBool(query, "watch") ? "watch" : "list";
    if (auto it = query.find("fieldSelector"); it != query.end()) {
      info.name = ExactNameOf(it->second);
    }
  }
  if (info.name.empty() && info.verb == "delete") info.verb = "deletecollection";
  return info;
}

bool RuleAllows(const PolicyRule& rule, const RequestAttributes& request) {
  if (!request.resource_request) {
    return VerbMatches(rule, request.verb) && NonResourceUrlMatches(rule, request.path);
  }
  const std::string combined =
      request.subresource.empty() ? request.resource : request.resource + "/" + request.subresource;
  return VerbMatches(rule, request.verb) && ApiGroupMatches(rule, request.api_group) &&
         ResourceMatches(rule, combined, request.subresource) &&
         ResourceNameMatches(rule, request.name);
}

Result<RbacAuthorizer> RbacAuthorizer::Parse(const std::string& text, const std::string& source,
                                             const std::string& user) {
  RbacAuthorizer authorizer;
  authorizer.user_ = user;
  authorizer.groups_ = GroupsOf(user);
  ParsedPolicy policy;
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(text);
    for (size_t i = 0; i < documents.size(); ++i) {
      if (Status s = ReadDocument(source, documents[i], i, user, authorizer.groups_, policy);
          !s.ok()) {
        return s.error();
      }
    }
  } catch (const YAML::Exception& e) {
    std::string where = source;
    if (e.mark.line >= 0) where += ":" + std::to_string(e.mark.line + 1);
    return MakeError(ErrorKind::kInvalidArgument, "invalid RBAC file " + where + ": " + e.msg);
  }
  authorizer.cluster_roles_ = std::move(policy.cluster_roles);
  authorizer.roles_ = std::move(policy.roles);
  for (const ParsedBinding& binding : policy.bindings) {
    if (!binding.applies) continue;
    authorizer.bindings_.push_back({binding.namespace_, {binding.role_kind, binding.role_name}});
  }
  return authorizer;
}

Result<RbacAuthorizer> RbacAuthorizer::Load(const std::string& path, const std::string& user) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.error().Wrap("cannot read RBAC file " + path);
  return Parse(*text, path, user);
}

RbacDecision RbacAuthorizer::Authorize(const RequestAttributes& request) const {
  for (const PolicyRule& rule : DefaultRules()) {
    if (RuleAllows(rule, request)) return {true, ""};
  }
  // plugin/pkg/auth/authorizer/rbac: the cluster role bindings, then the role bindings of the
  // request's namespace; a binding whose role is missing is remembered for the denial.
  std::vector<std::string> errors;
  for (const Binding& binding : bindings_) {
    if (!binding.namespace_.empty() && binding.namespace_ != request.namespace_) continue;
    const std::vector<PolicyRule>* rules = nullptr;
    if (binding.role.kind == "ClusterRole") {
      auto it = cluster_roles_.find(binding.role.name);
      if (it != cluster_roles_.end()) rules = &it->second;
    } else {
      auto it = roles_.find(binding.namespace_ + "/" + binding.role.name);
      if (it != roles_.end()) rules = &it->second;
    }
    if (rules == nullptr) {
      errors.push_back(Lower(binding.role.kind) + ".rbac.authorization.k8s.io " +
                       Quote(binding.role.name) + " not found");
      continue;
    }
    for (const PolicyRule& rule : *rules) {
      if (RuleAllows(rule, request)) return {true, ""};
    }
  }
  return {false, errors.empty() ? "" : "RBAC: " + Aggregate(errors)};
}

json ForbiddenStatus(const RequestAttributes& request, const std::string& user,
                     const std::string& reason) {
  // responsewriters.Forbidden's message, inside apierrors.NewForbidden's.
  std::string message;
  if (!request.resource_request) {
    message = "User " + Quote(user) + " cannot " + request.verb + " path " + Quote(request.path);
  } else {
    const std::string resource = request.subresource.empty()
                                     ? request.resource
                                     : request.resource + "/" + request.subresource;
    message = "User " + Quote(user) + " cannot " + request.verb + " resource " + Quote(resource) +
              " in API group " + Quote(request.api_group) +
              (request.namespace_.empty() ? " at the cluster scope"
                                          : " in the namespace " + Quote(request.namespace_));
  }
  if (!reason.empty()) message += ": " + reason;
  const std::string qualified =
      request.api_group.empty() ? request.resource : request.resource + "." + request.api_group;
  if (qualified.empty()) {
    message = "forbidden: " + message;
  } else if (request.name.empty()) {
    message = qualified + " is forbidden: " + message;
  } else {
    message = qualified + " " + Quote(request.name) + " is forbidden: " + message;
  }
  // StatusDetails' fields are all omitempty; a non-resource denial has an empty object.
  json details = json::object();
  if (!request.name.empty()) details["name"] = request.name;
  if (!request.api_group.empty()) details["group"] = request.api_group;
  if (!request.resource.empty()) details["kind"] = request.resource;
  return {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
          {"status", "Failure"}, {"message", message}, {"reason", "Forbidden"},
          {"details", details},  {"code", 403}};
}

std::string ShippedRbacFile() { return VFIO_DRA_SOURCE_DIR "/deploy/daemonset/rbac.yaml"; }

}  // namespace vfio_dra::testing
