// Logging for the core, behind an interface that hides spdlog.
//
// Why an interface: torch ships its own fmt headers and Debian's spdlog is built against
// Debian's fmt; the two must never meet in one translation unit. Only log.cpp includes spdlog,
// so any file (torch-facing bindings and runtime included) can log through these functions.
//
// The level comes from the environment variable GRAPHPIPE_LOG_LEVEL (trace, debug, info, warn,
// error, off; default warn), read once on first use, and can be changed with set_log_level.
#pragma once

#include <string>
#include <string_view>

namespace graphpipe::log {

enum class Level { trace, debug, info, warn, error, off };

// Parses a level name; throws graphpipe::Error naming the valid names otherwise.
Level parse_level(std::string_view name);
void set_level(Level level);
Level level();
bool enabled(Level level);

void write(Level level, std::string_view message);

inline void debug(std::string_view message) { write(Level::debug, message); }
inline void info(std::string_view message) { write(Level::info, message); }
inline void warn(std::string_view message) { write(Level::warn, message); }
inline void error(std::string_view message) { write(Level::error, message); }

}  // namespace graphpipe::log
