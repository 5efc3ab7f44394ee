// The two processes of the net_memif benchmarks (benchmarks/net/memif_rate_bench,
// benchmarks/transport_pmd/memif_goodput_bench): what they agree on, how
// they talk, and the main of each side.
//
// The sender is the Google Benchmark process (memif client, pinned to CPU
// 0); the receiver is the same binary started again with --peer before EAL
// (memif server, CPU 1; pmdtest::PeerProcess), because EAL can start only
// once per process and a process must not fork once it has. This header
// holds the addresses and vdev arguments both sides use, the control
// protocol over the PeerProcess's socket, and memif_main(), which runs
// either side of a benchmark.
//
// Control protocol: the receiver sends one Report when its port listens
// (ready; in memif_goodput_bench's zero-copy mode the receiver is the memif
// client, so it first waits for kGo, sent once the sender's server ports
// listen, and is ready once its own ports are up); then for every benchmark
// run the sender sends kStart (the receiver drains leftovers, zeroes its
// counts and answers with a Report), sends frames over memif, and sends kStop
// with the number of frames memif accepted (the receiver keeps receiving
// until it has them all or 1 s passed, and answers with its counts). kQuit,
// or the socket closing, ends the receiver. For memif_goodput_bench's
// endpoint variants a Report counts messages, not frames.
//
// Every repetition also passes the CPU-share guard (cpu_share.h): the sender
// and the receiver report the share of their core they got.
//
// Threading: everything belongs to the main thread of each process. Costs:
// every control call is a system call or two; the datapath never touches
// them (the receiver looks for a command with one non-blocking recv every
// kCommandPollPasses polls: serve_commands).
#pragma once

#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <sys/prctl.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench_eal.h"
#include "cpu_share.h"
#include "net/eal.h"
#include "net/frame.h"
#include "peer_process.h"

struct rte_mempool;

namespace mercury::net {
class Port;
}

