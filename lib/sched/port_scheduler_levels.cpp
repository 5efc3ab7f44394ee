// PortScheduler::LevelTable: levels x peers of intrusive message FIFOs and
// retransmission FIFOs, with the bitmaps that make a pick O(1) (non-empty
// levels, per level the peers with work) and the per-level round-robin
// cursor. The scheduler holds two: what may be carved now, and (partition
// mode) the messages with partitions not yet started. See port_scheduler.h.
#include <bit>

#include "sched/port_scheduler.h"

namespace mercury::sched {

PortScheduler::LevelTable::LevelTable(unsigned num_peers, Message* Message::*link)
    : num_peers_(num_peers),
      num_words_((num_peers + 63) / 64),
      link_(link),
      data_peers_(kPriorityLevels),
      rtx_peers_(kPriorityLevels),
      cursor_(kPriorityLevels, static_cast<uint16_t>(num_peers - 1)),
      queues_(size_t{kPriorityLevels} * num_peers) {}

int PortScheduler::LevelTable::round_robin(const PeerMask& work, const PeerMask& eligible,
                                           unsigned level) const {
  // The first peer after the level's cursor that has work and is eligible,
  // wrapping around; word by word over the words that can hold a peer (one
  // word up to 64 peers), so this is a few instructions, not a 256-bit scan.
  unsigned start = cursor_[level] + 1u;
  if (start >= num_words_ * 64) start = 0;
  const unsigned w0 = start / 64;
  const uint64_t first = work.word(w0) & eligible.word(w0) & (~uint64_t{0} << (start % 64));
  if (first != 0) return static_cast<int>(w0 * 64 + std::countr_zero(first));
  // Then the following words, ending on w0 again for its bits below start.
  for (unsigned i = 1; i <= num_words_; ++i) {
    unsigned w = w0 + i;
    if (w >= num_words_) w -= num_words_;
    const uint64_t bits = work.word(w) & eligible.word(w);
    if (bits != 0) return static_cast<int>(w * 64 + std::countr_zero(bits));
  }
  return -1;
}

std::optional<PortScheduler::Pick> PortScheduler::LevelTable::pick(const PeerMask& eligible) const {
  // Most urgent first: lowest set bit. A level is skipped only when every peer
  // it holds work for is ineligible, so this loop runs at most once per
  // non-empty level (<= 64) and usually exactly once.
  for (uint64_t levels = active_; levels != 0; levels &= levels - 1) {
    const unsigned level = static_cast<unsigned>(std::countr_zero(levels));
    if ((rtx_levels_ >> level) & 1) {
      const int peer = round_robin(rtx_peers_[level], eligible, level);
      if (peer >= 0) return Pick{level, static_cast<unsigned>(peer), true};
    }
    const int peer = round_robin(data_peers_[level], eligible, level);
    if (peer >= 0) return Pick{level, static_cast<unsigned>(peer), false};
  }
  return std::nullopt;
}

bool PortScheduler::LevelTable::sole_data_peer(unsigned level, unsigned peer,
                                               const PeerMask& eligible) const {
  const PeerMask& work = data_peers_[level];
  uint64_t others = 0;
  for (unsigned w = 0; w < num_words_; ++w) {
    uint64_t bits = work.word(w) & eligible.word(w);
    if (w == peer / 64) bits &= ~(uint64_t{1} << (peer % 64));
    others |= bits;
  }
  return others == 0;
}

unsigned PortScheduler::LevelTable::rotation(unsigned level, unsigned first,
                                             const PeerMask& eligible, uint16_t* peers,
                                             unsigned max, bool& all) const {
  // As round_robin(): first's word from first on, the following words
  // wrapping around, then first's word below first.
  const PeerMask& work = data_peers_[level];
  const unsigned w0 = first / 64;
  unsigned k = 0;
  for (unsigned i = 0; i <= num_words_; ++i) {
    unsigned w = w0 + i;
    if (w >= num_words_) w -= num_words_;
    uint64_t bits = work.word(w) & eligible.word(w);
    if (i == 0) {
      bits &= ~uint64_t{0} << (first % 64);
    } else if (i == num_words_) {
      bits &= (uint64_t{1} << (first % 64)) - 1;
    }
    for (; bits != 0; bits &= bits - 1) {
      if (k == max) {
        all = false;
        return k;
      }
      peers[k++] = static_cast<uint16_t>(w * 64 + std::countr_zero(bits));
    }
  }
  all = true;
  return k;
}

void PortScheduler::LevelTable::refresh(unsigned level) {
  const uint64_t bit = uint64_t{1} << level;
  const bool rtx = rtx_peers_[level].any();
  rtx_levels_ = rtx ? rtx_levels_ | bit : rtx_levels_ & ~bit;
  active_ = rtx || data_peers_[level].any() ? active_ | bit : active_ & ~bit;
}

void PortScheduler::LevelTable::push_message(unsigned level, Message* msg) {
  PeerQueue& q = at(level, msg->peer);
  msg->*link_ = nullptr;
  if (q.tail != nullptr) {
    q.tail->*link_ = msg;
  } else {
    q.head = msg;
    data_peers_[level].set(msg->peer);
    active_ |= uint64_t{1} << level;
  }
  q.tail = msg;
}

void PortScheduler::LevelTable::pop_message(unsigned level, unsigned peer) {
  PeerQueue& q = at(level, peer);
  Message* msg = q.head;
  q.head = msg->*link_;
  msg->*link_ = nullptr;
  if (q.head == nullptr) {
    q.tail = nullptr;
    data_peers_[level].reset(peer);
    refresh(level);
  }
}

void PortScheduler::LevelTable::push_retransmit(unsigned level, unsigned peer, uint32_t slot,
                                                std::vector<RetransmitSlot>& slots) {
  PeerQueue& q = at(level, peer);
  slots[slot].next = kNil;
  if (q.rtx_tail != kNil) {
    slots[q.rtx_tail].next = slot;
  } else {
    q.rtx_head = slot;
    rtx_peers_[level].set(peer);
    active_ |= uint64_t{1} << level;
    rtx_levels_ |= uint64_t{1} << level;
  }
  q.rtx_tail = slot;
}

uint32_t PortScheduler::LevelTable::pop_retransmit(unsigned level, unsigned peer,
                                                   std::vector<RetransmitSlot>& slots) {
  PeerQueue& q = at(level, peer);
  const uint32_t slot = q.rtx_head;
  q.rtx_head = slots[slot].next;
  if (q.rtx_head == kNil) {
    q.rtx_tail = kNil;
    rtx_peers_[level].reset(peer);
    refresh(level);
  }
  return slot;
}

}  // namespace mercury::sched
