// NetCore (net_core.h): settings, the job's state and a resume (agg/control.h,
// docs/worker.md "Settings and checkpoints"). Control path: every message
// is encoded into a new buffer; a state's pages are kept until joined.
#include <algorithm>
#include <stdexcept>

#include "agg/shard_state.h"
#include "worker/net_core.h"

namespace mercury::worker {

std::shared_ptr<const Resume> make_resume(const TensorTable& table, const NetCoreConfig& config,
                                          std::span<const std::byte> state) {
  const agg::OptimizerConfig& o = config.optimizer_config;
  agg::StateFile file;
  try {
    file = agg::check_state(state, table.placement(), table.chunk_bytes(), o.kind,
                            o.decoupled_weight_decay);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("start: the state to resume from does not fit this job: ") +
                     e.what());
  }
  auto resume = std::make_shared<Resume>();
  resume->version = file.version;
  // Global shard id -> server, as the servers number their shards.
  std::vector<uint32_t> server_of;
  for (uint32_t s = 0; s < config.servers.size(); ++s) {
    server_of.insert(server_of.end(), config.servers[s].shards, s);
  }
  std::vector<std::vector<std::byte>> records(config.servers.size());
  for (const agg::RecordRef& r : file.chunks) {
    const uint32_t server = server_of[table.placement().at(r.header.key).shard];
    records[server].insert(records[server].end(), r.bytes.begin(), r.bytes.end());
  }
  // Each server's pages: the hyperparameter record, then its chunks, cut
  // at record boundaries within a page's size.
  resume->pages.resize(config.servers.size());
  for (uint32_t s = 0; s < config.servers.size(); ++s) {
    std::vector<std::vector<std::byte>>& pages = resume->pages[s];
    pages.emplace_back(file.hyperparameters.bytes.begin(), file.hyperparameters.bytes.end());
    const std::span<const std::byte> mine = records[s];
    for (const agg::RecordRef& r : agg::split_records(mine, table.fingerprint())) {
      if (pages.back().size() + r.bytes.size() > agg::kStatePageBytes) pages.emplace_back();
      pages.back().insert(pages.back().end(), r.bytes.begin(), r.bytes.end());
    }
  }
  return resume;
}

// ---------------------------------------------------------------------------
// Settings.

bool NetCore::held_by_settings_st(uint32_t iteration) const {
  for (const PendingSettings& p : settings_) {
    if (static_cast<int32_t>(iteration - p.from) >= 0) return true;
  }
  return false;
}

void NetCore::settings_st(const agg::Hyperparameters& values, const Handle& h) {
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kSettings;
  m.sequence = next_sequence_++;
  // BSP: from this worker's next push on. Rank 0's pushes of that version
  // wait until every server answered, so no chunk can have used it before
  // every shard has it. The asynchronous modes apply it from each chunk's
  // next update; the version is not read.
  m.version = next_push_;
  m.values = values;
  // Every server, and every standby that has not taken over (it holds
  // the server's hyperparameters for the day it does).
  std::vector<uint16_t> to;
  for (uint16_t s = 0; s < config_.servers.size(); ++s) {
    to.push_back(server_peer_[s]);
    if (standby_peer_[s] != kNoStandby && server_peer_[s] != standby_peer_[s] &&
        (standby_lost_ >> s & 1) == 0) {
      to.push_back(standby_peer_[s]);
    }
  }
  PendingSettings p{.sequence = m.sequence,
                    .from = m.version,
                    .waiting = static_cast<uint32_t>(to.size()),
                    .error = {},
                    .handle = h};
  for (const uint16_t peer : to) {
    if (!control_->send_st(peer, m)) {
      h.fail("settings: the message to " + server_name(peer) +
             " could not be queued (endpoint full)");
      // The servers that got it apply it; the others not: the job's shards
      // would disagree from that version on.
      break_st("settings could not reach " + server_name(peer));
      return;
    }
  }
  settings_.push_back(std::move(p));
}

// ---------------------------------------------------------------------------
// The job's state.

