// Two-process PMD tests and benchmarks (net_memif between two processes):
// this same binary run again as the peer, a control socket between the two,
// and the memif vdev arguments and socket names both sides use.
//
// The peer is started before EAL, because EAL starts once per process and a
// process must not fork once it has. It dies with its parent
// (PR_SET_PDEATHSIG), and PeerProcess's destructor reaps it (killing it after
// a bound), so no process outlives the test or benchmark.
//
// The control socket is a SOCK_SEQPACKET pair made before the fork: a
// message is whole or absent, and one of the wrong size is an error. Every
// wait on it has a bound.
//
// Threads: both classes belong to the thread that made them (each process's
// main thread). Costs: every call is a system call or two; control path only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "net/frame.h"

namespace mercury::pmdtest {

/// One end of the control socket.
class ControlChannel {
 public:
  explicit ControlChannel(int fd = -1) : fd_(fd) {}
  ~ControlChannel() { close(); }
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  /// False when the other side is gone.
  template <class T>
  bool send(const T& m) {
    static_assert(std::is_trivially_copyable_v<T>);
    return send_bytes(&m, sizeof(m));
  }
  /// Waits up to `timeout_ms` (-1: no bound; 0: does not wait). 1 with a
  /// message, 0 on timeout, -1 when the other side closed or sent a message
  /// of another size.
  template <class T>
  int receive(T& m, int timeout_ms) {
    static_assert(std::is_trivially_copyable_v<T>);
    return receive_bytes(&m, sizeof(m), timeout_ms);
  }
  /// Takes ownership of `fd` (closing the one held before).
  void adopt(int fd);
  void close();

 private:
  bool send_bytes(const void* p, size_t n);
  int receive_bytes(void* p, size_t n, int timeout_ms);
  int fd_;
};

/// The peer process: "/proc/self/exe" run as `<name> <flag> <control fd>
/// <args...>` (see peer_control_fd()).
class PeerProcess {
 public:
  /// Throws when the socket pair or the fork fails.
  PeerProcess(const std::string& name, const std::string& flag,
              const std::vector<std::string>& args);
  /// reap(5000).
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  ControlChannel& control() { return control_; }
  /// True once the peer has exited (without waiting), with its status as
  /// reap() returns it.
  bool exited(int& status);
  /// Closes the control socket (a peer waiting on it sees it close), waits
  /// up to `timeout_ms` for the peer to leave, then kills it. Returns its
  /// exit code, 128 + the signal that ended it, or 0 when it was reaped
  /// before.
  int reap(int timeout_ms);

 private:
  pid_t pid_ = -1;
  ControlChannel control_;
};

/// In a process started by PeerProcess with `flag`: its control socket's
/// fd; -1 in any other process (argv[1] is not `flag`).
int peer_control_fd(int argc, char** argv, const char* flag);

/// One side of a net_memif link.
struct MemifVdev {
  uint16_t index = 0;  ///< net_memif<index>, id=<index>: one socket carries several links
  bool server = false;
  std::string socket;
  net::MacAddr mac;
  uint32_t slot_bytes = 0;  ///< bsize; 0: memif's default
  bool zero_copy = false;   ///< zero-copy=yes (a client only)
};
/// "net_memif<i>,role=...,id=<i>,socket=...[,bsize=...],mac=...[,zero-copy=yes]".
std::string memif_vdev(const MemifVdev& v);
/// A memif socket name unique to this process, "/tmp/mercury-<tag>-<pid>.sock".
/// memif's sockets are abstract by default: a name, nothing on disk to clean.
std::string memif_socket(const std::string& tag);

}  // namespace mercury::pmdtest
