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

/// With a hot standby in the job (docs/durability.md): ", standby: T
/// takeovers, N tensors pushed again" (WorkerStats::standby_takeovers and
/// tensors_resent); "" without one.
inline std::string standby_text(const worker::Worker& w, bool job_has_standby) {
  if (!job_has_standby) return {};
  const worker::WorkerStats s = w.stats();
  return ", standby: " + std::to_string(s.standby_takeovers) + " takeovers, " +
         std::to_string(s.tensors_resent) + " tensors pushed again";
}

}  // namespace mercury::trainer
