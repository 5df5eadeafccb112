#include "kube/token_source.h"

#include "base/file_io.h"

namespace vfio_dra::kube {

TokenSource::TokenSource(std::string static_token, std::string token_file, Clock& clock,
                         Clock::Duration reload_period)
    : static_token_(std::move(static_token)),
      token_file_(std::move(token_file)),
      clock_(clock),
      reload_period_(reload_period) {}

Result<std::string> TokenSource::Token() {
  // A literal token in the kubeconfig wins over a token file, as client-go does.
  if (!static_token_.empty() || token_file_.empty()) return static_token_;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = clock_.Now();
  if (loaded_ && now - loaded_at_ < reload_period_) return cached_;
  auto text = ReadFileToString(token_file_, 64 << 10);
  if (!text.ok()) {
    if (loaded_) return cached_;  // keep the last good token; the next call retries the read
    return text.error().Wrap("cannot read the API token");
  }
  std::string token = *text;
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  cached_ = token;
  loaded_ = true;
  loaded_at_ = now;
  return cached_;
}

void TokenSource::Invalidate() {
  std::lock_guard<std::mutex> lock(mu_);
  loaded_at_ = Clock::TimePoint{};
}

}  // namespace vfio_dra::kube
