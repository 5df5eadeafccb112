#include "kube/curl_transport.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>

#include "base/file_io.h"

namespace vfio_dra::kube {
namespace {

struct TransferState {
  HttpResponse response;
  const BodyChunkHandler* on_chunk = nullptr;
  CURL* handle = nullptr;
  bool aborted_by_handler = false;
};

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<TransferState*>(user);
  std::string line(data, size * count);
  if (line.rfind("HTTP/", 0) == 0) {
    state->response.headers.clear();  // a new response (after 100-continue or a redirect)
    return size * count;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return size * count;
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string value = line.substr(colon + 1);
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  value.erase(value.begin(), std::find_if(value.begin(), value.end(), not_space));
  value.erase(std::find_if(value.rbegin(), value.rend(), not_space).base(), value.end());
  state->response.headers[name] = value;
  return size * count;
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<TransferState*>(user);
  const size_t n = size * count;
  long code = 0;
  curl_easy_getinfo(state->handle, CURLINFO_RESPONSE_CODE, &code);
  if (state->on_chunk != nullptr && code >= 200 && code < 300) {
    if (!(*state->on_chunk)(std::string_view(data, n))) {
      state->aborted_by_handler = true;
      return 0;  // makes curl abort the transfer
    }
    return n;
  }
  if (state->response.body.size() + n > (64u << 20)) return 0;  // refuse absurd bodies
  state->response.body.append(data, n);
  return n;
}

// The longest a streaming transfer sleeps without looking at curl's timers (curl normally names
// its next deadline itself: the request timeout).
constexpr int kMaxStreamSleepMs = 60000;

// Runs a streaming transfer on its own multi handle until it ends or `stop` is requested.
// curl_easy_perform polls with a one-second ceiling, which would wake an idle watch every second
// for the life of the daemon; curl_multi_poll sleeps until data arrives, curl's own next deadline,
// or a wakeup from the stop callback.
CURLcode PerformUntilStopped(CURL* handle, const std::stop_token& stop) {
  CURLM* multi = curl_multi_init();
  if (multi == nullptr) return CURLE_OUT_OF_MEMORY;
  if (curl_multi_add_handle(multi, handle) != CURLM_OK) {
    curl_multi_cleanup(multi);
    return CURLE_FAILED_INIT;
  }
  CURLcode result = CURLE_OK;
  {
    const std::stop_callback wake(stop, [multi] { curl_multi_wakeup(multi); });
    while (true) {
      int running = 0;
      if (curl_multi_perform(multi, &running) != CURLM_OK) {
        result = CURLE_RECV_ERROR;
        break;
      }
      if (running == 0) {
        int left = 0;
        while (CURLMsg* message = curl_multi_info_read(multi, &left)) {
          if (message->msg == CURLMSG_DONE) result = message->data.result;
        }
        break;
      }
      if (stop.stop_requested()) {
        result = CURLE_ABORTED_BY_CALLBACK;
        break;
      }
      long next_ms = -1;
      curl_multi_timeout(multi, &next_ms);
      const int sleep_ms = next_ms < 0
                               ? kMaxStreamSleepMs
                               : static_cast<int>(std::min<long>(next_ms, kMaxStreamSleepMs));
      if (curl_multi_poll(multi, nullptr, 0, sleep_ms, nullptr) != CURLM_OK) {
        result = CURLE_RECV_ERROR;
        break;
      }
    }
  }
  curl_multi_remove_handle(multi, handle);
  curl_multi_cleanup(multi);
  return result;
}

void SetBlob(CURL* handle, CURLoption option, const std::string& data) {
  curl_blob blob{};
  blob.data = const_cast<char*>(data.data());
  blob.len = data.size();
  blob.flags = CURL_BLOB_COPY;
  curl_easy_setopt(handle, option, &blob);
}

}  // namespace

Result<std::unique_ptr<CurlTransport>> CurlTransport::Create(const ClientConfig& config,
                                                             std::string user_agent) {
  for (const std::string* file :
       {&config.ca_file, &config.client_cert_file, &config.client_key_file}) {
    if (file->empty()) continue;
    auto content = ReadFileToString(*file, 1 << 20);
    if (!content.ok()) {
      return content.error().Wrap("API client TLS settings from " + config.source);
    }
  }
  if (config.server.rfind("http://", 0) == 0 &&
      (!config.token.empty() || !config.token_file.empty())) {
    // Allowed for loopback test servers only: never send a bearer token in clear text elsewhere.
    const std::string rest = config.server.substr(7);
    if (rest.rfind("127.", 0) != 0 && rest.rfind("localhost", 0) != 0 &&
        rest.rfind("[::1]", 0) != 0) {
      return MakeError(ErrorKind::kInvalidArgument,
                       "refusing to send a bearer token over plain http to " + config.server +
                           " (from " + config.source + "); use https");
    }
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  return std::unique_ptr<CurlTransport>(new CurlTransport(config, std::move(user_agent)));
}

CurlTransport::CurlTransport(ClientConfig config, std::string user_agent)
    : config_(std::move(config)), user_agent_(std::move(user_agent)) {}

CurlTransport::~CurlTransport() {
  for (void* handle : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void* CurlTransport::TakeHandle() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_handles_.empty()) {
      void* handle = idle_handles_.back();
      idle_handles_.pop_back();
      curl_easy_reset(static_cast<CURL*>(handle));  // keeps the live connections
      return handle;
    }
  }
  return curl_easy_init();
}

void CurlTransport::ReturnHandle(void* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_handles_.size() < 8) {
    idle_handles_.push_back(handle);
  } else {
    curl_easy_cleanup(static_cast<CURL*>(handle));
  }
}

