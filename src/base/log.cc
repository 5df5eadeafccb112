#include "base/log.h"

#include <spdlog/details/null_mutex.h>
#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "base/text.h"

namespace vfio_dra {
namespace {

std::shared_ptr<spdlog::logger> MakeLogger(std::shared_ptr<spdlog::sinks::sink> sink) {
  auto logger = std::make_shared<spdlog::logger>("vfio-dra", std::move(sink));
  logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(
      "%Y-%m-%dT%H:%M:%S.%fZ %l %v", spdlog::pattern_time_type::utc));
  logger->set_level(spdlog::level::trace);
  logger->flush_on(spdlog::level::trace);
  return logger;
}

// No lock of its own: the function decides what is shared, and may block one thread alone.
class FunctionSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 public:
  using Write = std::function<void(std::string_view level, std::string_view line)>;
  explicit FunctionSink(Write write) : write_(std::move(write)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    const auto level = spdlog::level::to_string_view(message.level);
    write_(std::string_view(level.data(), level.size()),
           std::string_view(message.payload.data(), message.payload.size()));
  }
  void flush_() override {}

 private:
  Write write_;
};

}  // namespace

Logger Logger::ToFunction(std::function<void(std::string_view level, std::string_view line)> write,
                          int verbosity) {
  return Logger(MakeLogger(std::make_shared<FunctionSink>(std::move(write))), "main", verbosity);
}

Logger Logger::ToStderr(int verbosity) {
  return Logger(MakeLogger(std::make_shared<spdlog::sinks::stderr_sink_mt>()), "main", verbosity);
}

Logger Logger::Discard() {
  return Logger(MakeLogger(std::make_shared<spdlog::sinks::null_sink_mt>()), "main", -1);
}

Logger Logger::WithComponent(std::string component) const {
  return Logger(logger_, std::move(component), verbosity_);
}

void Logger::Info(std::string_view message, std::initializer_list<LogField> fields) const {
  if (verbosity_ >= 0) Write(Level::kInfo, message, fields);
}
void Logger::Warn(std::string_view message, std::initializer_list<LogField> fields) const {
  if (verbosity_ >= 0) Write(Level::kWarn, message, fields);
}
void Logger::Error(std::string_view message, std::initializer_list<LogField> fields) const {
  if (verbosity_ >= 0) Write(Level::kError, message, fields);
}
void Logger::Debug(int level, std::string_view message,
                   std::initializer_list<LogField> fields) const {
  if (verbosity_ >= level) Write(Level::kDebug, message, fields);
}

void Logger::Write(Level level, std::string_view message,
                   std::initializer_list<LogField> fields) const {
  std::string line = component_;
  line += ' ';
  line += LogQuote(message);
  for (const auto& [key, value] : fields) {
    line += ' ';
    line += key;
    line += '=';
    line += LogQuote(value);
  }
  switch (level) {
    case Level::kDebug:
      logger_->log(spdlog::level::debug, line);
      break;
    case Level::kInfo:
      logger_->log(spdlog::level::info, line);
      break;
    case Level::kWarn:
      logger_->log(spdlog::level::warn, line);
      break;
    case Level::kError:
      logger_->log(spdlog::level::err, line);
      break;
  }
}

std::string LogQuote(std::string_view value) {
  bool needs_quotes = value.empty();
  for (unsigned char c : value) {
    if (c <= ' ' || c == '"' || c == '=' || c == 0x7f || c == '\\') needs_quotes = true;
  }
  if (!needs_quotes) return std::string(value);
  std::string out = "\"";
  for (unsigned char c : value) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      AppendHexEscape(out, c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

}  // namespace vfio_dra
