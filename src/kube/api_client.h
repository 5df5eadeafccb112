// ApiClient: JSON REST calls against the Kubernetes API server with what every well-behaved
// client does: bearer auth with token rotation, a client-side rate limit, retries with jittered
// backoff on 429 (honouring Retry-After), 5xx and connection errors, Status messages carried
// into errors, warnings logged, and watches as a first-class streaming call.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <string>

#include "base/clock.h"
#include "base/deadline.h"
#include "base/log.h"
#include "base/result.h"
#include "kube/backoff.h"
#include "kube/http_transport.h"
#include "kube/rate_limiter.h"
#include "kube/token_source.h"

namespace vfio_dra::kube {

struct ApiClientOptions {
  double qps = 5.0;
  int burst = 10;
  int max_retries = 5;
  std::chrono::milliseconds initial_backoff{250};
  std::chrono::milliseconds max_backoff{30000};
  std::chrono::milliseconds max_retry_after{30000};
  std::chrono::milliseconds request_timeout{30000};
};

// A response after retries: the HTTP status with the body parsed as JSON where it is JSON.
struct ApiResponse {
  int status = 0;
  nlohmann::json body;  // null when the body was not JSON
  std::string raw_body;
};

// The parts of a metav1.Status error body that callers branch on.
struct ApiStatus {
  int code = 0;
  std::string reason;   // e.g. "NotFound", "Conflict", "Invalid", "Expired"
  std::string message;  // the server's human-readable text
  std::string details_kind;
  std::string details_name;
  int retry_after_seconds = 0;
};

// Parses a Status body; falls back to the HTTP status and raw text when it is not one.
ApiStatus ParseApiStatus(const ApiResponse& response);

// Maps an HTTP error response to an Error whose message names the request and the server's reason.
Error ApiErrorFromResponse(const std::string& method, const std::string& path,
                           const ApiResponse& response);
// On a 403, says which right the plugin's ClusterRole lacks ("get on pods"), so that an admin
// who trimmed deploy/daemonset/rbac.yaml sees what to put back.
void AddRbacHint(Error& error, const ApiResponse& response, const std::string& needed);

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
  nlohmann::json object;
};

// Request body types. Server-side apply needs its own: the server tells an apply from a merge patch
// by this header alone (JSON is valid YAML, so an apply body may be JSON).
inline constexpr const char* kJsonContentType = "application/json";
inline constexpr const char* kApplyPatchContentType = "application/apply-patch+yaml";

// Called for each watch event; returning false ends the watch.
using WatchHandler = std::function<bool(const WatchEvent& event)>;

class ApiClient {
 public:
  ApiClient(HttpTransport& transport, TokenSource& tokens, Clock& clock, Logger log,
            ApiClientOptions options = {});

  // One request with retries. HTTP error statuses come back as responses (callers decide);
  // only transport failures that outlast the retries are errors. With a `deadline`, each attempt
  // is bounded by it and no retry is started that could not finish before it (kDeadlineExceeded).
  // A `body` is sent as JSON with `content_type` (e.g. kApplyPatchContentType for PATCH).
  Result<ApiResponse> Call(const std::string& method, const std::string& path,
                           const nlohmann::json* body = nullptr, Deadline deadline = {},
                           const char* content_type = kJsonContentType);

  // Convenience wrappers that turn any non-2xx status into an Error.
  Result<nlohmann::json> Get(const std::string& path);
  Result<nlohmann::json> Create(const std::string& path, const nlohmann::json& object);
  Result<nlohmann::json> Update(const std::string& path, const nlohmann::json& object);
  // DELETE with optional preconditions (uid/resourceVersion); NotFound is reported as an error of
  // kind kNotFound so callers can treat it as success where that is right.
  Status Delete(const std::string& path, const std::string& uid = {},
                const std::string& resource_version = {});

  // Streams a watch (path must already carry ?watch=1 and its selectors). Returns Ok when the
  // server closed the stream normally or the handler/stop ended it, kGone on 410/Expired (the
  // caller must relist), or another error.
  Status Watch(const std::string& path_and_query, const WatchHandler& on_event,
               std::stop_token stop);

  const Logger& log() const { return log_; }

 private:
  Result<HttpRequest> BuildRequest(const std::string& method, const std::string& path,
                                   const nlohmann::json* body, const char* content_type,
                                   bool streaming);
  void LogWarnings(const HttpResponse& response, const std::string& path) const;

  HttpTransport& transport_;
  TokenSource& tokens_;
  Clock& clock_;
  Logger log_;
  ApiClientOptions options_;
  RateLimiter limiter_;
};

// Percent-encodes a query parameter value (field selectors contain '=' and ',').
std::string UrlEncode(const std::string& value);

}  // namespace vfio_dra::kube
