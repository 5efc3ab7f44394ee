// The port a node runs on: what its transport endpoint sends and receives
// Mercury packets through, and what the node manages on it besides (its
// link's state, detaching, drops, the buffers it keeps past a burst). A
// server node and a worker's net core see their ports through this
// interface only, so both run on either implementation.
//
// Two implementations: net::Interface (interface.h), a DPDK port queue pair
// with ARP, checksums and the link emulator, the real datapath; and
// net::MemoryPort (memory_port.h), pure C++ frames in memory joined two by
// two, for unit tests that run an endpoint (or a node built on one) without
// EAL, under a fake clock, with seeded loss, reordering and duplication.
//
// Receive: poll_rx_st() returns parsed packets, each still in its buffer (a
// PacketBuf, opaque here: for an Interface it is the rte_mbuf itself), which
// the caller now owns and hands back with release_st(), a burst at a time
// (or, for an Interface, frees with rte_pktmbuf_free on any thread).
// Send: stage_burst_st() builds a burst of data frames into the TX stage;
// flush_st() sends what is staged. resolve_st() gives the route to a peer.
//
// Buffers kept past a burst: a server keeps gradient buffers in its chunk
// tables and may free them on a shard core. buffer_ops() gives the
// functions for that, the same for every buffer of one kind of port
// (called directly, not per port): free from the thread that holds the
// buffer, a 16-bit mark the holder may keep in it (the server's port
// index), where its data starts, and the facts of the pool it came from.
//
// Costs. Every method is virtual and meant to be called once per burst (the
// endpoint makes five calls a pass) or on the slow path, never per packet:
// the per-packet work happens inside the port, where its own calls are
// direct. The buffer functions are per packet, through one pointer each.
//
// Threading: a port belongs to one core (its net core); every _st method is
// called there. The gauges (drops(), pmd_drops(), rx_pool_free(),
// link_up(), detached()) may be read from any thread, each value whole,
// possibly one refresh old. Nothing here allocates, throws, locks or logs
// after the implementation's constructor.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/counter_list.h"
#include "net/frame.h"

namespace mercury::net {

/// A received frame's buffer. Opaque: only the port that handed it out
/// knows what it is (an Interface's is its rte_mbuf: see mbuf_of()).
struct PacketBuf;

/// A received Mercury packet: its buffer (the caller's now) and what the
/// parser found. parsed.payload points into the buffer.
struct RxPacket {
  PacketBuf* buf;
  ParsedFrame parsed;
};

/// One data frame for stage_burst_st(): where it goes, its Mercury header
/// (payload_len set) and header.payload_len bytes of payload (null when 0);
/// when the header's flags hold wire::flags::kAuth, `auth` goes after it.
struct TxFrame {
  const Route* route;
  const std::byte* payload;
  wire::HeaderFields header;
  wire::AuthBlock auth;
  /// `auth` when the header says so, else nullptr: what the builders take.
  [[nodiscard]] const wire::AuthBlock* auth_block() const {
    return (header.flags & wire::flags::kAuth) != 0 ? &auth : nullptr;
  }
};

// The PMD's own drop counters (struct rte_eth_stats), by reason: frames the
// stack never saw. Not every PMD counts every reason: DPDK 22.11's net_memif
// counts none (a frame it has no mbuf for stays in its ring, uncounted), and
// net_pcap counts rx_nombuf (docs/net.md, "What the PMD drops"). A port that
// is no DPDK port counts none.
#define MERCURY_PORT_PMD_DROPS(X)                                                            \
  X(rx_nombuf, "frames the PMD could not receive: no free mbuf in the RX pool")              \
  X(imissed, "frames the device dropped because its RX queue was full (not polled in time)") \
  X(ierrors, "frames the PMD received in error")                                             \
  X(oerrors, "frames the PMD failed to send")

/// A port's drops as its PMD counts them (rte_eth_stats_get): totals since
/// the port started, 64-bit counters only.
struct PortDrops {
  MERCURY_PORT_PMD_DROPS(MERCURY_COUNTER_DECLARE)

  template <class F>
  void for_each(F&& f) const {MERCURY_PORT_PMD_DROPS(MERCURY_COUNTER_VISIT)} PortDrops& operator+=(
      const PortDrops& o) {
    MERCURY_PORT_PMD_DROPS(MERCURY_COUNTER_ADD)
    return *this;
  }
};

/// What flow control sizes a node's limits by (server/flow_control.h): the
/// pool a received buffer came from.
struct PoolFacts {
  const void* id = nullptr;   ///< the pool's identity (ports whose packets share it share it)
  uint64_t size = 0;          ///< its buffers
  uint32_t cache_size = 0;    ///< per-lcore cache, in buffers (0: none)
  uint32_t cache_lcores = 0;  ///< lcores that may hold such a cache
};

/// ... and the port's own queues: buffers its RX and TX descriptor rings may
/// hold (0 where the PMD does not say).
struct QueueFacts {
  uint32_t rx_descriptors = 0;
  uint32_t tx_descriptors = 0;
};

/// The functions for a received buffer kept past its burst (see the top).
struct BufferOps {
  /// Frees it. An Interface's from any thread; a MemoryPort's on the
  /// thread that drives its ports.
  void (*free)(PacketBuf* buf);
  /// The holder's mark (a node's port index), and setting it.
  uint16_t (*mark)(const PacketBuf* buf);
  void (*set_mark)(PacketBuf* buf, uint16_t mark);
  /// Where its data area starts: payload offsets are kept from here.
  const std::byte* (*data)(const PacketBuf* buf);
  /// The pool it came from.
  PoolFacts (*pool)(const PacketBuf* buf);
};

class PacketPort {
 public:
  /// The most packets poll_rx_st() returns at once.
  static constexpr uint16_t kBurst = 32;
  /// TX stage slots: tx_room() never exceeds it.
  static constexpr uint16_t kStage = 2 * kBurst;

