// The exceptions of the worker API (public, no DPDK).
//
// UsageError is the trainer's mistake (a std::logic_error): an unknown key,
// a buffer of the wrong size, a declaration after the worker started, any
// call after shutdown(). Its message names the call and the tensor.
// WorkerError is the job's failure (a std::runtime_error): the configuration
// cannot be loaded, EAL or a port cannot start, a server refused the
// declarations or never answered (the message names the server).
// SpareReleased, a WorkerError, is a spare worker's start() when the job
// ended without needing it: no failure (docs/membership.md, "Spare workers").
#pragma once

#include <stdexcept>

namespace mercury::worker {

/// A trainer's misuse of the worker API.
class UsageError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// The worker cannot run: configuration, start-up, or a server.
class WorkerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A spare worker's start(): the job ended without giving it a rank. The
/// message says so, naming server 0; a spare's process ends with status 0.
class SpareReleased : public WorkerError {
 public:
  using WorkerError::WorkerError;
};

}  // namespace mercury::worker
