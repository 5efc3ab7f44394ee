// One network interface of a Mercury endpoint: a port queue pair with its
// addresses, its ARP cache, and the Ethernet/IPv4/UDP send and receive paths.
// It is the DPDK implementation of net::PacketPort (packet_port.h), the
// port a transport endpoint runs on.
//
// Receive: poll_rx_st() takes a burst from the RX queue, answers and learns
// ARP by itself, drops and counts (by DropReason and wire::Reject) anything
// that is not a valid Mercury packet for this endpoint, and returns the rest
// still in their mbufs, parsed, so the payload can be placed without a copy
// by whoever consumes it. An RxPacket's PacketBuf is the mbuf (mbuf_of());
// the caller frees it afterwards, with release_st() or rte_pktmbuf_free.
// Send: stage_data_st() builds a frame in a fresh mbuf (headers + one pass
// over the payload, checksum fused or offloaded; or, where the port allows
// it, the headers alone with the payload chained by reference: payload_ref.h)
// into a TX stage of one burst;
// stage_burst_st() does it for a burst of frames; flush_st() hands the stage
// to the PMD (through the link emulator when one is attached), keeping what
// the PMD refuses for the next flush.
//
// Port statistics: refresh_port_stats_st() reads what the PMD counts as
// dropped (rte_eth_stats_get: rx_nombuf, imissed, ierrors, oerrors), the RX
// pool's free mbufs and the link's state into pmd_drops(), rx_pool_free()
// and link_up(). It is the owner's slow work (every 100 ms in the server's
// loop), never per burst: the PMD may take a lock or make a system call
// there. Other threads read the values as they read counters() (each word
// whole, possibly one refresh old).
//
// Detaching: set_detached_st(true) makes the interface stop calling the PMD
// (poll_rx_st() receives nothing, flush_st() frees what is staged, counted
// as tx_detached, and leaves the link emulator's frames queued) until
// set_detached_st(false). Its owner detaches a net_memif port whose peer is
// about to close the link: DPDK 22.11's memif unmaps a link's shared memory
// when the other end goes, under any core inside a burst on it (docs/net.md).
//
// RX tap: set_rx_tap() installs a function that sees every received burst,
// raw, before it is parsed (a recorder writing a pcap trace, a test counting
// frames). Null by default; the cost when unset is one predictable branch per
// non-empty burst.
//
// Threading: the whole object belongs to one core (its net core); every
// method that is that core's ends in _st and asserts it (base/owner.h: the
// first _st call claims the interface, so it may be built on the control
// thread and polled by another). Nothing here allocates, throws, locks or logs after
// construction. The class is final, so calls through an Interface& are
// direct; only calls through a PacketPort& are virtual.
#pragma once

#include <rte_mbuf.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <span>

#include "base/owner.h"
#include "net/arp.h"
#include "net/frame.h"
#include "net/mempool.h"
#include "net/packet_port.h"
#include "net/port.h"

namespace mercury::net {

class LinkEmulator;

struct InterfaceCounters {
  uint64_t rx_frames = 0;   ///< frames taken from the RX queue
  uint64_t rx_mercury = 0;  ///< valid Mercury packets handed up
  uint64_t rx_bytes = 0;    ///< bytes of those frames
  uint64_t tx_frames = 0;   ///< frames accepted by the PMD (or the emulator)
  uint64_t tx_bytes = 0;
  uint64_t tx_no_mbuf = 0;       ///< stage_data_st() found the mempool empty
  uint64_t tx_stage_full = 0;    ///< stage_data_st() found the stage full (back-pressure)
  uint64_t tx_by_reference = 0;  ///< frames staged with their payload by reference
  uint64_t tx_no_shell = 0;      ///< payloads copied because every shell mbuf was out
  uint64_t tx_taken_in = 0;      ///< by-reference payloads copied in: refused by the PMD
  uint64_t tx_detached = 0;      ///< frames freed unsent: the interface was detached
  uint64_t arp_requests_sent = 0;
  uint64_t arp_replies_sent = 0;
  uint64_t arp_learned = 0;
  std::array<uint64_t, kDropReasonCount> drops{};
  std::array<uint64_t, wire::kRejectCount> rejects{};
  [[nodiscard]] uint64_t total_drops() const;
};

/// The mbuf that a PacketBuf of an Interface is, and back. (A PacketBuf of
/// another port is no mbuf.)
inline rte_mbuf* mbuf_of(PacketBuf* buf) { return reinterpret_cast<rte_mbuf*>(buf); }
inline PacketBuf* buf_of(rte_mbuf* mbuf) { return reinterpret_cast<PacketBuf*>(mbuf); }

/// Sees a received burst before it is parsed: `frames[0..count)` are the
/// mbufs as the PMD returned them (count >= 1), still owned by the
/// interface. The tap may read them; it must not free, keep or modify them.
/// It runs on the interface's core, inside poll_rx_st(), with the `now` given
/// there, so what it costs is the datapath's cost.
using RxTap = void (*)(void* context, rte_mbuf* const* frames, uint16_t count, uint64_t now);

struct InterfaceOptions {
  uint16_t rx_queue = 0;
  uint16_t tx_queue = 0;
  bool udp_checksum = true;  ///< false: send 0, do not verify
  /// Send payloads by reference where the port allows it (payload_ref.h);
  /// false copies every payload into the frame's mbuf.
  bool tx_by_reference = true;
  size_t arp_capacity = 256;
  uint64_t arp_retry_ticks = 0;  ///< 0: 100 ms at the TSC rate
};

class Interface final : public PacketPort {
 public:
  /// Bytes the send path leaves in front of a data frame so that its payload
  /// starts on a 64-byte boundary (mempools reserve them: frame_bytes_for_mtu).
  static constexpr uint16_t kPayloadAlignPad = (64 - kFrameOverhead % 64) % 64;
  /// How many packets ahead the send path warms a frame's header lines.
  static constexpr uint16_t kPrefetchAhead = 4;
  /// Payloads from this size up go by reference (payload_ref.h) on ports
  /// that allow it; below it a copy costs less than a second segment.
  static constexpr uint16_t kByReferenceMin = 1024;
  /// Shell mbufs for by-reference payloads: the TX stage is all that holds
  /// them past a send, so a few stages' worth never runs out.
  static constexpr uint32_t kShells = 511;
  // kBurst and kStage: PacketPort's.

