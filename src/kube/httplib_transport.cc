#include "kube/httplib_transport.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <iterator>

#include "base/file_io.h"

namespace vfio_dra::kube {
namespace {

constexpr auto kConnectTimeout = std::chrono::seconds(10);
// A stream has no overall timeout (the server ends a watch after its timeoutSeconds); this only
// bounds a silence far longer than any watch the plugin opens, behind the kernel's keepalives.
constexpr auto kStreamReadTimeout = std::chrono::minutes(30);
constexpr size_t kMaxBodyBytes = size_t{64} << 20;

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string OpenSslErrors() {
  std::string text;
  while (const unsigned long code = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof(buffer));
    if (!text.empty()) text += "; ";
    text += buffer;
  }
  return text.empty() ? "no detail from OpenSSL" : text;
}

struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};

Result<std::vector<std::unique_ptr<X509, X509Free>>> ParseCertificates(const std::string& pem,
                                                                       const std::string& what) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  std::vector<std::unique_ptr<X509, X509Free>> certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();  // the loop ends on "no start line"
  if (certs.empty()) {
    return MakeError(ErrorKind::kInvalidArgument, what + " holds no PEM certificate");
  }
  return certs;
}

// The PEM text of `data` if set, else of `file`; empty when neither is.
Result<std::string> PemOf(const std::string& data, const std::string& file) {
  if (!data.empty()) return data;
  if (file.empty()) return std::string();
  return ReadFileToString(file, 1 << 20);
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

bool InCidr(const std::string& host, const std::string& cidr) {
  const size_t slash = cidr.find('/');
  in_addr host_addr{};
  in_addr net_addr{};
  if (inet_pton(AF_INET, host.c_str(), &host_addr) != 1 ||
      inet_pton(AF_INET, cidr.substr(0, slash).c_str(), &net_addr) != 1) {
    return false;
  }
  const int bits = std::atoi(cidr.c_str() + slash + 1);
  if (bits < 0 || bits > 32) return false;
  const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
  return (ntohl(host_addr.s_addr) & mask) == (ntohl(net_addr.s_addr) & mask);
}

}  // namespace

// The parsed TLS settings, shared by every client the transport makes.
struct HttplibTransport::TlsMaterial {
  std::vector<std::unique_ptr<X509, X509Free>> ca;  // empty: the system's trust store
  std::unique_ptr<X509, X509Free> client_cert;
  std::unique_ptr<EVP_PKEY, PkeyFree> client_key;
};

Result<ServerEndpoint> ServerEndpoint::Parse(const std::string& server, const std::string& source) {
  ServerEndpoint endpoint;
  std::string rest;
  if (server.rfind("https://", 0) == 0) {
    rest = server.substr(8);
  } else if (server.rfind("http://", 0) == 0) {
    endpoint.tls = false;
    endpoint.port = 80;
    rest = server.substr(7);
  } else {
    return MakeError(ErrorKind::kInvalidArgument, "server \"" + server + "\" in " + source +
                                                      " is not an https:// or http:// URL");
  }
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) endpoint.path_prefix = rest.substr(slash);
  while (!endpoint.path_prefix.empty() && endpoint.path_prefix.back() == '/') {
    endpoint.path_prefix.pop_back();
  }
  std::string port_text;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) {
      return MakeError(ErrorKind::kInvalidArgument,
                       "server \"" + server + "\" in " + source + ": unclosed '[' in the host");
    }
    endpoint.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') {
        return MakeError(ErrorKind::kInvalidArgument,
                         "server \"" + server + "\" in " + source + ": junk after the IPv6 host");
      }
      port_text = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.find(':');
    endpoint.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  if (endpoint.host.empty()) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "server \"" + server + "\" in " + source + " has no host");
  }
  if (!port_text.empty()) {
    const bool digits =
        port_text.size() <= 5 && std::all_of(port_text.begin(), port_text.end(),
                                             [](unsigned char c) { return std::isdigit(c) != 0; });
    const int port = digits ? std::atoi(port_text.c_str()) : 0;
    if (port < 1 || port > 65535) {
      return MakeError(ErrorKind::kInvalidArgument, "server \"" + server + "\" in " + source +
                                                        ": port \"" + port_text +
                                                        "\" is not 1..65535");
    }
    endpoint.port = port;
  }
  const bool v6 = endpoint.host.find(':') != std::string::npos;
  const std::string host = v6 ? "[" + endpoint.host + "]" : endpoint.host;
  const bool default_port = endpoint.port == (endpoint.tls ? 443 : 80);
  endpoint.host_header = default_port ? host : host + ":" + std::to_string(endpoint.port);
  return endpoint;
}