Result<HttpResponse> CurlTransport::Send(const HttpRequest& request) {
  return Perform(request, nullptr, nullptr);
}

Result<HttpResponse> CurlTransport::Stream(const HttpRequest& request,
                                           const BodyChunkHandler& on_chunk, std::stop_token stop) {
  return Perform(request, &on_chunk, &stop);
}

Result<HttpResponse> CurlTransport::Perform(const HttpRequest& request,
                                            const BodyChunkHandler* on_chunk,
                                            const std::stop_token* stop) {
  CURL* handle = static_cast<CURL*>(TakeHandle());
  if (handle == nullptr) return MakeError(ErrorKind::kInternal, "curl_easy_init failed");
  TransferState state;
  state.on_chunk = on_chunk;
  state.handle = handle;

  const std::string url = config_.server + request.path_and_query;
  curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(handle, CURLOPT_USERAGENT, user_agent_.c_str());
  curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  if (request.method == "HEAD") curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT") {
    curl_easy_setopt(handle, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
  }
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout.count()));
  if (stop != nullptr) {
    // A stream has no overall timeout (the server ends a watch after its timeoutSeconds); kernel
    // keepalives notice a peer that vanished without closing, at no cost to the idle process.
    curl_easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(handle, CURLOPT_TCP_KEEPIDLE, 30L);
    curl_easy_setopt(handle, CURLOPT_TCP_KEEPINTVL, 15L);
  }
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &state);
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &state);
  // TLS: verification stays on unless the kubeconfig explicitly turns it off.
  if (config_.insecure_skip_tls_verify) {
    curl_easy_setopt(handle, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(handle, CURLOPT_SSL_VERIFYHOST, 0L);
  } else {
    curl_easy_setopt(handle, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(handle, CURLOPT_SSL_VERIFYHOST, 2L);
  }
  if (!config_.ca_data.empty()) SetBlob(handle, CURLOPT_CAINFO_BLOB, config_.ca_data);
  if (!config_.ca_file.empty()) curl_easy_setopt(handle, CURLOPT_CAINFO, config_.ca_file.c_str());
  if (!config_.client_cert_data.empty()) {
    SetBlob(handle, CURLOPT_SSLCERT_BLOB, config_.client_cert_data);
    curl_easy_setopt(handle, CURLOPT_SSLCERTTYPE, "PEM");
  }
  if (!config_.client_cert_file.empty()) {
    curl_easy_setopt(handle, CURLOPT_SSLCERT, config_.client_cert_file.c_str());
  }
  if (!config_.client_key_data.empty()) {
    SetBlob(handle, CURLOPT_SSLKEY_BLOB, config_.client_key_data);
    curl_easy_setopt(handle, CURLOPT_SSLKEYTYPE, "PEM");
  }
  if (!config_.client_key_file.empty()) {
    curl_easy_setopt(handle, CURLOPT_SSLKEY, config_.client_key_file.c_str());
  }

  curl_slist* headers = nullptr;
  for (const auto& [name, value] : request.headers) {
    headers = curl_slist_append(headers, (name + ": " + value).c_str());
  }
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers);

  const CURLcode rc =
      stop != nullptr ? PerformUntilStopped(handle, *stop) : curl_easy_perform(handle);
  long code = 0;
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(headers);
  const bool stopped = stop != nullptr && stop->stop_requested();
  if (rc != CURLE_OK && !(state.aborted_by_handler || stopped)) {
    curl_easy_cleanup(handle);  // the connection may be in a bad state; do not reuse it
    const ErrorKind kind =
        rc == CURLE_OPERATION_TIMEDOUT ? ErrorKind::kDeadlineExceeded : ErrorKind::kUnavailable;
    return MakeError(kind, request.method + " " + config_.server + request.path_and_query + ": " +
                               curl_easy_strerror(rc));
  }
  if (rc != CURLE_OK) {
    curl_easy_cleanup(handle);
  } else {
    ReturnHandle(handle);
  }
  state.response.status = static_cast<int>(code);
  return std::move(state.response);
}

}  // namespace vfio_dra::kube
