// An in-memory net::PacketPort: pure C++, no DPDK, for unit tests of
// whatever runs on a port (the transport endpoint, a node built on one).
//
// Two MemoryPorts joined by connect() form a link: what one flushes, the
// other receives, as real Ethernet/IPv4/UDP/Mercury frames built with
// net/frame.h's builders (software checksums) and parsed with parse_frame on
// receipt, so a test sees exactly the headers a NIC would carry. Each
// direction can be impaired from a seed (MemoryLinkParams): loss,
// duplication, reordering (a frame held back behind the next one), a cut
// (nothing passes) to play a dead peer, and a test's own rule (drop_if) for
// scripted losses. Routes resolve at once to the
// other end of the link (no ARP); an address that is not the other end
// never resolves.
//
// Buffers. Each port owns a fixed pool of frame buffers (MemoryPortOptions::
// buffers), taken when a frame is staged and returned by release_st() of
// whichever port received it (or when the link drops it). A PacketBuf of a
// MemoryPort is one of these buffers: it is not an rte_mbuf. buffers_free()
// lets a test check that nothing leaked.
//
// Who pays for what (MemoryPortOptions). By default a port works as a
// software stack over net_ring does: stage_burst_st() copies each payload
// into its frame and sums it for the UDP checksum, and poll_rx_st() verifies
// the sum, all on the CPU of the port's caller. Two options make a port cost
// what a NIC's does, for benchmarks that time one node (benchmarks/server):
// `udp_checksum: false` sends a zero UDP checksum and verifies none (a NIC
// offloads both, as Interface does with InterfaceOptions::udp_checksum), and
// `tx_by_reference: true` stages only the headers and a reference to the
// payload, which the receiving port copies into the frame when it takes it
// (poll_rx_st): the copy a NIC's DMA makes, charged to the receiver's CPU,
// not the sender's. Like a NIC reading it by DMA after tx_burst, such a
// frame carries what its payload holds when the receiver takes it: the
// sender must leave the payload alone until then (or accept that a frame
// still queued carries the newer bytes, which its UDP checksum, if any,
// then refuses).
//
// Threading: none; every port of a test is driven from one thread, time is
// the `now` the caller passes. Nothing allocates after construction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/counter_list.h"
#include "base/owner.h"
#include "net/frame.h"
#include "net/packet_port.h"

namespace mercury::net {

/// A test's own loss rule: true drops the frame whose Mercury header is `h`.
using DropFilter = bool (*)(void* context, const wire::HeaderFields& h);

/// How the link impairs what this port sends (decisions drawn from `seed`).
struct MemoryLinkParams {
  double loss = 0;       ///< probability a frame is dropped
  double duplicate = 0;  ///< probability a frame arrives twice
  double reorder = 0;    ///< probability a frame is held back behind the next one
  bool cut = false;      ///< nothing passes (a dead or unplugged peer)
  uint64_t seed = 1;
  DropFilter drop_if = nullptr;  ///< asked for every frame first (scripted losses)
  void* drop_context = nullptr;
};

struct MemoryPortOptions {
  uint32_t mtu = 1500;      ///< IP MTU
  uint32_t buffers = 1024;  ///< frame buffers of this port (TX), and its RX queue's length
  /// false: UDP checksum 0 on send, none verified on receipt (a NIC's
  /// offload; InterfaceOptions::udp_checksum). Both ends of a link must agree.
  bool udp_checksum = true;
  /// true: what this port sends carries its payload by reference, copied
  /// into the frame by the receiving port's poll_rx_st (see the top).
  bool tx_by_reference = false;
};

#define MERCURY_MEMORY_PORT_COUNTERS(X)                                  \
  X(tx_frames, "frames flushed onto the link")                           \
  X(tx_stage_full, "stage_burst_st found the stage full")                \
  X(tx_no_buffer, "stage_burst_st found no free buffer")                 \
  X(link_lost, "frames the link dropped (loss, cut, or not connected)")  \
  X(link_duplicated, "frames the link delivered twice")                  \
  X(link_reordered, "frames the link held back behind the next one")     \
  X(rx_overflow, "frames dropped because the receiver's queue was full") \
  X(rx_frames, "frames taken from the RX queue")                         \
  X(rx_mercury, "valid Mercury packets handed up")                       \
  X(rx_arp, "ARP frames (ignored: routes resolve without ARP)")          \
  X(rx_copied_in, "payloads copied in on receipt (sent by reference)")   \
  X(resolve_failed, "resolve_st for an address that is not the other end")

struct MemoryPortCounters {
  MERCURY_MEMORY_PORT_COUNTERS(MERCURY_COUNTER_DECLARE)
  std::array<uint64_t, kDropReasonCount> drops{};  ///< received frames parse_frame refused