  /// Receives up to `n` (<= kBurst) packets into `out`; returns how many.
  /// Anything that is not a valid Mercury packet for this port is dropped
  /// and counted by the port (ARP is answered there).
  virtual uint16_t poll_rx_st(RxPacket* out, uint16_t n, uint64_t now) = 0;
  /// Hands back `n` buffers that poll_rx_st() gave out.
  virtual void release_st(PacketBuf* const* bufs, uint16_t n) = 0;
  /// The route to (ip, udp_port) if known; otherwise starts resolving it
  /// (an ARP request, at most one per retry interval) and returns false.
  virtual bool resolve_st(uint32_t ip, uint16_t udp_port, Route& out, uint64_t now) = 0;
  /// Free slots in the TX stage.
  [[nodiscard]] virtual uint16_t tx_room() const = 0;
  /// Builds and stages `frames[0..n)` in order, each on its own: a frame
  /// that finds the stage full or no buffer is skipped (counted by the
  /// port), nothing is half-sent. Returns how many were staged.
  virtual uint16_t stage_burst_st(const TxFrame* frames, uint16_t n) = 0;
  /// Sends what is staged; returns how many frames went. What the port
  /// refuses stays staged for the next flush.
  virtual uint16_t flush_st(uint64_t now) = 0;
  /// The IP MTU: a data frame carries payload_per_packet(mtu()) bytes at most.
  [[nodiscard]] virtual uint32_t mtu() const = 0;
  /// Frames the port has room to receive now: its pool's free buffers less
  /// what its own send path keeps (the TX stage and a burst of spares). The
  /// endpoint shares it among its peers as their credit (flow control). A
  /// rough figure (it may walk per-core caches): call it every few passes.
  [[nodiscard]] virtual uint32_t rx_room() const = 0;

  // ---- What a node manages on its port (slow path or control path) ----

  /// The port's name for messages ("net_memif0").
  [[nodiscard]] virtual std::string name() const = 0;
  /// How to free, mark and read a buffer poll_rx_st() handed out.
  [[nodiscard]] virtual const BufferOps& buffer_ops() const = 0;
  /// The port's queues, for flow control (control path).
  [[nodiscard]] virtual QueueFacts queue_facts() const { return {}; }
  /// Frames staged or queued in front of the device, not yet sent.
  [[nodiscard]] virtual uint32_t tx_pending() const = 0;
  /// Frames taken from the RX queue and handed to the device so far (any
  /// thread, each whole, possibly a few frames old).
  struct Traffic {
    uint64_t rx_frames = 0;
    uint64_t tx_frames = 0;
  };
  [[nodiscard]] virtual Traffic traffic() const = 0;
  /// Frames this port dropped, by DropReason (any thread, each whole).
  [[nodiscard]] virtual const std::array<uint64_t, kDropReasonCount>& drops() const = 0;
  /// Reads what the device counts (its drops, the RX pool's free buffers,
  /// the link's state) for the gauges below: slow path, the owner's thread
  /// (a DPDK PMD may lock or make a system call there).
  virtual void refresh_port_stats_st() {}
  /// The device's drops as of the last refresh (any thread).
  [[nodiscard]] virtual PortDrops pmd_drops() const { return {}; }
  /// Gauges as of the last refresh (any thread): the RX pool's free
  /// buffers, and 1 when the link was up.
  [[nodiscard]] virtual uint64_t rx_pool_free() const { return rx_room(); }
  [[nodiscard]] virtual uint64_t link_up() const { return 1; }
  /// Whether the node detaches this port once every peer behind it left,
  /// before they close the link (net_memif: docs/net.md, "Ports").
  [[nodiscard]] virtual bool detach_when_peers_leave() const { return false; }
  /// Detached, the port calls its device no more (see Interface).
  virtual void set_detached_st(bool) {}
  [[nodiscard]] virtual uint64_t detached() const { return 0; }
  /// The node saw its job start at `now`: a link emulator's rate schedule
  /// counts from here.
  virtual void start_link_schedule_st(uint64_t) {}
  /// Keep the link open this much longer when the port is closed (a leaving
  /// worker's memif link, so the server's last ACKs get through).
  virtual void linger(std::chrono::milliseconds) {}

 protected:
  ~PacketPort() = default;
};

}  // namespace mercury::net
