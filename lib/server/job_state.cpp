#include "server/job_state.h"

#include <stdexcept>
#include <utility>

namespace mercury::server {

bool JobState::handles(agg::ControlKind kind) {
  return kind == agg::ControlKind::kSettings || kind == agg::ControlKind::kStatePull ||
         kind == agg::ControlKind::kStateSeed;
}

void JobState::start_st(const agg::Placement& placement, std::vector<int32_t> slot_of_shard,
                        uint32_t shards, uint32_t version, bool seeded) {
  placement_ = &placement;
  slot_of_shard_ = std::move(slot_of_shard);
  shards_ = shards;
  shard_of_slot_.assign(shards, 0);
  for (uint32_t id = 0; id < slot_of_shard_.size(); ++id) {
    if (slot_of_shard_[id] >= 0) shard_of_slot_[static_cast<uint32_t>(slot_of_shard_[id])] = id;
  }
  version_ = version;
  seeded_ = seeded;
}

ShardTask& JobState::add_task(Request& r, uint32_t slot, ShardTask::Kind kind) {
  r.tasks.push_back(std::make_unique<ShardTask>());
  ShardTask& t = *r.tasks.back();
  t.kind = kind;
  t.job = placement_->fingerprint();
  t.version = version_;
  r.slots.push_back(slot);
  return t;
}

void JobState::submit_st(Request& r) {
  for (size_t i = 0; i < r.tasks.size(); ++i) submit_(r.slots[i], *r.tasks[i]);
}

void JobState::on_message_st(uint16_t rank, agg::ControlMessage&& m) {
  auto r = std::make_unique<Request>();
  r->rank = rank;
  r->kind = m.kind;
  r->sequence = m.sequence;
  if (placement_ == nullptr) {
    r->error = "the job is not running";
  } else if (m.kind == agg::ControlKind::kSettings) {
    ++counters_.settings;
    if (rank != 0) {
      r->error = "settings come from rank 0 (this is rank " + std::to_string(rank) + ")";
    } else {
      for (uint32_t s = 0; s < shards_; ++s) {
        ShardTask& t = add_task(*r, s, ShardTask::Kind::kSettings);
        t.version = m.version;
        t.values = m.values;
      }
    }
  } else if (m.kind == agg::ControlKind::kStatePull) {
    ++counters_.state_pages;
    const auto slot = static_cast<uint32_t>(m.cursor >> 32);
    if (slot >= shards_) {
      r->error = "cursor " + std::to_string(m.cursor) + " names no shard of this node (it runs " +
                 std::to_string(shards_) + ")";
    } else {
      r->slot = slot;
      add_task(*r, slot, ShardTask::Kind::kExport).first = m.cursor & 0xffffffffu;
    }
  } else {
    ++counters_.seed_pages;
    r->last = m.last;
    r->page = std::move(m.bytes);
    if (rank != 0 || !seeded_ || resumed_) {
      r->error = !seeded_    ? "rank 0 did not declare that the job resumes from a checkpoint"
                 : rank != 0 ? "the state comes from rank 0"
                             : "the job has resumed already";
    } else {
      seed_st(*r);
    }
  }
  if (!r->error.empty()) ++counters_.state_refused;
  // Submitted once the request is queued: an inline shard finishes at once.
  submit_st(*requests_.emplace_back(std::move(r)));
}

void JobState::resume_st(std::span<const std::byte> file) {
  auto r = std::make_unique<Request>();
  r->rank = kThisServer;
  r->kind = agg::ControlKind::kStateSeed;
  r->last = true;
  r->page.assign(file.begin(), file.end());
  seed_st(*r);
  submit_st(*requests_.emplace_back(std::move(r)));
}

void JobState::roll_back_st(std::span<const std::byte> file, uint32_t version) {
  version_ = version;
  auto r = std::make_unique<Request>();
  r->rank = kThisServer;
  r->kind = agg::ControlKind::kStateSeed;
  r->last = true;
  r->rollback = true;
  r->page.assign(file.begin(), file.end());
  seed_st(*r, ShardTask::Kind::kRollBack);
  submit_st(*requests_.emplace_back(std::move(r)));
}

void JobState::seed_st(Request& r, ShardTask::Kind kind) {
  std::vector<agg::RecordRef> records;
  try {
    records = agg::split_records(r.page, placement_->fingerprint());
  } catch (const std::invalid_argument& e) {
    r.error = std::string("the page is refused: ") + e.what();
    return;
  }
  // Per slot: the hyperparameter records, then its chunks, in page order.
  std::vector<std::vector<agg::RecordRef>> per_slot(shards_);
  for (const agg::RecordRef& rec : records) {
    if (rec.header.type == agg::RecordType::kHyperparameters) {
      for (auto& mine : per_slot) mine.push_back(rec);
      continue;
    }
    const uint32_t key = rec.header.key;
    const int32_t slot =
        key < placement_->blocks().size() ? slot_of_shard_[placement_->at(key).shard] : -1;
    if (slot < 0) {
      r.error = "the page holds block " + std::to_string(key) + ", which no shard here owns";
      return;
    }
    per_slot[static_cast<uint32_t>(slot)].push_back(rec);
  }
  for (uint32_t s = 0; s < shards_; ++s) {
    if (per_slot[s].empty()) continue;
    ShardTask& t = add_task(r, s, kind);
    t.records = std::move(per_slot[s]);
  }
}

bool JobState::finish_st(Request& r, std::vector<ControlReply>& replies, std::string& refusal) {
  for (const auto& t : r.tasks) {
    if (!t->finished()) return false;
  }
  std::string error = r.error;
  for (uint32_t i = 0; i < r.tasks.size() && error.empty(); ++i) {
    const ShardTask& t = *r.tasks[i];
    if (!t.error.empty())
      error = "shard " + std::to_string(shard_of_slot_[r.slots[i]]) + ": " + t.error;
  }
  agg::ControlMessage a;
  a.sequence = r.sequence;
  switch (r.kind) {
    case agg::ControlKind::kSettings:
      a.kind = agg::ControlKind::kSettingsDone;
      break;
    case agg::ControlKind::kStatePull: {
      a.kind = agg::ControlKind::kStatePage;
      if (error.empty()) {
        ShardTask& t = *r.tasks.front();
        const bool shard_done = t.end;
        a.last = shard_done && r.slot + 1 == shards_;
        a.cursor = shard_done ? uint64_t{r.slot + 1} << 32 : uint64_t{r.slot} << 32 | t.next;
        a.bytes = std::move(t.bytes);
      } else {
        a.last = true;
      }
      break;
    }
    default: {  // kStateSeed
      if (r.rollback) {
        // Each kRollBack task checked its shard has every chunk.
        if (!error.empty()) {
          refusal = "cannot roll back to version " + std::to_string(version_) +
                    " from this server's checkpoint: " + error;
        }
        return true;  // nobody asked
      }
      a.kind = agg::ControlKind::kStateSeeded;
      if (error.empty() && r.last && !r.checked) {
        // Every shard is asked how many of its chunks have no values: the
        // answer waits for that round.
        r.checked = true;
        r.tasks.clear();
        r.slots.clear();
        for (uint32_t s = 0; s < shards_; ++s) add_task(r, s, ShardTask::Kind::kCheck);
        submit_st(r);
        return finish_st(r, replies, refusal);
      }
      if (error.empty() && r.checked) {
        for (uint32_t s = 0; s < shards_ && error.empty(); ++s) {
          if (r.tasks[s]->next != 0) {
            error = "the checkpoint gives no values to " + std::to_string(r.tasks[s]->next) +
                    " chunks of shard " + std::to_string(shard_of_slot_[s]);
          }
        }
        if (error.empty()) resumed_ = true;
      }
      // A resume that failed leaves shards half restored (or never restored:
      // the workers would wait for the state's version): the job cannot go on.
      if (!error.empty() && (r.rank == 0 || r.rank == kThisServer) && seeded_ && !resumed_) {
        refusal = (r.rank == 0 ? "cannot resume from rank 0's checkpoint: "
                               : "cannot resume from this server's checkpoint: ") +
                  error;
      }
      if (r.rank == kThisServer) return true;  // nobody asked
      break;
    }
  }
  a.text = std::move(error);
  replies.push_back(ControlReply{r.rank, std::move(a)});
  return true;
}

uint32_t JobState::poll_st(std::vector<ControlReply>& replies, std::string& refusal) {
  uint32_t answered = 0;
  std::erase_if(requests_, [&](const std::unique_ptr<Request>& r) {
    if (!finish_st(*r, replies, refusal)) return false;
    ++answered;
    return true;
  });
  return answered;
}

}  // namespace mercury::server