ProxyEnvironment ProxyEnvironment::FromProcess() {
  ProxyEnvironment env;
  for (const char* name : {"https_proxy", "HTTPS_PROXY"}) {
    if (env.https_proxy.empty()) env.https_proxy = Getenv(name);
  }
  for (const char* name : {"http_proxy", "HTTP_PROXY"}) {
    if (env.http_proxy.empty()) env.http_proxy = Getenv(name);
  }
  for (const char* name : {"no_proxy", "NO_PROXY"}) {
    if (env.no_proxy.empty()) env.no_proxy = Getenv(name);
  }
  return env;
}

bool NoProxyCovers(const std::string& no_proxy, const std::string& host) {
  const std::string wanted = Lower(host);
  size_t start = 0;
  while (start <= no_proxy.size()) {
    size_t end = no_proxy.find(',', start);
    if (end == std::string::npos) end = no_proxy.size();
    std::string entry = no_proxy.substr(start, end - start);
    start = end + 1;
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (entry.empty()) continue;
    if (entry == "*") return true;
    if (entry.front() == '[') {  // [v6] or [v6]:port
      entry = entry.substr(1, entry.find(']') - 1);
    } else if (std::count(entry.begin(), entry.end(), ':') == 1) {
      entry = entry.substr(0, entry.find(':'));
    }
    entry = Lower(entry);
    if (entry.find('/') != std::string::npos) {
      if (InCidr(wanted, entry)) return true;
      continue;
    }
    if (entry.front() == '.') entry.erase(0, 1);
    if (wanted == entry) return true;
    if (wanted.size() > entry.size() &&
        wanted.compare(wanted.size() - entry.size() - 1, entry.size() + 1, "." + entry) == 0) {
      return true;
    }
  }
  return false;
}

Status CheckConnectionPolicy(const ClientConfig& config, const ServerEndpoint& endpoint,
                             const ProxyEnvironment& proxies) {
  if (!endpoint.tls && (!config.token.empty() || !config.token_file.empty()) &&
      !IsLoopback(endpoint.host)) {
    // Allowed for loopback test servers only: never send a bearer token in clear text elsewhere.
    return MakeError(ErrorKind::kInvalidArgument,
                     "refusing to send a bearer token over plain http to " + config.server +
                         " (from " + config.source + "); use https");
  }
  const std::string& proxy = endpoint.tls ? proxies.https_proxy : proxies.http_proxy;
  if (!proxy.empty() && !NoProxyCovers(proxies.no_proxy, endpoint.host)) {
    return MakeError(
        ErrorKind::kInvalidArgument,
        std::string(endpoint.tls ? "https_proxy" : "http_proxy") + " is set (" + proxy +
            ") and no_proxy does not exempt the API server " + endpoint.host +
            ", but the plugin connects to the API server directly, never through a proxy: add " +
            endpoint.host + " to NO_PROXY in the plugin's environment, or unset the proxy there");
  }
  return Status::Ok();
}

Result<std::unique_ptr<HttplibTransport>> HttplibTransport::Create(const ClientConfig& config,
                                                                   std::string user_agent,
                                                                   const Clock& clock) {
  auto endpoint = ServerEndpoint::Parse(config.server, config.source);
  if (!endpoint.ok()) return endpoint.error();
  if (Status s = CheckConnectionPolicy(config, *endpoint, ProxyEnvironment::FromProcess());
      !s.ok()) {
    return s.error();
  }
  auto tls = std::make_unique<TlsMaterial>();
  const std::string context = "API client TLS settings from " + config.source;
  auto ca = PemOf(config.ca_data, config.ca_file);
  if (!ca.ok()) return ca.error().Wrap(context);
  if (!ca->empty()) {
    auto certs = ParseCertificates(*ca, "the certificate authority");
    if (!certs.ok()) return certs.error().Wrap(context);
    tls->ca = std::move(*certs);
  }
  auto cert = PemOf(config.client_cert_data, config.client_cert_file);
  if (!cert.ok()) return cert.error().Wrap(context);
  auto key = PemOf(config.client_key_data, config.client_key_file);
  if (!key.ok()) return key.error().Wrap(context);
  if (cert->empty() != key->empty()) {
    return MakeError(ErrorKind::kInvalidArgument,
                     context + ": a client certificate needs its key and a key its certificate");
  }
  if (!cert->empty()) {
    auto certs = ParseCertificates(*cert, "the client certificate");
    if (!certs.ok()) return certs.error().Wrap(context);
    tls->client_cert = std::move(certs->front());
    std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(key->data(), static_cast<int>(key->size())));
    tls->client_key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (!tls->client_key) {
      return MakeError(
          ErrorKind::kInvalidArgument,
          context + ": the client key is not a PEM private key (" + OpenSslErrors() + ")");
    }
    if (X509_check_private_key(tls->client_cert.get(), tls->client_key.get()) != 1) {
      ERR_clear_error();
      return MakeError(ErrorKind::kInvalidArgument,
                       context + ": the client key does not belong to the client certificate");
    }
  }
  return std::unique_ptr<HttplibTransport>(new HttplibTransport(
      config, std::move(*endpoint), std::move(tls), std::move(user_agent), clock));
}