namespace mercury::bench::memif {

using pmdtest::ControlChannel;

enum class Variant : uint32_t {
  kRaw,              ///< rte_eth_rx_burst, count, free
  kStack,            ///< Interface::poll_rx_st: parse and verify every header and checksum
  kStackNoChecksum,  ///< the same with UDP checksums off (network.udp_checksum: false)
  // benchmarks/transport_pmd/memif_goodput_bench's receiver only:
  kRawPlace,        ///< kRaw, and each frame's payload copied out into a destination buffer
  kEndpoint,        ///< a transport::Endpoint places and checks every message
  kEndpointLoss1,   ///< the same through the link emulator, 1 % loss each way
  kEndpointAuth,    ///< kEndpoint with a job key: every packet signed and verified (AES-GMAC)
  kEndpoint10G,     ///< kEndpoint through the link emulator at a 10 Gbit/s line rate each way
  kEndpointAuth10G  ///< kEndpointAuth at the same 10 Gbit/s line rate
};

inline constexpr net::MacAddr kSenderMac{{0x02, 0x00, 0x00, 0x00, 0x6d, 0x01}};
inline constexpr net::MacAddr kReceiverMac{{0x02, 0x00, 0x00, 0x00, 0x6d, 0x02}};
inline constexpr uint32_t kSenderIp = 0x0a006d01;    // 10.0.109.1
inline constexpr uint32_t kReceiverIp = 0x0a006d02;  // 10.0.109.2
inline constexpr uint16_t kUdpPort = 47100;

// memif in DPDK 22.11 announces max_rx_pktlen 1518, so ethdev refuses an MTU
// above 1500 at configure time; its datapath carries any length. The ports
// are configured at 1500 and the 9000 row sends 9014-byte frames anyway.
inline constexpr uint32_t kPortMtu = 1500;
// One memif slot (bsize) holds the largest frame, 9014 bytes, so no frame is
// chained over several slots: the receiver gets it in one mbuf (the stack
// drops chained mbufs as kSegmented), and 22.11's TX path, which leaves a
// stale NEXT flag on a reused first slot, is never exercised. 9024 is a
// multiple of 64 whose stride spreads slots over the cache sets.
inline constexpr uint32_t kSlotBytes = 9024;
// The receiver's mbufs hold a whole slot, so memif's RX takes its bulk path.
inline constexpr uint32_t kMbufFrameBytes = kSlotBytes;

/// The vdev of memif link `index` on one side (bsize kSlotBytes, the
/// side's MAC): the receiver is the server, unless `receiver_zero_copy`
/// (memif's zero-copy mode on the receiving side: the receiver is then the
/// client, with zero-copy=yes, its RX handing out mbufs the server's TX has
/// written into, with no copy of its own). Zero-copy exports EAL's memory:
/// both processes need --single-file-segments (kZeroCopyEalArg).
std::string memif_vdev(bool receiver, const std::string& socket, uint16_t index = 0,
                       bool receiver_zero_copy = false);
inline constexpr const char* kZeroCopyEalArg = "--single-file-segments";
/// The receiver's extra argument in zero-copy mode (Peer).
inline constexpr const char* kZeroCopyPeerArg = "zero-copy";

struct Command {
  /// kGo: zero-copy mode only, the sender's server ports listen, so the
  /// receiver may start EAL and connect its client ports.
  enum class Kind : uint32_t { kStart, kStop, kQuit, kGo };
  Kind kind = Kind::kQuit;
  Variant variant = Variant::kRaw;
  uint32_t frame = 0;  ///< kStart: bytes of every frame of the run
  uint32_t reserved = 0;
  uint64_t sent = 0;  ///< kStop: frames the sender's PMD accepted in the run
};

struct Report {
  uint64_t packets = 0;  ///< frames received (raw) or Mercury packets delivered (stack)
  uint64_t bytes = 0;    ///< their Ethernet bytes
  // The rate window: from the first burst that brought frames to the last
  // one. The first burst's frames arrived at its start, so they are left out
  // of the rate: rate = timed_packets / window_ns.
  uint64_t timed_packets = 0;
  uint64_t timed_bytes = 0;
  uint64_t window_ns = 0;
  uint64_t drops = 0;         ///< stack: frames the Interface dropped (every reason)
  uint64_t wrong_length = 0;  ///< frames (raw) or payloads (stack) not of the run's size
  uint64_t leftovers = 0;     ///< kStart: frames of an earlier run drained first
  // CPU time the receiver's thread got over the wall time from kStart to
  // kStop: well below 1, another process shared its CPU during the run.
  uint64_t cpu_ns = 0;
  uint64_t wall_ns = 0;
  // memif_goodput_bench's endpoint variants (where packets and bytes count
  // completed messages and their payload): messages compared with the
  // source byte for byte, and messages whose bytes differed.
  uint64_t checked = 0;
  uint64_t corrupt = 0;
  uint64_t idle_ns = 0;  ///< ... and the time the receiver's passes found nothing to do
};

/// CLOCK_MONOTONIC or CLOCK_THREAD_CPUTIME_ID now, in ns (control path only).
uint64_t clock_ns(int clock);

/// What a memif benchmark is, for memif_main().
struct MemifBenchmark {
  const char* name;       ///< the binary: EAL's name and file prefix, error messages
  const char* peer_name;  ///< the receiver process's (at most 15 characters: its thread name)
  const char* counter;    ///< the counter compared with raw's (CpuShareReporter)
  uint16_t links = 1;     ///< memif links between the processes (net_memif0, 1, ...)
  bool zero_copy_option = false;  ///< offers --memif_zero_copy
  /// More ratio tables, each of a variant to its reference in the same
  /// repetition: {variant, reference} (CpuShareReporter::add_pair).
  std::vector<std::pair<const char*, const char*>> pairs = {};
};

/// The receiver process, seen from the sender: `<peer_name> --peer <fd>
/// <socket> [zero-copy]` (pmdtest::PeerProcess: it dies with the sender, and
/// is reaped, killed after 5 s, when this goes). The receiver also leaves by
/// itself after kPatienceMs without a command (a hung sender).
class Peer {
 public:
  /// Throws when it cannot be started.
  Peer(const MemifBenchmark& b, const std::string& socket, bool zero_copy);

  /// Waits for the receiver's ready Report; throws if it fails or takes
  /// longer than `timeout_ms`.
  void wait_ready(int timeout_ms);
  /// kGo (zero-copy mode): throws if the receiver is gone.
  void go();
  /// kStart: false (with `error` set) when the receiver does not answer.
  bool start(Variant v, uint32_t frame, Report& ack, std::string& error);
  /// kStop: the receiver's counts for the run.
  bool stop(uint64_t sent, Report& out, std::string& error);
  /// Sends kQuit and reaps the receiver; returns its exit status (0: clean).
  int quit();