void NetCore::state_st(std::vector<std::byte>* out, const Handle& h) {
  PendingState p{.sequence = next_sequence_++,
                 .out = out,
                 .pages = {},
                 .waiting = static_cast<uint32_t>(config_.servers.size()),
                 .error = {},
                 .handle = h};
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kStatePull;
  m.sequence = p.sequence;
  m.cursor = 0;
  for (uint16_t s = 0; s < config_.servers.size(); ++s) {
    if (!send_control_st(s, m)) {
      h.fail("server_state: the request to " + server_name(s) +
             " could not be queued (endpoint full)");
      return;  // answers to the ones sent find no request: ignored
    }
  }
  states_.push_back(std::move(p));
}

void NetCore::send_seed_page_st(uint16_t server) {
  const std::vector<std::vector<std::byte>>& pages = resume_->pages[server];
  const uint32_t i = seed_next_[server]++;
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kStateSeed;
  m.sequence = seed_sequence_;
  m.last = i + 1 == pages.size();
  m.bytes = pages[i];
  if (!send_control_st(server, m)) {
    fail_start_st("start: the checkpoint's pages to " + server_name(server) +
                  " could not be queued (endpoint full)");
  }
}

void NetCore::on_state_reply_st(uint16_t server, agg::ControlMessage& m) {
  if (m.kind == agg::ControlKind::kStateSeeded) {
    if (phase_ != Phase::kInitialising || !resume_ || m.sequence != seed_sequence_) return;
    if (!m.text.empty()) {
      fail_start_st("start: " + server_name(server) +
                    " refused the state to resume from: " + m.text);
      return;
    }
    if (seed_next_[server] < resume_->pages[server].size()) {
      send_seed_page_st(server);
      return;
    }
    // This server has every page; once all have, the pages are dropped.
    bool all = true;
    for (uint16_t s = 0; s < seed_next_.size(); ++s) {
      all = all && seed_next_[s] == resume_->pages[s].size();
    }
    if (all) resume_.reset();
    return;
  }
  if (m.kind == agg::ControlKind::kSettingsDone) {
    const auto it = std::find_if(settings_.begin(), settings_.end(), [&](const PendingSettings& p) {
      return p.sequence == m.sequence;
    });
    if (it == settings_.end()) return;
    if (!m.text.empty() && it->error.empty()) it->error = server_name(server) + ": " + m.text;
    if (--it->waiting != 0) return;
    const PendingSettings done = std::move(*it);
    settings_.erase(it);
    if (done.error.empty()) {
      done.handle.complete();
      return;
    }
    // A shard refused what the others applied: they no longer agree.
    const std::string why = "settings refused: " + done.error;
    done.handle.fail(why);
    break_st(why);
    return;
  }
  // kStatePage
  const auto it = std::find_if(states_.begin(), states_.end(),
                               [&](const PendingState& p) { return p.sequence == m.sequence; });
  if (it == states_.end()) return;
  if (!m.text.empty()) {
    if (it->error.empty()) it->error = server_name(server) + ": " + m.text;
  } else {
    it->pages.insert(it->pages.end(), m.bytes.begin(), m.bytes.end());
  }
  if (m.text.empty() && !m.last) {
    agg::ControlMessage next;
    next.kind = agg::ControlKind::kStatePull;
    next.sequence = m.sequence;
    next.cursor = m.cursor;
    if (send_control_st(server, next)) return;
    it->error = "the request to " + server_name(server) + " could not be queued (endpoint full)";
  }
  if (--it->waiting != 0) return;
  PendingState done = std::move(*it);
  states_.erase(it);
  if (done.error.empty()) {
    try {
      *done.out = agg::join_state(done.pages, table_.fingerprint());
    } catch (const std::invalid_argument& e) {
      done.error = e.what();
    }
  }
  if (done.error.empty()) {
    done.handle.complete();
  } else {
    done.handle.fail("server_state: " + done.error);
  }
}

void NetCore::fail_state_requests_st(const std::string& why) {
  for (PendingSettings& p : settings_) p.handle.fail(why);
  settings_.clear();
  for (PendingState& p : states_) p.handle.fail(why);
  states_.clear();
}

}  // namespace mercury::worker
