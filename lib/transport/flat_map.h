// A fixed-size open-addressing hash map: the one table type behind every
// per-packet lookup of the transport (the endpoint's lost map, each peer's
// table of messages being placed, PeerReceiver's table of messages in
// progress).
//
// Properties. The slot count is a power of two fixed at construction (the
// only allocation); linear probing; deletion by backward shift, so there are
// no tombstones and a table never degrades with traffic; a map refuses an
// insert once it holds max_size entries, and max_size < capacity keeps at
// least one empty slot, so every probe ends. A slot is {key, value}, with no
// flag: an empty slot holds a key that no real entry has (Traits::kEmpty), so
// a table keeps the slot size of a hand-written one.
//
// Traits (a struct of statics):
//   using Key = ...;                        // compared with ==
//   static constexpr Key kEmpty = ...;      // never the key of an entry
//   static bool is_empty(const Key& k);     // k is kEmpty (may look at less)
//   static size_t hash(const Key& k);       // the map takes its low bits
//
// Costs. find / find_or_insert: one hash and a probe that, at the load
// factors used here (at most 3/4), touches one or two slots (find on an
// empty map: none); all inline.
// erase: the probe run after the slot. clear / for_each: O(capacity).
// Threads: none; the owner's core only. Never throws or allocates after the
// constructor, which throws std::invalid_argument on a bad size.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mercury::transport {

template <class Traits, class Value>
class FlatMap {
 public:
  using Key = typename Traits::Key;
  struct Slot {
    Key key = Traits::kEmpty;
    Value value{};
  };

  /// Control path: bit_ceil(max(min_capacity, 2)) slots, at most `max_size`
  /// entries (1 <= max_size < capacity, else std::invalid_argument).
  FlatMap(size_t min_capacity, size_t max_size)
      : slots_(std::bit_ceil(std::max<size_t>(min_capacity, 2))),
        mask_(slots_.size() - 1),
        max_size_(max_size) {
    if (max_size == 0 || max_size >= slots_.size()) {
      throw std::invalid_argument("flat map: max_size must be 1.." +
                                  std::to_string(slots_.size() - 1));
    }
  }

  /// The entry of `key`, or null.
  Slot* find(const Key& key) {
    // An empty map answers without a probe: every acknowledged packet
    // erases its key from the endpoint's lost map, which is empty while
    // nothing is lost, and a probe into a table that the aggregation's
    // streams have pushed out of the caches is a miss (docs/performance.md,
    // "What one server core can carry").
    if (size_ == 0) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) return &s;
      if (Traits::is_empty(s.key)) return nullptr;
    }
  }
  const Slot* find(const Key& key) const { return const_cast<FlatMap*>(this)->find(key); }

  /// The entry of `key` (inserted = false), or a new one with a value-
  /// initialised value (inserted = true), in one probe. Null when `key` is
  /// absent and the map holds max_size entries.
  Slot* find_or_insert(const Key& key, bool& inserted) {
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) {
        inserted = false;
        return &s;
      }
      if (Traits::is_empty(s.key)) {
        if (size_ >= max_size_) return nullptr;
        s = Slot{key, Value{}};
        ++size_;
        inserted = true;
        return &s;
      }
    }
  }

  /// Inserts or overwrites; false when full (and `key` absent).
  bool put(const Key& key, const Value& value) {
    bool inserted;
    Slot* s = find_or_insert(key, inserted);
    if (s == nullptr) return false;
    s->value = value;
    return true;
  }

  /// Removes the entry at `slot` (from find or find_or_insert, with no
  /// insert or erase since). Pointers to other slots may move.
  void erase(Slot* slot) {
    size_t i = index_of(slot);
    slots_[i] = Slot{};
    --size_;
    // Close the hole: move each later entry of the run back into it unless
    // its home lies cyclically in (i, j], where the probe from it still
    // reaches it.
    for (size_t j = (i + 1) & mask_; !Traits::is_empty(slots_[j].key); j = (j + 1) & mask_) {
      const size_t k = home(slots_[j].key);
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      slots_[j] = Slot{};
      i = j;
    }
  }
  /// Removes `key`'s entry if there is one.
  void erase(const Key& key) {
    if (Slot* s = find(key)) erase(s);
  }

  /// f(slot) for every entry, in slot order. f must not insert or erase.
  template <class F>
  void for_each(F&& f) {
    if (size_ == 0) return;
    for (Slot& s : slots_) {
      if (!Traits::is_empty(s.key)) f(s);
    }
  }
  void clear() {
    if (size_ == 0) return;
    std::fill(slots_.begin(), slots_.end(), Slot{});
    size_ = 0;
  }

  [[nodiscard]] size_t size() const { return size_; }
  [[nodiscard]] size_t max_size() const { return max_size_; }
  [[nodiscard]] size_t capacity() const { return slots_.size(); }
  /// The slot `key` probes first, and where `slot` is (for tests of the
  /// probe order).
  [[nodiscard]] size_t home(const Key& key) const { return Traits::hash(key) & mask_; }
  [[nodiscard]] size_t index_of(const Slot* slot) const {
    return static_cast<size_t>(slot - slots_.data());
  }

 private:
  std::vector<Slot> slots_;
  size_t mask_;
  size_t max_size_;
  size_t size_ = 0;
};

/// Keys for tables indexed by a 32-bit message id, which may take any value
/// on the wire: held widened to 64 bits, so 2^32 can mark an empty slot.
/// Message ids run sequentially per sender, and an odd multiplier permutes
/// the low bits, so consecutive ids land in distinct slots; `Shift` picks
/// which bits of the product index the table.
template <unsigned Shift>
struct MsgIdKey {
  using Key = uint64_t;
  static constexpr Key kEmpty = uint64_t{1} << 32;
  static bool is_empty(Key k) { return k == kEmpty; }
  static size_t hash(Key k) { return static_cast<uint32_t>(k) * 0x9E3779B1u >> Shift; }
};

}  // namespace mercury::transport
