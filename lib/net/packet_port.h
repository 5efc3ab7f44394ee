// The port a transport endpoint sends and receives Mercury packets through:
// what the endpoint needs of the network, and nothing else.
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
// Costs. Every method is virtual and meant to be called once per burst (the
// endpoint makes five calls a pass), never per packet: the per-packet work
// happens inside the port, where its own calls are direct.
//
// Threading: a port belongs to one core (its net core); every _st method is
// called there. Nothing here allocates, throws, locks or logs after the
// implementation's constructor.
#pragma once

#include <cstddef>
#include <cstdint>

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

 protected:
  ~PacketPort() = default;
};

}  // namespace mercury::net