HttplibTransport::HttplibTransport(ClientConfig config, ServerEndpoint endpoint,
                                   std::unique_ptr<TlsMaterial> tls, std::string user_agent,
                                   const Clock& clock)
    : config_(std::move(config)),
      endpoint_(std::move(endpoint)),
      tls_(std::move(tls)),
      user_agent_(std::move(user_agent)),
      clock_(&clock) {}

HttplibTransport::~HttplibTransport() = default;

std::unique_ptr<httplib::ClientImpl> HttplibTransport::NewClient() const {
  std::unique_ptr<httplib::ClientImpl> client;
  if (!endpoint_.tls) {
    client = std::make_unique<httplib::ClientImpl>(endpoint_.host, endpoint_.port);
  } else {
    std::unique_ptr<httplib::SSLClient> ssl;
    if (tls_->client_cert) {
      // SSL_CTX_use_certificate and _PrivateKey take references of their own.
      ssl = std::make_unique<httplib::SSLClient>(endpoint_.host, endpoint_.port,
                                                 tls_->client_cert.get(), tls_->client_key.get());
    } else {
      ssl = std::make_unique<httplib::SSLClient>(endpoint_.host, endpoint_.port);
    }
    if (!tls_->ca.empty()) {
      X509_STORE* store = X509_STORE_new();
      for (const auto& cert : tls_->ca) X509_STORE_add_cert(store, cert.get());
      ssl->set_ca_cert_store(store);  // the client's SSL_CTX owns it from here
      // Only the configured CA is trusted, as client-go does. Without a CA path, cpp-httplib adds
      // the system's default store to the client's own at the first connection, which trusted
      // every public CA for the API server too, and parsed the whole bundle (some 140
      // certificates, hundreds of KiB of heap) for each client. A hashed-directory lookup at
      // /dev/null takes its place: nothing can ever be found under it.
      ssl->set_ca_cert_path("", "/dev/null");
    }
    ssl->enable_server_certificate_verification(!config_.insecure_skip_tls_verify);
    // An idle connection (a watch waiting for events, a pooled client) gives its 2 x 17 KiB of
    // record buffers back instead of holding them for as long as it lives.
    SSL_CTX_set_mode(ssl->ssl_context(), SSL_MODE_RELEASE_BUFFERS);
    client = std::move(ssl);
  }
  client->set_connection_timeout(kConnectTimeout);
  client->set_keep_alive(true);
  // Requests go out as headers and body in separate writes: with Nagle's algorithm the body
  // waits for the server's delayed ACK (tens of ms per request). curl sets this too.
  client->set_tcp_nodelay(true);
  return client;
}

std::unique_ptr<httplib::ClientImpl> HttplibTransport::TakeClient() {
  std::unique_ptr<httplib::ClientImpl> client;
  ChangePool([&](std::vector<IdleClient>& idle) {
    if (!idle.empty()) {
      client = std::move(idle.back().client);
      idle.pop_back();
    }
  });
  return client ? std::move(client) : NewClient();
}

void HttplibTransport::ReturnClient(std::unique_ptr<httplib::ClientImpl> client) {
  // Beyond the limit, the client closes when this returns, after the pool's lock is let go.
  ChangePool([&](std::vector<IdleClient>& idle) {
    if (idle.size() < kMaxIdleClients) idle.push_back({std::move(client), clock_->Now()});
  });
}

void HttplibTransport::ChangePool(const std::function<void(std::vector<IdleClient>&)>& change) {
  // Declared before the lock, so destroyed after it is let go: closing a TLS connection writes
  // to its socket, which must not hold up the other threads' requests.
  std::vector<IdleClient> expired;
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::TimePoint cutoff = clock_->Now() - kIdleClientTimeout;
  auto end = std::find_if(idle_.begin(), idle_.end(),
                          [&](const IdleClient& idle) { return idle.since > cutoff; });
  expired.assign(std::make_move_iterator(idle_.begin()), std::make_move_iterator(end));
  idle_.erase(idle_.begin(), end);
  change(idle_);
}

