// What ps-worker's closing lines say about the worker's counters.
#pragma once

#include <string>

#include "mercury/worker.h"

namespace mercury::trainer {

/// "drops: none", or every drop by reason the worker counted ("drops:
/// not_our_mac=3 retransmit_stale=12"), chunks and control messages
/// included, as ps-server's lines say its own.
inline std::string drops_text(const worker::Worker& w) {
  const worker::WorkerStats s = w.stats();
  std::string t;
  auto add = [&t](const std::string& name, uint64_t n) {
    if (n != 0) t += " " + name + "=" + std::to_string(n);
  };
  add("chunks", s.chunks_dropped);
  add("control", s.control_dropped);
  for (const auto& [name, n] : w.drops()) add(name, n);
  return "drops:" + (t.empty() ? std::string(" none") : t);
}

}  // namespace mercury::trainer
