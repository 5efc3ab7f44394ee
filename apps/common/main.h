// What every Mercury app's main shares: the stop flag its signals set, and
// the one place an error reaches the operator ("ps-server: <what>", exit 1).
// Control path, header only.
#pragma once

#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>

namespace mercury::apps {

/// Set by SIGINT or SIGTERM once stop_on_signals() has run; poll loops and
/// waits check it.
inline std::atomic<bool> g_stop{false};

/// SIGINT and SIGTERM set g_stop (the first one; a second one is the default
/// action again only if the app resets it).
inline void stop_on_signals() {
  auto handler = [](int) { g_stop.store(true, std::memory_order_relaxed); };
  std::signal(SIGINT, handler);
  std::signal(SIGTERM, handler);
}

/// Runs `body` (returning the exit status); an exception is printed as
/// "<program>: <what>" on stderr and exits 1.
template <class Body>
int guarded_main(const char* program, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace mercury::apps
