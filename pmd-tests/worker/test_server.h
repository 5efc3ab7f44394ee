// A parameter server for the worker's PMD tests, speaking the job protocol
// of agg/control.h over real transport::Endpoints (one per worker link) and
// aggregating in real agg::ChunkTables: kDeclare from every rank -> the
// placement -> kReady (or kRefused); rank 0's kInit packets -> version 0 to
// every worker; kData -> BSP rank-order aggregation -> version i + 1 to
// every worker as slices; kBarrier -> kBarrierDone once every rank arrived.
// It stands in for lib/server's ServerNode until that has the control
// plane. Behaviours for the failure tests: kSilent (never answers a
// declaration) and kRefuse (answers kRefused).
//
// Threads: everything runs on the thread that calls run_until() (the test's
// server thread). Test-only code: it allocates freely.
#pragma once

#include <rte_mbuf.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/control.h"
#include "agg/placement.h"
#include "agg/sync_policy.h"
#include "net/interface.h"
#include "transport/endpoint.h"

namespace mercury::worker::testing {

class TestServer final : public agg::ChunkSink {
 public:
  enum class Behaviour { kServe, kSilent, kRefuse };
  struct Options {
    uint32_t shards = 2;
    uint32_t chunk_bytes = 0;
    agg::OptimizerConfig optimizer;
    Behaviour behaviour = Behaviour::kServe;
    transport::EndpointConfig endpoint;  // peers set per link
  };
  struct Link {
    net::Interface* iface = nullptr;
    transport::PeerSpec worker;
  };

  TestServer(std::vector<Link> links, const Options& options, transport::Tick now)
      : options_(options), workers_(static_cast<uint32_t>(links.size())) {
    for (uint32_t r = 0; r < workers_; ++r) {
      ranks_.push_back(std::make_unique<Rank>(*this, static_cast<uint16_t>(r)));
      transport::EndpointConfig c = options.endpoint;
      c.peers = {links[r].worker};
      endpoints_.push_back(std::make_unique<transport::Endpoint>(
          *links[r].iface, c, transport::Receivers{ranks_.back().get(), ranks_.back().get()}, now));
    }
    declared_.resize(workers_);
  }
  ~TestServer() override {
    tables_.clear();  // releases held mbufs through this sink
    endpoints_.clear();
  }