  template <class F>
  void for_each(F&& f) const {
    MERCURY_MEMORY_PORT_COUNTERS(MERCURY_COUNTER_VISIT)
    base::visit_array(f, "drop_", drops,
                      [](size_t i) { return drop_reason_name(static_cast<DropReason>(i)); });
  }
  [[nodiscard]] uint64_t drop(DropReason r) const { return drops[static_cast<size_t>(r)]; }
};

class MemoryPort final : public PacketPort {
 public:
  /// Control path: allocates the buffers. Throws std::invalid_argument on an
  /// MTU outside [576, kMaxMtu] or no buffers.
  MemoryPort(const LocalAddr& local, const MemoryPortOptions& options = {});
  ~MemoryPort();
  MemoryPort(const MemoryPort&) = delete;
  MemoryPort& operator=(const MemoryPort&) = delete;

  /// Joins two ports. Destroying one cuts the link and takes its frames
  /// off the other's queue; a buffer of it that a receiver still holds must
  /// have been released before.
  static void connect(MemoryPort& a, MemoryPort& b);
  /// Impairs what this port sends from now on (and reseeds its draws).
  void set_link(const MemoryLinkParams& params);

  // PacketPort.
  uint16_t poll_rx_st(RxPacket* out, uint16_t n, uint64_t now) override;
  void release_st(PacketBuf* const* bufs, uint16_t n) override;
  bool resolve_st(uint32_t ip, uint16_t udp_port, Route& out, uint64_t now) override;
  [[nodiscard]] uint16_t tx_room() const override {
    return static_cast<uint16_t>(kStage - staged_);
  }
  uint16_t stage_burst_st(const TxFrame* frames, uint16_t n) override;
  uint16_t flush_st(uint64_t now) override;
  [[nodiscard]] uint32_t mtu() const override { return mtu_; }
  /// Its own free buffers (a frame arrives in its sender's buffer, as over
  /// net_ring, so this is an approximation, as it is there).
  [[nodiscard]] uint32_t rx_room() const override { return buffers_free(); }
  [[nodiscard]] std::string name() const override;
  /// Freed to their own port's pool, on the thread that drives the ports;
  /// the mark is a field of the buffer; the pool facts are its port's
  /// buffers (no per-core cache).
  [[nodiscard]] const BufferOps& buffer_ops() const override;
  [[nodiscard]] uint32_t tx_pending() const override { return staged_; }
  [[nodiscard]] Traffic traffic() const override {
    return {counters_.rx_frames, counters_.tx_frames};
  }
  [[nodiscard]] const std::array<uint64_t, kDropReasonCount>& drops() const override {
    return counters_.drops;
  }

  /// Puts a raw frame into this port's RX queue, as if it came off the link
  /// (a test's synthetic packet). False when no buffer is free or it does
  /// not fit one.
  bool inject_st(std::span<const std::byte> frame);

  [[nodiscard]] const LocalAddr& local() const { return local_; }
  [[nodiscard]] const MemoryPortCounters& counters() const { return counters_; }
  /// Free buffers of this port's own pool; equals options.buffers when
  /// nothing is staged, on the link, queued or held by a receiver.
  [[nodiscard]] uint32_t buffers_free() const { return static_cast<uint32_t>(free_.size()); }
  [[nodiscard]] uint32_t buffers() const { return static_cast<uint32_t>(buffers_.size()); }

 private:
  struct Buffer {
    MemoryPort* owner;
    std::byte* data;
    uint32_t len;   // the bytes in `data` (the headers alone while `ref` is set)
    uint16_t mark;  // BufferOps::mark
    // Sent by reference: the payload, still the sender's, that goes after
    // the headers when the receiver takes the frame (null: none).
    const std::byte* ref;
    uint32_t ref_len;
  };
  Buffer* take_buffer();
  static void give_back(Buffer* b) { b->owner->free_.push_back(b); }
  static const BufferOps kBufferOps;
  // The link's fate for one frame, then into the peer's queue.
  void transmit(Buffer* b);
  bool deliver(Buffer* b);  // into this port's RX queue; false: full (dropped)
  bool draw(double p);
  bool filtered(const Buffer* b) const;

  LocalAddr local_;
  uint32_t mtu_;
  uint32_t frame_capacity_;
  ChecksumMode tx_mode_;
  bool verify_udp_;
  bool tx_by_reference_;
  MemoryPort* peer_ = nullptr;
  MemoryLinkParams link_;
  uint64_t rng_ = 1;
  std::vector<std::byte> memory_;  // the buffers' bytes, 64-byte aligned slots
  std::vector<Buffer> buffers_;
  std::vector<Buffer*> free_;  // capacity = buffers_.size(): never reallocates
  std::vector<Buffer*> rx_;    // ring of received frames
  size_t rx_head_ = 0;
  size_t rx_count_ = 0;
  Buffer* held_ = nullptr;  // a frame held back (reordering)
  std::array<Buffer*, kStage> stage_{};
  uint16_t staged_ = 0;
  MemoryPortCounters counters_;
  base::Owner owner_;  // the thread that drives the ports
};

}  // namespace mercury::net
