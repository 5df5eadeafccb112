#include "kube/api_client.h"

#include <fmt/format.h>

#include <cctype>
#include <iterator>

namespace vfio_dra::kube {
namespace {

bool IsRetryableStatus(int status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

ErrorKind KindForStatus(int status, const std::string& reason) {
  switch (status) {
    case 400:
      return ErrorKind::kInvalidArgument;
    case 401:
      return ErrorKind::kUnauthenticated;
    case 403:
      return ErrorKind::kPermissionDenied;
    case 404:
      return ErrorKind::kNotFound;
    case 409:
      return reason == "AlreadyExists" ? ErrorKind::kAlreadyExists : ErrorKind::kConflict;
    case 410:
      return ErrorKind::kGone;
    case 422:
      return ErrorKind::kInvalidArgument;
    case 429:
    case 500:
    case 502:
    case 503:
    case 504:
      return ErrorKind::kUnavailable;
    default:
      return ErrorKind::kInternal;
  }
}

}  // namespace

std::string UrlEncode(const std::string& value) {
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      fmt::format_to(std::back_inserter(out), "%{:02X}", c);
    }
  }
  return out;
}

ApiStatus ParseApiStatus(const ApiResponse& response) {
  ApiStatus status;
  status.code = response.status;
  const auto& body = response.body;
  if (body.is_object() && body.value("kind", "") == "Status") {
    status.reason = body.value("reason", "");
    status.message = body.value("message", "");
    if (body.contains("code") && body["code"].is_number_integer()) status.code = body["code"];
    if (body.contains("details") && body["details"].is_object()) {
      const auto& details = body["details"];
      status.details_kind = details.value("kind", "");
      status.details_name = details.value("name", "");
      if (details.contains("retryAfterSeconds") && details["retryAfterSeconds"].is_number()) {
        status.retry_after_seconds = details["retryAfterSeconds"];
      }
    }
  } else {
    status.message = response.raw_body.substr(0, 512);
    while (!status.message.empty() && status.message.back() == '\n') status.message.pop_back();
  }
  return status;
}

Error ApiErrorFromResponse(const std::string& method, const std::string& path,
                           const ApiResponse& response) {
  const ApiStatus status = ParseApiStatus(response);
  std::string message = method + " " + path + ": HTTP " + std::to_string(response.status);
  if (!status.reason.empty()) message += " " + status.reason;
  if (!status.message.empty()) message += ": " + status.message;
  return MakeError(KindForStatus(response.status, status.reason), message);
}

void AddRbacHint(Error& error, const ApiResponse& response, const std::string& needed) {
  if (response.status != 403) return;
  error.message +=
      " (the plugin's ClusterRole needs " + needed + "; see deploy/daemonset/rbac.yaml)";
}

ApiClient::ApiClient(HttpTransport& transport, TokenSource& tokens, Clock& clock, Logger log,
                     ApiClientOptions options)
    : transport_(transport),
      tokens_(tokens),
      clock_(clock),
      log_(std::move(log)),
      options_(options),
      limiter_(options.qps, options.burst, clock) {}

Result<HttpRequest> ApiClient::BuildRequest(const std::string& method, const std::string& path,
                                            const nlohmann::json* body, const char* content_type,
                                            bool streaming) {
  HttpRequest request;
  request.method = method;
  request.path_and_query = path;
  request.headers["Accept"] = "application/json";
  if (body != nullptr) {
    request.body = body->dump();
    request.headers["Content-Type"] = content_type != nullptr ? content_type : kJsonContentType;
  }
  request.timeout = streaming ? std::chrono::milliseconds(0) : options_.request_timeout;
  auto token = tokens_.Token();
  if (!token.ok()) return token.error();
  if (!token->empty()) request.headers["Authorization"] = "Bearer " + *token;
  return request;
}

void ApiClient::LogWarnings(const HttpResponse& response, const std::string& path) const {
  const std::string warning = response.Header("warning");
  if (!warning.empty()) log_.Warn("API server warning", {{"path", path}, {"warning", warning}});
}