  /// Polls every endpoint until `stop` is set.
  void run_until(const std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_acquire)) {
      const transport::Tick now = rte_rdtsc();
      uint32_t work = 0;
      for (auto& e : endpoints_) work += e->poll_st(now);
      if (work == 0) rte_pause();
    }
  }

  uint64_t updates() const { return updates_; }
  uint64_t refused() const { return refused_; }
  uint64_t inits() const { return inits_; }

  // agg::ChunkSink: every updated chunk goes to every worker as a slice of
  // its partition, from the table's memory (BSP keeps it until the next
  // update of the chunk, which needs every worker to have received this one).
  void on_update(const agg::Update& u) override {
    ++updates_;
    transport::MessageMeta meta;
    meta.type = wire::PacketType::kAggData;
    meta.dtype = wire::Dtype::kFloat32;
    meta.tensor_key = u.key;
    meta.param_version = u.version;
    const auto logical = static_cast<uint32_t>(placement_->at(u.key).bytes());
    for (auto& e : endpoints_) {
      if (e->send_slice(0, u.data, u.bytes, u.offset, logical, u.priority, meta, {}) !=
          transport::SubmitStatus::kQueued) {
        ++fanout_refused_;
      }
    }
  }
  void release(void* const* tokens, uint32_t count) override {
    for (uint32_t i = 0; i < count; ++i) rte_pktmbuf_free(static_cast<rte_mbuf*>(tokens[i]));
  }

 private:
  class Rank final : public transport::MessageReceiver, public transport::PacketReceiver {
   public:
    Rank(TestServer& s, uint16_t rank) : s_(s), rank_(rank) {}
    std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
      auto& b = buffers_[h.msg_id];
      b.resize(h.msg_len);
      return b.data();
    }
    void on_message_complete(uint16_t, const wire::HeaderFields& h, std::byte*) override {
      auto it = buffers_.find(h.msg_id);
      const agg::ControlMessage m = agg::decode_control(it->second);
      buffers_.erase(it);
      s_.on_control(rank_, m);
    }
    bool on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte> payload,
                   rte_mbuf* mbuf) override {
      return s_.on_data(rank_, h, payload, mbuf);
    }

   private:
    TestServer& s_;
    uint16_t rank_;
    std::map<uint32_t, std::vector<std::byte>> buffers_;
  };

  void send(uint32_t rank, const agg::ControlMessage& m) {
    out_.push_back(agg::encode_control(m));  // kept until the end of the test
    transport::MessageMeta meta;
    meta.type = wire::PacketType::kControl;
    endpoints_[rank]->send(0, out_.back().data(), static_cast<uint32_t>(out_.back().size()), 0,
                           meta, {});
  }

  void on_control(uint16_t rank, const agg::ControlMessage& m) {
    if (m.kind == agg::ControlKind::kDeclare) {
      if (options_.behaviour == Behaviour::kSilent) return;
      declared_[rank] = m.tensors;
      if (++declarations_ < workers_) return;
      std::string differ;
      for (uint32_t r = 1; r < workers_ && differ.empty(); ++r) {
        differ = agg::first_difference(*declared_[0], *declared_[r]);
      }
      agg::ControlMessage answer;
      if (options_.behaviour == Behaviour::kRefuse || !differ.empty()) {
        answer.kind = agg::ControlKind::kRefused;
        answer.text = differ.empty() ? "this test server refuses every job" : differ;
      } else {
        placement_.emplace(agg::Placement::compute(*declared_[0], options_.shards));
        for (uint32_t s = 0; s < options_.shards; ++s) {
          agg::ShardConfig sc;
          sc.shard = s;
          sc.workers = workers_;
          sc.chunk_bytes = options_.chunk_bytes;
          sc.optimizer = options_.optimizer;
          tables_.push_back(
              std::make_unique<agg::ChunkTable>(*placement_, sc, agg::make_bsp(), *this));
        }
        answer.kind = agg::ControlKind::kReady;
        answer.fingerprint = placement_->fingerprint();
        answer.shards = options_.shards;
      }
      for (uint32_t r = 0; r < workers_; ++r) send(r, answer);
    } else if (m.kind == agg::ControlKind::kBarrier) {
      if (++barrier_[m.generation] < workers_) return;
      agg::ControlMessage done;
      done.kind = agg::ControlKind::kBarrierDone;
      done.generation = m.generation;
      for (uint32_t r = 0; r < workers_; ++r) send(r, done);
    }
  }

  bool on_data(uint16_t rank, const wire::HeaderFields& h, std::span<const std::byte> payload,
               rte_mbuf* mbuf) {
    if (!placement_ || h.tensor_key >= placement_->partitions().size()) {
      ++refused_;
      return false;
    }
    agg::ChunkTable& t = *tables_[placement_->at(h.tensor_key).shard];
    if (h.type == wire::PacketType::kInit) {
      if (rank != 0) {
        ++refused_;
        return false;
      }
      if (t.initialize(h.tensor_key, h.offset, payload.data(),
                       static_cast<uint32_t>(payload.size())) == agg::Outcome::kInitialized) {
        ++inits_;
      } else {
        ++refused_;
      }
      return false;  // copied
    }
    const agg::Outcome o =
        t.contribute(agg::Contribution{h.tensor_key, h.offset, h.iteration, rank, payload.data(),
                                       static_cast<uint32_t>(payload.size()), mbuf});
    if (agg::taken(o)) return true;
    ++refused_;
    return false;
  }

  Options options_;
  uint32_t workers_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::unique_ptr<transport::Endpoint>> endpoints_;
  std::vector<std::optional<std::vector<agg::TensorDecl>>> declared_;
  uint32_t declarations_ = 0;
  std::optional<agg::Placement> placement_;
  std::vector<std::unique_ptr<agg::ChunkTable>> tables_;  // after the endpoints' users
  std::map<uint64_t, uint32_t> barrier_;
  std::deque<std::vector<std::byte>> out_;
  uint64_t updates_ = 0, refused_ = 0, inits_ = 0, fanout_refused_ = 0;
};

}  // namespace mercury::worker::testing
