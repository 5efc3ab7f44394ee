#include "server/shard_core.h"

#include <pthread.h>
#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_pause.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>

#include <stdexcept>
#include <string>

namespace mercury::server {

namespace {
constexpr uint32_t kBurst = 32;
}  // namespace

ShardCore::ShardCore(unsigned lcore, uint32_t shard_id, const ShardCoreOptions& options)
    : lcore_(lcore), shard_id_(shard_id), options_(options) {
  const std::string who =
      "server: shard " + std::to_string(shard_id) + " on lcore " + std::to_string(lcore);
  if (rte_lcore_id() != rte_get_main_lcore()) {
    throw std::invalid_argument(who + ": shard cores are launched from the EAL main lcore");
  }
  if (lcore >= RTE_MAX_LCORE || !rte_lcore_is_enabled(lcore) || lcore == rte_get_main_lcore()) {
    throw std::invalid_argument(who + ": not an enabled worker lcore (give more with --lcores)");
  }
  if (rte_eal_get_lcore_state(lcore) != WAIT) {
    throw std::invalid_argument(who + ": the lcore is busy");
  }
  if (options.ring_entries < kBurst) {
    throw std::invalid_argument(who + ": shard_ring_entries must be at least " +
                                std::to_string(kBurst));
  }
  static std::atomic<uint32_t> serial{0};
  const std::string name = "srv_shard" + std::to_string(serial.fetch_add(1));
  ring_ = rte_ring_create_elem(name.c_str(), sizeof(ShardItem), options.ring_entries, SOCKET_ID_ANY,
                               RING_F_SP_ENQ | RING_F_SC_DEQ | RING_F_EXACT_SZ);
  if (ring_ == nullptr) {
    throw std::runtime_error(who + ": cannot create its ring of " +
                             std::to_string(options.ring_entries) +
                             " items: " + rte_strerror(rte_errno));
  }
  if (int rc = rte_eal_remote_launch(&ShardCore::main, this, lcore); rc != 0) {
    rte_ring_free(ring_);
    throw std::runtime_error(who + ": cannot launch: " + rte_strerror(-rc));
  }
  launched_ = true;
}

ShardCore::~ShardCore() {
  stop();
  rte_ring_free(ring_);
}

void ShardCore::stop() {
  if (!launched_) return;
  // Release: pairs with run()'s acquire load; nothing else is handed over.
  stop_.store(true, std::memory_order_release);
  rte_eal_wait_lcore(lcore_);
  launched_ = false;
  // The core is gone: whatever is still queued was never given to the table.
  // The shard's releases are this thread's now (the wait above ordered them).
  Shard* shard = shard_.load(std::memory_order_acquire);
  ShardItem items[kBurst];
  unsigned n;
  while ((n = rte_ring_sc_dequeue_burst_elem(ring_, items, sizeof(ShardItem), kBurst, nullptr)) >
         0) {
    for (unsigned i = 0; i < n; ++i) {
      if (shard != nullptr) {
        shard->free_st(items[i].mbuf);
      } else {
        rte_pktmbuf_free(items[i].mbuf);
      }
    }
  }
  if (shard != nullptr) publish(*shard);
}

uint32_t ShardCore::enqueue_st(const ShardItem* items, uint32_t n) {
  return rte_ring_sp_enqueue_burst_elem(ring_, items, sizeof(ShardItem), n, nullptr);
}

int ShardCore::main(void* self) {
  static_cast<ShardCore*>(self)->run();
  return 0;
}

void ShardCore::run() {
  // Named after its shard (EAL calls it rte-worker-<lcore>), for profiles and top.
  const std::string name = "mercury-shard" + std::to_string(shard_id_);
  pthread_setname_np(pthread_self(), name.c_str());
  ShardItem items[kBurst];
  net::IdleBackoff backoff(options_.idle, rte_get_tsc_hz());
  while (!stop_.load(std::memory_order_acquire)) {
    // Acquire: pairs with attach()'s release, so the shard's table is built.
    Shard* shard = shard_.load(std::memory_order_acquire);
    // Slices an endpoint refused go first: they are the oldest updates.
    if (shard != nullptr && shard->fanout_pending() && shard->retry_fanout_st() > 0) {
      publish(*shard);
    }
    const unsigned n = shard == nullptr ? 0
                                        : rte_ring_sc_dequeue_burst_elem(
                                              ring_, items, sizeof(ShardItem), kBurst, nullptr);
    backoff.idle(n, rte_rdtsc());
    sleeps_ = backoff.sleeps();
    if (n == 0) continue;
    for (unsigned i = 0; i < n; ++i) {
      const ShardItem& it = items[i];
      const std::span<const std::byte> payload(
          static_cast<const std::byte*>(it.mbuf->buf_addr) + it.payload_at, it.payload_len);
      const bool took =
          it.init == 0 && shard->contribute_st(it.rank, it.key, it.offset, it.iteration, it.clock,
                                               payload, it.mbuf, it.copy != 0);
      if (it.init != 0) shard->initialize_st(it.key, it.offset, payload);
      if (!took) shard->free_st(it.mbuf);
    }
    items_ += n;
    publish(*shard);
  }
}

void ShardCore::publish(const Shard& shard) {
  published_.publish_st(ShardStats{.shard = shard.counters(),
                                   .table = shard.table().counters(),
                                   .held = shard.table().held(),
                                   .items = items_,
                                   .sleeps = sleeps_});
}

ShardStats ShardCore::stats() const { return published_.read(); }

}  // namespace mercury::server