Result<ApiResponse> ApiClient::Call(const std::string& method, const std::string& path,
                                    const nlohmann::json* body, Deadline deadline,
                                    const char* content_type) {
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  bool reauthenticated = false;
  const auto out_of_time = [&](int attempts, const std::string& last) {
    return MakeError(ErrorKind::kDeadlineExceeded,
                     method + " " + path + ": gave up after " + std::to_string(attempts) +
                         " attempt(s) because the caller's deadline is reached" +
                         (last.empty() ? std::string() : " (last: " + last + ")"));
  };
  for (int attempt = 0;; ++attempt) {
    limiter_.Acquire();
    auto request = BuildRequest(method, path, body, content_type, false);
    if (!request.ok()) return request.error();
    if (deadline.IsSet()) {
      const auto left = deadline.RemainingOr(request->timeout, clock_.Now());
      if (left.count() <= 0) return out_of_time(attempt, "");
      request->timeout = left;
    }
    auto response = transport_.Send(*request);
    // Only a retry draws from the backoff (its generator is seeded on first use).
    std::chrono::milliseconds delay{0};
    if (response.ok()) {
      LogWarnings(*response, path);
      if (response->status == 401 && tokens_.HasFile() && !reauthenticated) {
        // The token may have been rotated on disk since we read it: re-read and retry once.
        tokens_.Invalidate();
        reauthenticated = true;
        continue;
      }
      ApiResponse api;
      api.status = response->status;
      api.raw_body = std::move(response->body);
      api.body = nlohmann::json::parse(api.raw_body, nullptr, /*allow_exceptions=*/false);
      if (api.body.is_discarded()) api.body = nullptr;
      if (!IsRetryableStatus(api.status) || attempt >= options_.max_retries) return api;
      delay = backoff.Next();
      // Honour Retry-After (header, else the Status detail), capped so a bad value cannot stall us.
      int retry_after = 0;
      const std::string header = response->Header("retry-after");
      if (!header.empty()) retry_after = std::atoi(header.c_str());
      if (retry_after <= 0) retry_after = ParseApiStatus(api).retry_after_seconds;
      if (retry_after > 0) {
        delay = std::min(std::chrono::milliseconds(retry_after * 1000LL), options_.max_retry_after);
      }
      log_.Debug(2, "retrying API request",
                 {{"method", method},
                  {"path", path},
                  {"status", std::to_string(api.status)},
                  {"delay_ms", std::to_string(delay.count())}});
    } else {
      if (attempt >= options_.max_retries) {
        return response.error().Wrap("API request failed after " + std::to_string(attempt + 1) +
                                     " attempts");
      }
      delay = backoff.Next();
      log_.Debug(2, "retrying API request after transport error",
                 {{"method", method}, {"path", path}, {"error", response.error().message}});
    }
    if (deadline.IsSet() && clock_.Now() + delay >= deadline.at()) {
      return out_of_time(attempt + 1, response.ok() ? "HTTP " + std::to_string(response->status)
                                                    : response.error().message);
    }
    clock_.SleepUntil(clock_.Now() + delay);
  }
}

Result<nlohmann::json> ApiClient::Get(const std::string& path) {
  auto response = Call("GET", path);
  if (!response.ok()) return response.error();
  if (response->status != 200) return ApiErrorFromResponse("GET", path, *response);
  return std::move(response->body);
}

Result<nlohmann::json> ApiClient::Create(const std::string& path, const nlohmann::json& object) {
  auto response = Call("POST", path, &object);
  if (!response.ok()) return response.error();
  if (response->status != 201 && response->status != 200) {
    return ApiErrorFromResponse("POST", path, *response);
  }
  return std::move(response->body);
}

Result<nlohmann::json> ApiClient::Update(const std::string& path, const nlohmann::json& object) {
  auto response = Call("PUT", path, &object);
  if (!response.ok()) return response.error();
  if (response->status != 200) return ApiErrorFromResponse("PUT", path, *response);
  return std::move(response->body);
}

Status ApiClient::Delete(const std::string& path, const std::string& uid,
                         const std::string& resource_version) {
  nlohmann::json options = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (!uid.empty() || !resource_version.empty()) {
    nlohmann::json preconditions = nlohmann::json::object();
    if (!uid.empty()) preconditions["uid"] = uid;
    if (!resource_version.empty()) preconditions["resourceVersion"] = resource_version;
    options["preconditions"] = preconditions;
  }
  auto response = Call("DELETE", path, &options);
  if (!response.ok()) return response.error();
  if (response->status != 200 && response->status != 202) {
    return ApiErrorFromResponse("DELETE", path, *response);
  }
  return Status::Ok();
}

Status ApiClient::Watch(const std::string& path_and_query, const WatchHandler& on_event,
                        std::stop_token stop) {
  limiter_.Acquire();
  auto request = BuildRequest("GET", path_and_query, nullptr, nullptr, true);
  if (!request.ok()) return request.error();
  std::string pending;
  Status handler_status;
  auto on_chunk = [&](std::string_view chunk) {
    pending.append(chunk);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(pending.data() + start, nl - start);
      if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
      auto parsed = nlohmann::json::parse(line, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("type") ||
          !parsed["type"].is_string()) {
        handler_status =
            MakeError(ErrorKind::kInternal, "malformed watch event from " + path_and_query + ": " +
                                                std::string(line.substr(0, 200)));
        return false;
      }
      WatchEvent event{parsed["type"].get<std::string>(), std::move(parsed["object"])};
      if (event.type == "ERROR") {
        ApiResponse as_response;
        as_response.body = event.object;
        as_response.status = event.object.is_object() ? event.object.value("code", 500) : 500;
        handler_status = ApiErrorFromResponse("WATCH", path_and_query, as_response);
        return false;
      }
      if (!on_event(event)) return false;
    }
    pending.erase(0, start);
    if (pending.size() > (16u << 20)) {
      handler_status =
          MakeError(ErrorKind::kInternal, "watch event larger than 16 MiB from " + path_and_query);
      return false;
    }
    return true;
  };
  auto response = transport_.Stream(*request, on_chunk, std::move(stop));
  if (!response.ok()) return response.error().Wrap("watch " + path_and_query);
  if (response->status == 401) tokens_.Invalidate();
  if (response->status != 200) {
    ApiResponse api;
    api.status = response->status;
    api.raw_body = response->body;
    api.body = nlohmann::json::parse(api.raw_body, nullptr, false);
    if (api.body.is_discarded()) api.body = nullptr;
    return ApiErrorFromResponse("WATCH", path_and_query, api);
  }
  if (!handler_status.ok()) return handler_status;
  return Status::Ok();
}

}  // namespace vfio_dra::kube