Result<HttpResponse> HttplibTransport::Send(const HttpRequest& request) {
  auto client = TakeClient();
  const auto timeout = request.timeout.count() > 0 ? request.timeout : kStreamReadTimeout;
  client->set_read_timeout(timeout);
  client->set_write_timeout(timeout);
  bool usable = false;
  auto response = Perform(*client, request, nullptr, nullptr, &usable);
  // A connection that failed may be half-used; the next request gets a fresh one.
  if (usable) ReturnClient(std::move(client));
  return response;
}

Result<HttpResponse> HttplibTransport::Stream(const HttpRequest& request,
                                              const BodyChunkHandler& on_chunk,
                                              std::stop_token stop) {
  // A quiet node makes no other call for as long as it likes, but its watches restart every few
  // minutes: the connections a burst of prepares left idle close then, not never.
  ChangePool([](std::vector<IdleClient>&) {});
  // A client of its own, so that a stop can shut its socket down whatever it is doing. A stop
  // that lands before the socket exists is caught when the socket is made.
  std::unique_ptr<httplib::ClientImpl> client = NewClient();
  client->set_read_timeout(kStreamReadTimeout);
  auto stopped = std::make_shared<std::atomic<bool>>(false);
  client->set_socket_options([stopped](socket_t sock) {
    // The kernel's keepalives notice a server that vanished without closing, at no cost to the
    // idle process.
    const int on = 1;
    const int idle = 30;
    const int interval = 15;
    ::setsockopt(sock, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    ::setsockopt(sock, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    ::setsockopt(sock, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    if (stopped->load()) ::shutdown(sock, SHUT_RDWR);
  });
  bool usable = false;
  Result<HttpResponse> response = MakeError(ErrorKind::kUnavailable, "not sent");
  {
    const std::stop_callback wake(stop, [&client, stopped] {
      stopped->store(true);
      client->stop();  // shuts the socket of a request in flight down; thread-safe in httplib
    });
    if (stop.stop_requested()) {
      HttpResponse none;
      return none;
    }
    response = Perform(*client, request, &on_chunk, &stop, &usable);
  }
  return response;
}

Result<HttpResponse> HttplibTransport::Perform(httplib::ClientImpl& client,
                                               const HttpRequest& request,
                                               const BodyChunkHandler* on_chunk,
                                               const std::stop_token* stop,
                                               bool* connection_usable) {
  HttpResponse response;
  bool aborted_by_handler = false;
  bool too_large = false;
  httplib::Request req;
  req.method = request.method;
  req.path = endpoint_.path_prefix + request.path_and_query;
  for (const auto& [name, value] : request.headers) req.headers.emplace(name, value);
  req.headers.emplace("Host", endpoint_.host_header);
  req.headers.emplace("User-Agent", user_agent_);
  req.body = request.body;
  req.response_handler = [&](const httplib::Response& head) {
    response.status = head.status;
    for (const auto& [name, value] : head.headers) response.headers[Lower(name)] = value;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t /*offset*/,
                             uint64_t /*total*/) {
    if (on_chunk != nullptr && response.status >= 200 && response.status < 300) {
      if (!(*on_chunk)(std::string_view(data, size))) {
        aborted_by_handler = true;
        return false;
      }
      return true;
    }
    if (response.body.size() + size > kMaxBodyBytes) {
      too_large = true;
      return false;
    }
    response.body.append(data, size);
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  const std::string what = request.method + " " + config_.server + request.path_and_query;
  if (too_large) {
    return MakeError(ErrorKind::kUnavailable, what + ": the response body is larger than " +
                                                  std::to_string(kMaxBodyBytes >> 20) +
                                                  " MiB; refused");
  }
  // A stream ended by its handler or by a stop is not a failure: the caller asked for the end.
  const bool stopped = stop != nullptr && stop->stop_requested();
  if (!sent && !aborted_by_handler && !stopped) {
    const ErrorKind kind = error == httplib::Error::ConnectionTimeout ? ErrorKind::kDeadlineExceeded
                                                                      : ErrorKind::kUnavailable;
    std::string detail = httplib::to_string(error);
    if (error == httplib::Error::SSLServerVerification) {
      detail +=
          " (SSL: the server's certificate does not verify against the configured CA, or "
          "does not name " +
          endpoint_.host + ")";
    } else if (error == httplib::Error::SSLConnection) {
      detail += " (SSL handshake failed)";
    }
    return MakeError(kind, what + ": " + detail);
  }
  *connection_usable = sent;
  return response;
}

}  // namespace vfio_dra::kube
