// The only translation unit that includes spdlog (see log.h for why).
#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace graphpipe::log {
namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::trace:
      return spdlog::level::trace;
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warn:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
    case Level::off:
      return spdlog::level::off;
  }
  return spdlog::level::warn;
}

std::shared_ptr<spdlog::logger>& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto made = spdlog::stderr_color_mt("graphpipe");
    made->set_pattern("[graphpipe %H:%M:%S.%e %^%l%$ pid %P] %v");
    Level initial = Level::warn;
    if (const char* env = std::getenv("GRAPHPIPE_LOG_LEVEL"); env != nullptr && *env != '\0') {
      initial = parse_level(env);
    }
    made->set_level(to_spdlog(initial));
    return made;
  }();
  return instance;
}

}  // namespace

Level parse_level(std::string_view name) {
  if (name == "trace") return Level::trace;
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn" || name == "warning") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  throw Error("unknown log level '" + std::string(name) +
              "' (GRAPHPIPE_LOG_LEVEL takes trace, debug, info, warn, error or off)");
}

void set_level(Level level) { logger()->set_level(to_spdlog(level)); }

Level level() {
  switch (logger()->level()) {
    case spdlog::level::trace:
      return Level::trace;
    case spdlog::level::debug:
      return Level::debug;
    case spdlog::level::info:
      return Level::info;
    case spdlog::level::warn:
      return Level::warn;
    case spdlog::level::err:
    case spdlog::level::critical:
      return Level::error;
    default:
      return Level::off;
  }
}

bool enabled(Level level) { return logger()->should_log(to_spdlog(level)); }

void write(Level level, std::string_view message) { logger()->log(to_spdlog(level), "{}", message); }

}  // namespace graphpipe::log