  Interface(Port& port, Mempool& pool, const LocalAddr& local, const InterfaceOptions& opts);
  ~Interface();
  Interface(const Interface&) = delete;
  Interface& operator=(const Interface&) = delete;

  /// Receives up to `n` frames (n <= kBurst); returns how many Mercury packets
  /// were written to `out`. ARP replies it owes are staged for TX.
  uint16_t poll_rx_st(RxPacket* out, uint16_t n, uint64_t now) override;
  /// Frees the mbufs (rte_pktmbuf_free_bulk).
  void release_st(PacketBuf* const* bufs, uint16_t n) override;
  /// mbufs: freed on any thread, marked in mbuf->port, data from buf_addr,
  /// pool facts from mbuf->pool.
  [[nodiscard]] const BufferOps& buffer_ops() const override;
  [[nodiscard]] std::string name() const override { return port_.name(); }
  /// The RX and TX queues' descriptors (rte_eth_*_queue_info_get).
  [[nodiscard]] QueueFacts queue_facts() const override;

  /// The route to (ip, port) if its MAC is known; otherwise sends an ARP
  /// request (at most one per retry interval) and returns false.
  bool resolve_st(uint32_t ip, uint16_t udp_port, Route& out, uint64_t now) override;
  /// A static ARP entry (from the configuration).
  bool add_static_arp(uint32_t ip, const MacAddr& mac) { return arp_.add_static(ip, mac); }

  /// Free slots in the TX stage.
  [[nodiscard]] uint16_t tx_room() const override {
    return static_cast<uint16_t>(kStage - staged_);
  }
  /// Builds one data frame and stages it. False (counted) when the stage is
  /// full or the mempool is empty; nothing is half-sent.
  bool stage_data_st(const Route& route, const wire::HeaderFields& h,
                     std::span<const std::byte> payload, const wire::AuthBlock* auth = nullptr);
  /// stage_data_st() for each frame in turn; returns how many were staged.
  uint16_t stage_burst_st(const TxFrame* frames, uint16_t n) override;
  /// Hands staged frames to the PMD (or the emulator); returns how many went.
  uint16_t flush_st(uint64_t now) override;
  [[nodiscard]] uint32_t mtu() const override { return port_.mtu(); }
  [[nodiscard]] uint32_t rx_room() const override;

  /// Installs `tap` (nullptr removes it), called with `context` once per
  /// non-empty received burst. Set it from the interface's core, or before
  /// that core starts polling; `context` must outlive the installation.
  void set_rx_tap_st(RxTap tap, void* context) {
    MERCURY_OWNED(owner_);
    rx_tap_ = tap;
    rx_tap_context_ = context;
  }

  /// Detached (true), the interface calls the PMD no more until attached
  /// again (false): see the top of this file. The owning core.
  void set_detached_st(bool detached) override {
    MERCURY_OWNED(owner_);
    std::atomic_ref<uint64_t>(detached_).store(detached ? 1 : 0, std::memory_order_relaxed);
  }
  /// Gauge: 1 while detached, else 0. Any thread.
  [[nodiscard]] uint64_t detached() const override {
    return std::atomic_ref<const uint64_t>(detached_).load(std::memory_order_relaxed);
  }
  /// Frames not yet handed to the PMD: the stage's and the link emulator's.
  [[nodiscard]] uint32_t tx_pending() const override;

  /// Attaches a link emulator in front of the TX queue (nullptr detaches).
  /// The emulator must outlive its attachment.
  void attach_emulator(LinkEmulator* e) { emulator_ = e; }
  /// Starts the attached emulator's rate schedule (link.rate_steps) at TSC
  /// `now`: its owner calls it when the node sees its job start.
  void start_link_schedule_st(uint64_t now) override;

