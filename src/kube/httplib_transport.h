// HttplibTransport: HttpTransport over cpp-httplib and OpenSSL with the TLS settings of a
// ClientConfig (server CA, optional client certificate). Verification, of the chain and of the
// server's name or IP, is on unless the config says insecure-skip-tls-verify. Clients are pooled
// so that connections are kept alive; each stream (a watch) has a client of its own that a stop
// request shuts down at once, whatever it is doing.
// The pool keeps as many idle connections as a burst of pods starting at once used (up to
// kMaxIdleClients), and closes those idle for kIdleClientTimeout when the pool is next used or a
// stream starts (a watch restarts every few minutes on a node that makes no other call). It
// kept eight before: each burst of 32 prepares then opened 24 connections, a TLS handshake each,
// which raised the daemon's CPU per prepare from about 1.0 to 1.3 ms and the p99 at 32 at once
// from about 27 to 44 ms (prepare_bench, data dir on tmpfs).
// Why not libcurl: the metrics endpoint links cpp-httplib already, and Debian's libcurl loads
// some twenty libraries a node agent never uses (GnuTLS, Kerberos, LDAP, RTMP, SSH): about 3 MiB
// of every idle daemon (docs/benchmarks.md).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "kube/client_config.h"
#include "kube/http_transport.h"

namespace httplib {
class ClientImpl;
}

namespace vfio_dra::kube {

// Where a ClientConfig's server is: "https://host:port/prefix" in parts.
struct ServerEndpoint {
  bool tls = true;
  std::string host;  // without brackets for IPv6
  int port = 443;
  std::string path_prefix;  // "" or "/prefix", prepended to every request path
  std::string host_header;  // "host", "host:port" or "[v6]:port"

  static Result<ServerEndpoint> Parse(const std::string& server, const std::string& source);
};

// The proxy settings of the environment (https_proxy, http_proxy, no_proxy, either case).
struct ProxyEnvironment {
  std::string https_proxy;
  std::string http_proxy;
  std::string no_proxy;

  static ProxyEnvironment FromProcess();
};

// Whether `no_proxy` (comma-separated: "*", host names, ".suffix" or suffix domains, IPv4
// addresses and CIDR ranges, optionally with ":port") exempts `host`.
bool NoProxyCovers(const std::string& no_proxy, const std::string& host);

// Refuses what the transport would get wrong silently: a proxy in the environment that would
// apply to `endpoint` (the plugin connects directly, never through a proxy), or a bearer token
// over plain http to anything but loopback.
Status CheckConnectionPolicy(const ClientConfig& config, const ServerEndpoint& endpoint,
                             const ProxyEnvironment& proxies);

class HttplibTransport final : public HttpTransport {
 public:
  static constexpr size_t kMaxIdleClients = 64;
  static constexpr std::chrono::seconds kIdleClientTimeout{90};

  // Validates the TLS material of `config` (readable files, PEM that parses) and returns a
  // transport; errors name the kubeconfig or service account it came from.
  static Result<std::unique_ptr<HttplibTransport>> Create(const ClientConfig& config,
                                                          std::string user_agent,
                                                          const Clock& clock = RealClock());
  ~HttplibTransport() override;
  HttplibTransport(const HttplibTransport&) = delete;
  HttplibTransport& operator=(const HttplibTransport&) = delete;

  Result<HttpResponse> Send(const HttpRequest& request) override;
  Result<HttpResponse> Stream(const HttpRequest& request, const BodyChunkHandler& on_chunk,
                              std::stop_token stop) override;

 private:
  struct TlsMaterial;
  struct IdleClient {
    std::unique_ptr<httplib::ClientImpl> client;
    Clock::TimePoint since;  // when it was last given back
  };
  HttplibTransport(ClientConfig config, ServerEndpoint endpoint, std::unique_ptr<TlsMaterial> tls,
                   std::string user_agent, const Clock& clock);
  std::unique_ptr<httplib::ClientImpl> NewClient() const;
  std::unique_ptr<httplib::ClientImpl> TakeClient();
  void ReturnClient(std::unique_ptr<httplib::ClientImpl> client);
  // Takes the clients idle for kIdleClientTimeout out of the pool and runs `change` on the rest,
  // under mu_; the clients taken out close after mu_ is let go.
  void ChangePool(const std::function<void(std::vector<IdleClient>&)>& change);
  Result<HttpResponse> Perform(httplib::ClientImpl& client, const HttpRequest& request,
                               const BodyChunkHandler* on_chunk, const std::stop_token* stop,
                               bool* connection_usable);

  const ClientConfig config_;
  const ServerEndpoint endpoint_;
  const std::unique_ptr<TlsMaterial> tls_;
  const std::string user_agent_;
  const Clock* clock_;
  std::mutex mu_;
  std::vector<IdleClient> idle_;  // least recently used first
};

}  // namespace vfio_dra::kube