 private:
  pmdtest::PeerProcess process_;
};

/// Bounded waiting for a PMD that takes nothing: stuck() is true once calls
/// that made no progress have gone on for a second (the receiver is gone).
class Stall {
 public:
  bool stuck(uint16_t progress);

 private:
  uint64_t since_ = 0;
};

/// The raw sender's burst: `n` (<= 64) fresh mbufs from `pool`, each filled
/// with the next `frame` bytes of `source` (from `offset`, wrapping to 0 at
/// its end), handed to queue 0 of `port`, waiting while memif's ring is full.
/// Returns the frames memif accepted; fewer than `n` only when `failure` was
/// set (the pool was empty, or memif took nothing for 1 s; the rest freed).
uint16_t send_raw_burst(net::Port& port, rte_mempool* pool, std::span<const std::byte> source,
                        size_t frame, uint16_t n, size_t& offset, Stall& stall,
                        std::string& failure);

/// Waits up to `timeout_ms` for the link of `port` to come up; throws after.
void wait_link_up(net::Port& port, int timeout_ms = 10'000);

/// Receivers look at the control socket once per this many polls: one
/// non-blocking recv (about 1 us) per 256 polls is well under 1 % of a
/// loaded receiver's time.
inline constexpr int kCommandPollPasses = 256;
/// No command for this long, idle or counting: the sender is gone or hung,
/// so the receiver leaves (its parent's death kills it sooner, via
/// PR_SET_PDEATHSIG).
inline constexpr int kPatienceMs = 60'000;

/// The receiver's side of the control protocol, for both benchmarks'
/// receivers, until kQuit or the sender closes the socket. `Rx` has
/// drain() (frames left from an earlier run), begin(Variant, frame),
/// poll_st(), received() (what the run has counted, compared with kStop's
/// `sent`) and finish() (the run's Report). `who` names the process in its
/// two error messages. Returns the process exit code.
template <class Rx>
int serve_commands(Rx& rx, ControlChannel& control, const char* who) {
  const uint64_t hz = rte_get_tsc_hz();
  enum class Next { kIdle, kExit, kFail };
  // One run: poll until kStop, then take what memif accepted that may still
  // be in its ring (within 1 s) and answer with the counts.
  const auto run = [&]() -> Next {
    const uint64_t give_up = rte_rdtsc() + hz / 1000 * kPatienceMs;
    for (;;) {
      for (int i = 0; i < kCommandPollPasses; ++i) rx.poll_st();
      Command c;
      const int got = control.receive(c, 0);
      if (got < 0) return Next::kExit;
      if (got == 0) {
        if (rte_rdtsc() < give_up) continue;
        std::fprintf(stderr, "%s receiver: no stop after %d s\n", who, kPatienceMs / 1000);
        return Next::kFail;
      }
      if (c.kind == Command::Kind::kQuit) return Next::kExit;
      if (c.kind != Command::Kind::kStop) continue;
      const uint64_t until = rte_rdtsc() + hz;
      while (rx.received() < c.sent && rte_rdtsc() < until) rx.poll_st();
      return control.send(rx.finish()) ? Next::kIdle : Next::kExit;
    }
  };
  for (;;) {
    Command c;
    const int got = control.receive(c, kPatienceMs);
    if (got < 0) return 0;  // the sender closed the socket: done
    if (got == 0) {
      std::fprintf(stderr, "%s receiver: no command for %d s\n", who, kPatienceMs / 1000);
      return 1;
    }
    switch (c.kind) {
      case Command::Kind::kQuit:
        return 0;
      case Command::Kind::kStop:  // not counting: nothing to report
        if (!control.send(Report{})) return 0;
        break;
      case Command::Kind::kGo:  // zero-copy start-up only (memif_goodput_bench)
        break;
      case Command::Kind::kStart: {
        Report ack;
        ack.leftovers = rx.drain();
        rx.begin(c.variant, c.frame);
        if (!control.send(ack)) return 0;
        const Next next = run();
        if (next != Next::kIdle) return next == Next::kFail ? 1 : 0;
        break;
      }
    }
  }
}

inline constexpr const char* kPeerFlag = "--peer";
inline constexpr int kReadyTimeoutMs = 30'000;

/// EAL's arguments for one side: its CPU, the memif vdevs of `b.links`.
std::vector<std::string> eal_extra(const MemifBenchmark& b, bool receiver,
                                   const std::string& socket, bool zero_copy);

/// The receiver process: EAL on CPU 1, an `Rx` made, ready, then
/// serve_commands(). `Rx` as serve_commands() says; made after EAL.
template <class Rx>
int run_receiver(int argc, char** argv, int control_fd, const MemifBenchmark& b) {
  const bool zero_copy = argc == 5 && std::string_view(argv[4]) == kZeroCopyPeerArg;
  if (argc != 4 && !zero_copy) {
    std::fprintf(stderr, "usage: %s --peer <control fd> <memif socket> [%s]\n", argv[0],
                 kZeroCopyPeerArg);
    return 2;
  }
  ::prctl(PR_SET_NAME, b.peer_name);  // exec'd as /proc/self/exe, ps would say "exe"
  ControlChannel control(control_fd);
  int rc = 1;
  try {
    if (zero_copy) {
      // Our ports are memif clients: the sender's server ports must listen first.
      Command go;
      if (control.receive(go, kReadyTimeoutMs) != 1 || go.kind != Command::Kind::kGo) {
        std::fprintf(stderr, "%s receiver: no go from the sender\n", b.name);
        return 1;
      }
    }
    net::Eal eal(eal_args(b.peer_name, eal_extra(b, true, argv[3], zero_copy)));
    Rx rx;
    // Ready: the server ports listen, so the sender's client ports can
    // connect (zero-copy mode: our client ports have connected).
    if (control.send(Report{})) rc = serve_commands(rx, control, b.name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s receiver: %s\n", b.name, e.what());
  }
  return rc;
}

/// Either side's main. In the benchmark process: takes --min_cpu_share=X
/// (default 0.9) and, if offered, --memif_zero_copy out of argv, starts the
/// receiver, EAL on CPU 0, makes a `Sender` (its ports open; a constructor
/// taking the Peer, and wait_up()), publishes it in `current` while Google
/// Benchmark runs with a CpuShareReporter on `b.counter` against "raw",
/// then stops the receiver. A failure anywhere ends the benchmark with a
/// message and exit status 1.
template <class Rx, class Sender>
int memif_main(int argc, char** argv, const MemifBenchmark& b, Sender*& current) {
  if (const int fd = pmdtest::peer_control_fd(argc, argv, kPeerFlag); fd >= 0) {
    return run_receiver<Rx>(argc, argv, fd, b);
  }
  const double min_share = take_flag(argc, argv, "min_cpu_share", 0.9);
  const bool zero_copy = b.zero_copy_option && take_switch(argc, argv, "memif_zero_copy");
  benchmark::Initialize(&argc, argv);
  int rc = 0;
  try {
    const std::string socket = pmdtest::memif_socket(b.name);
    // Before EAL: a process must not fork once EAL has started.
    Peer peer(b, socket, zero_copy);
    net::Eal eal(eal_args(b.name, eal_extra(b, false, socket, zero_copy)));
    if (b.zero_copy_option) {
      std::printf("memif: %s\n", zero_copy ? "zero-copy receiver (client, zero-copy=yes)"
                                           : "copy mode on both sides");
    }
    // Copy mode: the receiver's server ports listen once it is ready. Zero-copy
    // mode: ours are the servers, open (listening) once Sender is built.
    if (!zero_copy) peer.wait_ready(kReadyTimeoutMs);
    {
      Sender sender(peer);
      if (zero_copy) {
        peer.go();
        peer.wait_ready(kReadyTimeoutMs);
      }
      sender.wait_up();
      current = &sender;
      CpuShareReporter reporter(b.counter, "raw", min_share);
      for (const auto& [variant, reference] : b.pairs) reporter.add_pair(variant, reference);
      benchmark::RunSpecifiedBenchmarks(&reporter);
      current = nullptr;
    }
    if (const int peer_rc = peer.quit(); peer_rc != 0) {
      std::fprintf(stderr, "%s: the receiver process exited with %d\n", b.name, peer_rc);
      rc = 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", b.name, e.what());
    rc = 1;
  }
  benchmark::Shutdown();
  return rc;
}

}  // namespace mercury::bench::memif
