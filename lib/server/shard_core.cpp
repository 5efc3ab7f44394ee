#include "server/shard_core.h"

#include <pthread.h>
#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_launch.h>
#include <rte_lcore.h>

#include <stdexcept>
#include <string>

namespace mercury::server {

namespace {
constexpr uint32_t kBurst = 32;
}  // namespace

class ShardCore::Consumer final : public node::Poller {
 public:
  explicit Consumer(ShardCore& core) : core_(core) {}
  uint32_t poll_st(node::Tick) override { return core_.poll_st(); }

 private:
  ShardCore& core_;
};

ShardCore::ShardCore(unsigned lcore, uint32_t shard_id, const ShardCoreOptions& options,
                     const net::BufferOps& buffers)
    : ring_(std::max(options.ring_entries, kBurst)),
      buffers_(&buffers),
      lcore_(lcore),
      shard_id_(shard_id),
      options_(options) {
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
  if (int rc = rte_eal_remote_launch(&ShardCore::main, this, lcore); rc != 0) {
    throw std::runtime_error(who + ": cannot launch: " + rte_strerror(-rc));
  }
  launched_ = true;
}

ShardCore::~ShardCore() { stop(); }

void ShardCore::stop() {
  if (!launched_) return;
  // Release: pairs with the loop's acquire load of the flag; nothing else is
  // handed over.
  stop_.store(true, std::memory_order_release);
  rte_eal_wait_lcore(lcore_);
  launched_ = false;
  // The core is gone: whatever is still queued was never given to the table.
  // The shard's releases and the ring's consumer side are this thread's now
  // (the wait above ordered them).
  Shard* shard = shard_.load(std::memory_order_acquire);
  ring_.hand_over_consumer();
  if (shard != nullptr) shard->hand_over();
  published_.hand_over();
  ShardItem items[kBurst];
  uint32_t n;
  while ((n = ring_.dequeue_burst(items, kBurst)) > 0) {
    for (uint32_t i = 0; i < n; ++i) {
      if (shard != nullptr) {
        shard->free_st(items[i].buf);
      } else {
        buffers_->free(items[i].buf);
      }
    }
  }
  if (shard != nullptr) publish(*shard);
}

uint32_t ShardCore::enqueue_st(const ShardItem* items, uint32_t n) {
  return ring_.enqueue_burst(items, n);
}

int ShardCore::main(void* self) {
  static_cast<ShardCore*>(self)->run();
  return 0;
}

void ShardCore::run() {
  // Named after its shard (EAL calls it rte-worker-<lcore>), for profiles and top.
  const std::string name = "mercury-shard" + std::to_string(shard_id_);
  pthread_setname_np(pthread_self(), name.c_str());
  node::Loop loop({.idle = options_.idle, .tick_hz = rte_get_tsc_hz()});
  Consumer consumer(*this);
  loop.add(consumer);
  loop_ = &loop;
  loop.run(stop_);
  sleeps_ = loop.sleeps();
  loop_ = nullptr;
}

uint32_t ShardCore::poll_st() {
  // Acquire: pairs with attach()'s release, so the shard's table is built.
  Shard* shard = shard_.load(std::memory_order_acquire);
  if (shard == nullptr) return 0;
  // Slices an endpoint refused go first: they are the oldest updates.
  uint32_t work = 0;
  if (shard->fanout_pending() && (work = shard->retry_fanout_st()) > 0) publish(*shard);
  ShardItem items[kBurst];
  const uint32_t n = ring_.dequeue_burst(items, kBurst);
  if (n == 0) return work;
  for (uint32_t i = 0; i < n; ++i) {
    const ShardItem& it = items[i];
    const std::span<const std::byte> payload(buffers_->data(it.buf) + it.payload_at,
                                             it.payload_len);
    const bool took = it.init == 0 && shard->contribute_st(it.rank, it.key, it.offset, it.iteration,
                                                           it.clock, payload, it.buf, it.copy != 0);
    if (it.init != 0) shard->initialize_st(it.key, it.offset, payload);
    if (!took) shard->free_st(it.buf);
  }
  items_ += n;
  publish(*shard);
  return work + n;
}

void ShardCore::publish(const Shard& shard) {
  published_.publish_st(ShardStats{.shard = shard.counters(),
                                   .table = shard.table().counters(),
                                   .held = shard.table().held(),
                                   .items = items_,
                                   .sleeps = loop_ != nullptr ? loop_->sleeps() : sleeps_});
}

ShardStats ShardCore::stats() const { return published_.read(); }

}  // namespace mercury::server
