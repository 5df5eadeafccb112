// CurlTransport: HttpTransport over libcurl with the TLS settings of a ClientConfig (server CA,
// optional client certificate). Verification is on unless the config says
// insecure-skip-tls-verify. Easy handles are pooled so that connections are kept alive.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "kube/client_config.h"
#include "kube/http_transport.h"

namespace vfio_dra::kube {

class CurlTransport final : public HttpTransport {
 public:
  // Validates the TLS material of `config` (readable files) and returns a transport.
  static Result<std::unique_ptr<CurlTransport>> Create(const ClientConfig& config,
                                                       std::string user_agent);
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  Result<HttpResponse> Send(const HttpRequest& request) override;
  Result<HttpResponse> Stream(const HttpRequest& request, const BodyChunkHandler& on_chunk,
                              std::stop_token stop) override;

 private:
  CurlTransport(ClientConfig config, std::string user_agent);
  void* TakeHandle();
  void ReturnHandle(void* handle);
  Result<HttpResponse> Perform(const HttpRequest& request, const BodyChunkHandler* on_chunk,
                               const std::stop_token* stop);

  const ClientConfig config_;
  const std::string user_agent_;
  std::mutex mu_;
  std::vector<void*> idle_handles_;
};

}  // namespace vfio_dra::kube
