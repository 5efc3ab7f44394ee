#include "net/interface.h"

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>

#include <atomic>
#include <numeric>
#include <string>

#include "net/link_emulator.h"
#include "net/payload_ref.h"

namespace mercury::net {

uint64_t InterfaceCounters::total_drops() const {
  return std::accumulate(drops.begin(), drops.end(), uint64_t{0});
}

Interface::Interface(Port& port, Mempool& pool, const LocalAddr& local,
                     const InterfaceOptions& opts)
    : port_(port),
      pool_(pool),
      local_(local),
      opts_(opts),
      tx_mode_(!opts.udp_checksum           ? ChecksumMode::kNone
               : port.tx_checksum_offload() ? ChecksumMode::kOffload
                                            : ChecksumMode::kSoftware),
      verify_udp_(opts.udp_checksum),
      arp_(opts.arp_capacity,
           opts.arp_retry_ticks != 0 ? opts.arp_retry_ticks : rte_get_tsc_hz() / 10) {
  if (opts.tx_by_reference && port.tx_by_reference()) {
    // Pool names are process-wide, and a port may have several interfaces.
    static std::atomic<uint32_t> serial{0};
    shells_.emplace("shells" + std::to_string(serial++), kShells, 32, 0);
    shared_.free_cb = [](void*, void*) {};
    rte_mbuf_ext_refcnt_set(&shared_, 1);
  }
  refresh_port_stats_st();
  owner_.hand_over();  // built here; the core that polls it owns it
}

Interface::~Interface() {
  if (staged_ > 0) rte_pktmbuf_free_bulk(stage_.data(), staged_);
  if (spare_ > 0) rte_pktmbuf_free_bulk(spares_.data(), spare_);
}

namespace {

// The headers are written with ordinary stores, which must first read their
// cache lines: warm a frame's first two lines before it is built (the payload
// goes in with whole-line stores that need no read).
void warm_frame(const rte_mbuf* m) {
  const auto* d =
      static_cast<const char*>(m->buf_addr) + RTE_PKTMBUF_HEADROOM + Interface::kPayloadAlignPad;
  __builtin_prefetch(d, 1, 3);
  __builtin_prefetch(d + 64, 1, 3);
}

}  // namespace

rte_mbuf* Interface::take_mbuf_st() {
  if (spare_ == 0) {
    if (rte_pktmbuf_alloc_bulk(pool_.get(), spares_.data(), kBurst) != 0) {
      // Nearly dry: one at a time, so the last mbufs are still usable.
      return rte_pktmbuf_alloc(pool_.get());
    }
    spare_ = kBurst;
    for (uint16_t i = 1; i <= kPrefetchAhead; ++i) warm_frame(spares_[kBurst - i]);
  }
  rte_mbuf* m = spares_[--spare_];
  if (spare_ >= kPrefetchAhead) warm_frame(spares_[spare_ - kPrefetchAhead]);
  return m;
}

void Interface::count_drop(const ParsedFrame& f) {
  ++counters_.drops[static_cast<size_t>(f.drop)];
  if (f.drop == DropReason::kMercury) ++counters_.rejects[static_cast<size_t>(f.reject)];
}

uint16_t Interface::poll_rx_st(RxPacket* out, uint16_t n, uint64_t now) {
  MERCURY_OWNED(owner_);
  if (detached_ != 0) [[unlikely]] {
    return 0;
  }
  rte_mbuf* burst[kBurst];
  const uint16_t got = port_.rx_burst(opts_.rx_queue, burst, n < kBurst ? n : kBurst);
  counters_.rx_frames += got;
  // A tap (a trace recorder) sees the burst as received, before any frame is
  // parsed, answered or freed.
  if (rx_tap_ != nullptr && got != 0) [[unlikely]] {
    rx_tap_(rx_tap_context_, burst, got, now);
  }
  uint16_t kept = 0;
  for (uint16_t i = 0; i < got; ++i) {
    rte_mbuf* m = burst[i];
    if (i + 1 < got) rte_prefetch0(rte_pktmbuf_mtod(burst[i + 1], void*));
    ParsedFrame& f = out[kept].parsed;
    if (m->nb_segs != 1) {
      f.kind = FrameKind::kDrop;
      f.drop = DropReason::kSegmented;
      count_drop(f);
      rte_pktmbuf_free(m);
      continue;
    }
    RxChecks checks;
    const uint64_t ip_flags = m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK;
    const uint64_t l4_flags = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
    // The NIC's "good" verdict spares the software pass; "bad" falls through
    // to the software check, which then counts the drop by its real reason.
    checks.verify_ip_checksum = ip_flags != RTE_MBUF_F_RX_IP_CKSUM_GOOD;
    checks.verify_udp_checksum = verify_udp_ && l4_flags != RTE_MBUF_F_RX_L4_CKSUM_GOOD;
    parse_frame({rte_pktmbuf_mtod(m, const std::byte*), m->data_len}, local_, checks, f);
    switch (f.kind) {
      case FrameKind::kMercury:
        counters_.rx_bytes += m->data_len;
        out[kept++].buf = buf_of(m);
        break;
      case FrameKind::kArp:
        handle_arp_st(f, now);
        rte_pktmbuf_free(m);
        break;
      case FrameKind::kDrop:
        count_drop(f);
        rte_pktmbuf_free(m);
        break;
    }
  }
  counters_.rx_mercury += kept;
  return kept;
}

namespace {

// An mbuf kept past its burst (PacketPort::buffer_ops): rte_pktmbuf_free is
// safe from any thread; the mark lives in mbuf->port, which only the
// receiving node reads once the PMD has handed the mbuf over (net_ring leaves
// it unset).
void free_mbuf(PacketBuf* b) { rte_pktmbuf_free(mbuf_of(b)); }
uint16_t mbuf_mark(const PacketBuf* b) { return reinterpret_cast<const rte_mbuf*>(b)->port; }
void set_mbuf_mark(PacketBuf* b, uint16_t mark) { mbuf_of(b)->port = mark; }
const std::byte* mbuf_data(const PacketBuf* b) {
  return static_cast<const std::byte*>(reinterpret_cast<const rte_mbuf*>(b)->buf_addr);
}
PoolFacts mbuf_pool(const PacketBuf* b) {
  const rte_mempool* pool = reinterpret_cast<const rte_mbuf*>(b)->pool;
  return PoolFacts{.id = pool,
                   .size = pool->size,
                   .cache_size = pool->cache_size,
                   .cache_lcores = rte_lcore_count()};
}
constexpr BufferOps kMbufOps{&free_mbuf, &mbuf_mark, &set_mbuf_mark, &mbuf_data, &mbuf_pool};

}  // namespace

const BufferOps& Interface::buffer_ops() const { return kMbufOps; }

QueueFacts Interface::queue_facts() const {
  QueueFacts f;
  rte_eth_rxq_info rxq{};
  if (rte_eth_rx_queue_info_get(port_.id(), opts_.rx_queue, &rxq) == 0)
    f.rx_descriptors = rxq.nb_desc;
  rte_eth_txq_info txq{};
  if (rte_eth_tx_queue_info_get(port_.id(), opts_.tx_queue, &txq) == 0)
    f.tx_descriptors = txq.nb_desc;
  return f;
}

void Interface::release_st(PacketBuf* const* bufs, uint16_t n) {
  MERCURY_OWNED(owner_);
  // The endpoint's burst is one PacketBuf* array; rte_pktmbuf_free_bulk
  // takes rte_mbuf*, so the pointers are converted, a burst at a time.
  rte_mbuf* mbufs[kBurst];
  while (n > 0) {
    const uint16_t k = n < kBurst ? n : kBurst;
    for (uint16_t i = 0; i < k; ++i) mbufs[i] = mbuf_of(bufs[i]);
    rte_pktmbuf_free_bulk(mbufs, k);
    bufs += k;
    n = static_cast<uint16_t>(n - k);
  }
}

void Interface::handle_arp_st(const ParsedFrame& f, uint64_t) {
  if (arp_.learn(f.src_ip, f.src_mac)) ++counters_.arp_learned;
  if (f.arp_oper == 1 && stage_arp_st(2, f.src_mac, f.src_ip)) ++counters_.arp_replies_sent;
}

rte_mbuf* Interface::mbuf_for_stage_st() {
  if (staged_ == kStage) {
    ++counters_.tx_stage_full;
    return nullptr;
  }
  rte_mbuf* m = take_mbuf_st();
  if (m == nullptr) ++counters_.tx_no_mbuf;
  return m;
}

bool Interface::stage_arp_st(uint16_t oper, const MacAddr& mac, uint32_t ip) {
  rte_mbuf* m = mbuf_for_stage_st();
  if (m == nullptr) return false;
  auto* p = rte_pktmbuf_mtod(m, std::byte*);
  const size_t len = build_arp_frame({p, kMinFrame}, oper, local_, mac, ip);
  m->data_len = m->pkt_len = static_cast<uint32_t>(len);
  stage_len_[staged_] = m->pkt_len;
  stage_[staged_++] = m;
  return true;
}

bool Interface::resolve_st(uint32_t ip, uint16_t udp_port, Route& out, uint64_t now) {
  MERCURY_OWNED(owner_);
  if (const MacAddr* mac = arp_.lookup(ip)) {
    out = Route{*mac, ip, udp_port};
    out.frame = make_frame_template(local_, out);
    return true;
  }
  if (arp_.should_request(ip, now) && stage_arp_st(1, MacAddr{}, ip)) {
    ++counters_.arp_requests_sent;
  }
  return false;
}

bool Interface::chain_payload_st(rte_mbuf* m, std::span<const std::byte> payload) {
  rte_mbuf* shell = rte_pktmbuf_alloc(shells_->get());
  if (shell == nullptr) {
    ++counters_.tx_no_shell;
    return false;
  }
  // The PMD only reads the payload (it copies it out within tx_burst), so
  // the const is safe to drop; no IOVA, as nothing DMAs from it.
  rte_mbuf_ext_refcnt_update(&shared_, 1);
  rte_pktmbuf_attach_extbuf(shell, const_cast<std::byte*>(payload.data()), RTE_BAD_IOVA,
                            static_cast<uint16_t>(payload.size()), &shared_);
  shell->data_len = static_cast<uint16_t>(payload.size());
  m->next = shell;
  m->nb_segs = 2;
  ++counters_.tx_by_reference;
  return true;
}

bool Interface::stage_data_st(const Route& route, const wire::HeaderFields& h,
                              std::span<const std::byte> payload, const wire::AuthBlock* auth) {
  MERCURY_OWNED(owner_);
  rte_mbuf* m = mbuf_for_stage_st();
  if (m == nullptr) return false;
  // Start the frame so that its payload lands on a cache-line boundary: the
  // payload copy is the bulk of the send path, and a misaligned destination
  // makes every store straddle two lines.
  m->data_off = RTE_PKTMBUF_HEADROOM + kPayloadAlignPad;
  auto* p = rte_pktmbuf_mtod(m, std::byte*);
  const std::span<std::byte> room{p, rte_pktmbuf_tailroom(m)};
  size_t len;
  if (shells_ && payload.size() >= kByReferenceMin && chain_payload_st(m, payload)) {
    FrameTemplate made;
    const FrameTemplate* t = &route.frame;
    if (!route.frame.valid) {
      made = make_frame_template(local_, route);
      t = &made;
    }
    m->data_len = static_cast<uint16_t>(build_data_headers(room, *t, h, payload, tx_mode_, auth));
    len = m->data_len + payload.size();
  } else {
    len = route.frame.valid ? build_data_frame(room, route.frame, h, payload, tx_mode_, auth)
                            : build_data_frame(room, local_, route, h, payload, tx_mode_, auth);
    m->data_len = static_cast<uint16_t>(len);
  }
  m->pkt_len = static_cast<uint32_t>(len);
  if (tx_mode_ == ChecksumMode::kOffload) {
    m->l2_len = kL2Len;
    m->l3_len = kL3Len;
    m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
  }
  stage_len_[staged_] = m->pkt_len;
  stage_[staged_++] = m;
  return true;
}

uint16_t Interface::stage_burst_st(const TxFrame* frames, uint16_t n) {
  MERCURY_OWNED(owner_);
  uint16_t staged = 0;
  for (uint16_t i = 0; i < n; ++i) {
    const TxFrame& f = frames[i];
    staged += stage_data_st(*f.route, f.header, {f.payload, f.header.payload_len}, f.auth_block())
                  ? 1
                  : 0;
  }
  return staged;
}

uint32_t Interface::rx_room() const {
  // Free mbufs of the pool this port receives into (a NIC's RX ring holds its
  // own; memif and af_packet allocate per frame), less what our send path
  // may take from it at once: a stage and a burst of spares.
  const unsigned free = pool_free(pool_.get(), cache_lcores_);
  constexpr unsigned kKept = kStage + kBurst;
  return free > kKept ? free - kKept : 0;
}

void Interface::refresh_port_stats_st() {
  MERCURY_OWNED(owner_);
  // Stored word by word with relaxed atomics: readers on other threads
  // (telemetry, the stats line) load each word whole. Every counter of the
  // list, so that one added to it cannot be left out.
  PortDrops now;
  if (port_.read_drops(now)) {
#define MERCURY_STORE_PMD_DROP(name, doc) \
  std::atomic_ref<uint64_t>(pmd_drops_.name).store(now.name, std::memory_order_relaxed);
    MERCURY_PORT_PMD_DROPS(MERCURY_STORE_PMD_DROP)
#undef MERCURY_STORE_PMD_DROP
  }
  std::atomic_ref<uint64_t>(rx_pool_free_).store(port_.rx_pool_free(), std::memory_order_relaxed);
  cache_lcores_.refresh();  // a thread may have registered since (rx_room)
  std::atomic_ref<uint64_t>(link_up_).store(port_.link_up() ? 1 : 0, std::memory_order_relaxed);
}

PortDrops Interface::pmd_drops() const {
  PortDrops d;
#define MERCURY_LOAD_PMD_DROP(name, doc) \
  d.name = std::atomic_ref<const uint64_t>(pmd_drops_.name).load(std::memory_order_relaxed);
  MERCURY_PORT_PMD_DROPS(MERCURY_LOAD_PMD_DROP)
#undef MERCURY_LOAD_PMD_DROP
  return d;
}

void Interface::start_link_schedule_st(uint64_t now) {
  MERCURY_OWNED(owner_);
  if (emulator_ != nullptr) emulator_->anchor_schedule(now);
}

uint32_t Interface::tx_pending() const {
  return staged_ + (emulator_ != nullptr ? emulator_->queued() : 0);
}

uint16_t Interface::flush_st(uint64_t now) {
  MERCURY_OWNED(owner_);
  if (detached_ != 0) [[unlikely]] {
    // Nothing may reach the PMD: what is staged goes back to its pool.
    if (staged_ > 0) rte_pktmbuf_free_bulk(stage_.data(), staged_);
    counters_.tx_detached += staged_;
    staged_ = 0;
    return 0;
  }
  if (emulator_ != nullptr) emulator_->poll(now);
  if (staged_ == 0) return 0;
  const uint16_t sent = emulator_ != nullptr
                            ? emulator_->tx_burst(stage_.data(), staged_, now)
                            : port_.tx_burst(opts_.tx_queue, stage_.data(), staged_);
  // The frames that went belong to the PMD now (memif, for one, has freed
  // them already): their lengths come from stage_len_, not from the mbufs.
  for (uint16_t i = 0; i < sent; ++i) counters_.tx_bytes += stage_len_[i];
  counters_.tx_frames += sent;
  // Keep the refused ones, in order, at the front of the stage, each with
  // its payload in its own mbuf now: the sender's memory may change or go
  // before the next flush (payload_ref.h).
  for (uint16_t i = sent; i < staged_; ++i) {
    if (payload_by_reference(stage_[i])) {
      take_payload_in(stage_[i]);
      ++counters_.tx_taken_in;
    }
    stage_[i - sent] = stage_[i];
    stage_len_[i - sent] = stage_len_[i];
  }
  staged_ = static_cast<uint16_t>(staged_ - sent);
  return sent;
}

}  // namespace mercury::net
