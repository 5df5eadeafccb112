// Logger: one line per event, "<time> <level> <component> <message> key=value ...", written
// through spdlog. A Logger is a cheap value (a shared sink plus a component name) handed to each
// component, so there is no global logger state and tests can capture output. spdlog stays
// behind log.cc: this header is included nearly everywhere, and spdlog's headers (with fmt) are
// among the heaviest the build parses.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace spdlog {
class logger;
}  // namespace spdlog

namespace vfio_dra {

using LogField = std::pair<std::string_view, std::string_view>;

class Logger {
 public:
  // A logger writing to stderr at the given verbosity (0 = info and above only).
  static Logger ToStderr(int verbosity);
  // A logger that drops everything.
  static Logger Discard();
  // A logger that hands each line (without its time stamp) and its level ("debug", "info",
  // "warning", "error") to `write`, from the logging thread and without serializing: tests
  // record what a component logs, or hold a thread at a line it logs.
  static Logger ToFunction(std::function<void(std::string_view level, std::string_view line)> write,
                           int verbosity);

  Logger WithComponent(std::string component) const;

  void Info(std::string_view message, std::initializer_list<LogField> fields = {}) const;
  void Warn(std::string_view message, std::initializer_list<LogField> fields = {}) const;
  void Error(std::string_view message, std::initializer_list<LogField> fields = {}) const;
  // Detail that is shown only when the verbosity is at least `level` (-v N).
  void Debug(int level, std::string_view message,
             std::initializer_list<LogField> fields = {}) const;
  bool Enabled(int level) const { return verbosity_ >= level; }

 private:
  Logger(std::shared_ptr<spdlog::logger> logger, std::string component, int verbosity)
      : logger_(std::move(logger)), component_(std::move(component)), verbosity_(verbosity) {}
  enum class Level { kDebug, kInfo, kWarn, kError };
  void Write(Level level, std::string_view message, std::initializer_list<LogField> fields) const;

  std::shared_ptr<spdlog::logger> logger_;
  std::string component_;
  int verbosity_ = 0;
};

// Quotes a log value when it contains spaces, quotes or control characters, so that every line
// stays parseable as key=value pairs whatever a claim name or error message holds.
std::string LogQuote(std::string_view value);

}  // namespace vfio_dra
