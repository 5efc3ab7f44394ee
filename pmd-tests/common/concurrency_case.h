// The endpoint's any-thread send path under a real concurrent producer, as
// one case that the PMD test checks and the benchmark times: 20 000
// messages of 64 B .. 16 KiB, submitted by a producer on another lcore (or
// by the polling thread itself) while the net core polls both endpoints of
// a net_ring link, completes and reuses the sender's descriptors; the
// receiver checks every byte (CheckingReceiver).
//
// Threads: called from the main lcore; the producer runs on
// `producer_lcore`, which EAL must have (--lcores). Allocates; control path.
#pragma once

#include <cstdint>
#include <string>

namespace mercury::pmdtest {

struct ConcurrencyCase {
  double loss = 0;  ///< both ways, with reordering and duplication (faults())
  uint64_t seed = 1;
  uint32_t descriptors = 256;  ///< the sender's max_messages: small, so they are reused
  bool same_thread = false;    ///< the polling thread submits too (no producer lcore)
  double deadline_s = 20;
  unsigned producer_lcore = 1;
};

struct ConcurrencyResult {
  int launch = 0;          ///< rte_eal_remote_launch's result (0: the producer ran)
  int producer_exit = 0;   ///< the producer's return, from rte_eal_wait_lcore
  bool submitted = false;  ///< every message was submitted before the deadline
  uint64_t messages = 0;
  uint64_t completed = 0;  ///< completions that reported delivery
  uint64_t failed = 0;
  int first_status = -1;  ///< SendStatus of the first failure
  std::string first_error;
  bool exactly_once = false;  ///< the receiver got every message once, every byte right
  /// Empty, or the sender's state when the completions did not all run
  /// before the deadline.
  std::string stuck;
  double seconds = 0;  ///< from the first submission to the last completion (or the deadline)
};

/// Runs one case. With `same_thread` false, a failed launch returns at once
/// (`launch` non-zero).
ConcurrencyResult run_concurrency_case(const ConcurrencyCase& c);

}  // namespace mercury::pmdtest
