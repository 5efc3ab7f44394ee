// The worker's network side: its transport endpoint towards the server(s),
// the push of a tensor's gradient partition by partition, and the delivery of
// aggregated chunks into the PullTracker (which writes them into the
// trainer's buffers and completes pulls).
//
// Control messages (agg/control.h: declare, ready, barrier) travel as whole
// kControl messages; a WorkerNodeConfig::control receiver takes the ones the
// servers send. The public Worker (mercury/worker.h) drives a WorkerNode
// from its net core (net_core.h); ps-demo and pmd-tests/ps drive it by hand.
//
// Threads: push() may be called from any thread (Endpoint::send is
// lock-free); poll_st(), push_partitions_st(), send_control_st(), tracker()
// and endpoint() belong to the net core.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "net/interface.h"
#include "transport/endpoint.h"
#include "worker/pull_tracker.h"
#include "worker/tensor_table.h"

namespace mercury::worker {

struct WorkerNodeConfig {
  transport::EndpointConfig endpoint;  ///< its peers are the servers
  std::vector<uint16_t> shard_peer;    ///< global shard id -> server peer index; empty: all 0
  PullTrackerConfig pulls;
  /// Where the servers' control messages go (ready, refused, barrier done);
  /// null: they are dropped (counted by the endpoint as kNoReceiver).
  transport::MessageReceiver* control = nullptr;
};

struct WorkerNodeCounters {
  uint64_t chunks_received = 0;    ///< aggregated chunks handed to the tracker
  uint64_t partitions_pushed = 0;  ///< partition messages queued
  uint64_t push_refused = 0;       ///< partitions the endpoint did not queue
  transport::EndpointCounters net;
};

class WorkerNode final : public transport::PacketReceiver {
 public:
  /// `table` must be frozen and outlive the node. Throws UsageError or
  /// std::invalid_argument naming what is wrong.
  WorkerNode(const TensorTable& table, net::Interface& iface, const WorkerNodeConfig& config,
             transport::Tick now);
  ~WorkerNode();

  /// Any thread: queues every partition of `grad` (the whole tensor) for
  /// the server that owns it, tagged with `iteration`. Returns how many
  /// partitions were refused (0 = all queued; the caller retries the rest).
  uint32_t push(TensorId tensor, std::span<const float> grad, uint32_t iteration);

  /// Net core: queues partitions first, first + 1, ... of `tensor`'s
  /// `grad` (the whole tensor) as messages of `type` (kData for a gradient,
  /// kInit for rank 0's initial parameters) tagged with `iteration`, each
  /// with `done` and its cookie set to the partition's key, until the
  /// endpoint refuses one. Returns the index of the first partition not
  /// queued (== the tensor's partition count when all are). No check of the
  /// span: the caller did it on the trainer side.
  uint32_t push_partitions_st(TensorId tensor, const float* grad, uint32_t iteration,
                              wire::PacketType type, uint32_t first,
                              const transport::Completion& done);
  /// Net core: queues a control message (agg::encode_control bytes, kept
  /// alive by the caller until `done` runs) to server peer `server` at level 0.
  transport::SubmitStatus send_control_st(uint16_t server, std::span<const std::byte> bytes,
                                          const transport::Completion& done);

  /// Net core: one pass of the endpoint.
  uint32_t poll_st(transport::Tick now) { return endpoint_->poll_st(now); }
  PullTracker& tracker() { return tracker_; }
  transport::Endpoint& endpoint() { return *endpoint_; }
  [[nodiscard]] WorkerNodeCounters counters_st() const;

  bool on_packet(uint16_t peer, const wire::HeaderFields& h, std::span<const std::byte> payload,
                 net::PacketBuf* buf) override;

 private:
  const TensorTable& table_;
  std::vector<uint16_t> shard_peer_;
  PullTracker tracker_;
  std::unique_ptr<transport::Endpoint> endpoint_;
  uint64_t chunks_received_ = 0;
  std::atomic<uint64_t> partitions_pushed_{0};
  std::atomic<uint64_t> push_refused_{0};
};

}  // namespace mercury::worker