  [[nodiscard]] const InterfaceCounters& counters() const { return counters_; }
  [[nodiscard]] Traffic traffic() const override {
    return {std::atomic_ref<const uint64_t>(counters_.rx_frames).load(std::memory_order_relaxed),
            std::atomic_ref<const uint64_t>(counters_.tx_frames).load(std::memory_order_relaxed)};
  }
  [[nodiscard]] const std::array<uint64_t, kDropReasonCount>& drops() const override {
    return counters_.drops;
  }
  /// A net_memif port: detached once its workers left (see the top).
  [[nodiscard]] bool detach_when_peers_leave() const override {
    return port_.driver() == "net_memif";
  }
  void linger(std::chrono::milliseconds ms) override { port_.linger(ms); }
  /// Reads the PMD's drop counters, the RX pool's free mbufs and the link's
  /// state (Port::read_drops, rx_pool_free, link_up) into pmd_drops(),
  /// rx_pool_free() and link_up(). The owning core's slow path (a few
  /// microseconds; the PMD may lock or make a system call), or the control
  /// path before that core polls.
  void refresh_port_stats_st() override;
  /// The PMD's drops as of the last refresh (zero before the first; a
  /// refresh the PMD could not answer changes nothing). Any thread: each
  /// counter is loaded whole.
  [[nodiscard]] PortDrops pmd_drops() const override;
  /// Gauge: free mbufs of the RX pool at the last refresh (the constructor
  /// makes the first). Any thread.
  [[nodiscard]] uint64_t rx_pool_free() const override {
    return std::atomic_ref<const uint64_t>(rx_pool_free_).load(std::memory_order_relaxed);
  }
  /// Gauge: 1 when the link was up at the last refresh, else 0. Any thread.
  [[nodiscard]] uint64_t link_up() const override {
    return std::atomic_ref<const uint64_t>(link_up_).load(std::memory_order_relaxed);
  }
  /// mbufs of this interface's pool it holds (staged or spare): for leak checks.
  [[nodiscard]] uint32_t mbufs_held() const { return staged_ + spare_; }
  /// Frames whose payload still refers to its sender's memory (staged, or
  /// handed to the PMD and not yet freed): 0 after every flush_st() that
  /// emptied the stage, since these PMDs copy within tx_burst.
  [[nodiscard]] uint32_t payloads_by_reference() const {
    return shells_ ? rte_mbuf_ext_refcnt_read(&shared_) - 1u : 0u;
  }
  [[nodiscard]] const LocalAddr& local() const { return local_; }
  [[nodiscard]] Port& port() { return port_; }
  [[nodiscard]] ChecksumMode checksum_mode() const { return tx_mode_; }

 private:
  void handle_arp_st(const ParsedFrame& f, uint64_t now);
  bool stage_arp_st(uint16_t oper, const MacAddr& mac, uint32_t ip);
  void count_drop(const ParsedFrame& f);

  Port& port_;
  Mempool& pool_;
  LocalAddr local_;
  InterfaceOptions opts_;
  ChecksumMode tx_mode_;
  bool verify_udp_;
  ArpTable arp_;
  LinkEmulator* emulator_ = nullptr;
  RxTap rx_tap_ = nullptr;
  void* rx_tap_context_ = nullptr;
  rte_mbuf* take_mbuf_st();
  /// Attaches `payload` to a shell chained after the headers in `m`; false
  /// (nothing changed) when no shell is free.
  bool chain_payload_st(rte_mbuf* m, std::span<const std::byte> payload);
  /// An mbuf for the next staged frame, or nullptr (counted) when the stage
  /// is full or the pool is dry.
  rte_mbuf* mbuf_for_stage_st();

  uint16_t staged_ = 0;
  std::array<rte_mbuf*, kStage> stage_{};
  std::array<uint32_t, kStage> stage_len_{};  ///< frame bytes of each staged mbuf
  // Fresh mbufs taken from the pool a burst at a time: one bulk get instead
  // of a pool access per packet.
  uint16_t spare_ = 0;
  std::array<rte_mbuf*, kBurst> spares_{};
  InterfaceCounters counters_;
  // Written by refresh_port_stats_st() with relaxed atomic stores, read by
  // any thread with relaxed loads: cold, next to the counters.
  PortDrops pmd_drops_;
  uint64_t rx_pool_free_ = 0;
  uint64_t link_up_ = 0;
  uint64_t detached_ = 0;  // written by the owning core only (set_detached_st)
  // The lcores whose caches rx_room() adds to the pool's store, read again by
  // each refresh_port_stats_st().
  CacheLcores cache_lcores_;
  // By-reference payloads: a pool of data-less shell mbufs, and the shared
  // info of their external buffers, whose count the interface keeps above 0
  // (the memory is never freed through it).
  std::optional<Mempool> shells_;
  rte_mbuf_ext_shared_info shared_{};
  base::Owner owner_;  // the net core that polls the port
};

}  // namespace mercury::net
