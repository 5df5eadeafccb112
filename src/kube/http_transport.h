// HttpTransport: the edge between the API client and the network. The client builds requests
// against paths; a transport knows the server, TLS and how bytes move. Tests can substitute a
// transport; production uses HttplibTransport.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <stop_token>
#include <string>
#include <string_view>

#include "base/result.h"

namespace vfio_dra::kube {

struct HttpRequest {
  std::string method = "GET";
  std::string path_and_query;  // e.g. "/apis/resource.k8s.io/v1/resourceslices?watch=1"
  std::map<std::string, std::string> headers;
  std::string body;
  // Whole-request timeout; zero means none (watch streams rely on server timeouts and `stop`).
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;

  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// Receives body bytes of a streaming response as they arrive; returning false aborts the stream.
using BodyChunkHandler = std::function<bool(std::string_view chunk)>;

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // Sends one request and returns the complete response. Transport failures (refused, TLS,
  // timeout) come back as kUnavailable / kDeadlineExceeded errors; HTTP error statuses are
  // responses, not errors.
  virtual Result<HttpResponse> Send(const HttpRequest& request) = 0;
  // Sends one request and streams the body into `on_chunk`. The returned response has the status
  // and headers and, for non-2xx statuses, the body. A stop requested on `stop` ends the transfer
  // promptly (an idle stream must wake for it, not poll for it).
  virtual Result<HttpResponse> Stream(const HttpRequest& request, const BodyChunkHandler& on_chunk,
                                      std::stop_token stop) = 0;
};

}  // namespace vfio_dra::kube
