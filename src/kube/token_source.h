// TokenSource: the bearer token for API requests. A projected service-account token is rotated
// on disk by the kubelet, so a file-backed token is re-read at least every `reload_period` and at
// once after the server answered 401; a failed re-read keeps the last good token.
#pragma once

#include <mutex>
#include <string>

#include "base/clock.h"
#include "base/result.h"

namespace vfio_dra::kube {

class TokenSource {
 public:
  TokenSource(std::string static_token, std::string token_file, Clock& clock,
              Clock::Duration reload_period = std::chrono::seconds(50));

  // The token to send now (possibly empty: no Authorization header).
  Result<std::string> Token();
  // Called after a 401: forces the next Token() to re-read the file.
  void Invalidate();
  bool HasFile() const { return !token_file_.empty(); }

 private:
  const std::string static_token_;
  const std::string token_file_;
  Clock& clock_;
  const Clock::Duration reload_period_;
  std::mutex mu_;
  std::string cached_;
  bool loaded_ = false;
  Clock::TimePoint loaded_at_{};
};

}  // namespace vfio_dra::kube
