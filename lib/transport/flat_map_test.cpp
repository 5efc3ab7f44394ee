// FlatMap on its own: probe order, refusal when full, backward-shift
// deletion (wrap-around included) and a differential run against
// std::unordered_map.
#include "transport/flat_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

namespace mercury::transport {
namespace {

// Keys whose home slot the test chooses: key = home * 1000 + tag, so runs
// and collisions are laid out by hand. 0 marks an empty slot.
struct PlacedKey {
  using Key = uint32_t;
  static constexpr Key kEmpty = 0;
  static bool is_empty(Key k) { return k == 0; }
  static size_t hash(Key k) { return k / 1000; }
};
using Placed = FlatMap<PlacedKey, uint32_t>;

uint32_t key_at(uint32_t home, uint32_t tag) { return home * 1000 + tag; }

TEST(FlatMap, CapacityIsAPowerOfTwoAndSizesAreChecked) {
  EXPECT_EQ(Placed(5, 4).capacity(), 8u);
  EXPECT_EQ(Placed(0, 1).capacity(), 2u);
  EXPECT_EQ(Placed(16, 15).capacity(), 16u);
  EXPECT_THROW(Placed(8, 8), std::invalid_argument);  // no empty slot left: probes would not end
  EXPECT_THROW(Placed(8, 0), std::invalid_argument);
}

TEST(FlatMap, FindInsertOverwrite) {
  Placed m(8, 6);
  EXPECT_EQ(m.find(key_at(1, 1)), nullptr);
  bool inserted = false;
  Placed::Slot* s = m.find_or_insert(key_at(1, 1), inserted);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(inserted);
  EXPECT_EQ(s->value, 0u);  // value-initialised
  s->value = 7;
  EXPECT_EQ(m.find_or_insert(key_at(1, 1), inserted), s);
  EXPECT_FALSE(inserted);
  EXPECT_TRUE(m.put(key_at(1, 1), 9));
  EXPECT_EQ(m.find(key_at(1, 1))->value, 9u);
  EXPECT_EQ(m.size(), 1u);
}

TEST(FlatMap, CollisionsProbeLinearly) {
  Placed m(8, 7);
  for (uint32_t t = 1; t <= 3; ++t) ASSERT_TRUE(m.put(key_at(2, t), t));
  EXPECT_EQ(m.home(key_at(2, 3)), 2u);
  for (uint32_t t = 1; t <= 3; ++t) {
    const Placed::Slot* s = m.find(key_at(2, t));
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->value, t);
    EXPECT_EQ(s->key, key_at(2, t));
  }
}

TEST(FlatMap, AFullMapRefusesNewKeysButUpdatesOldOnes) {
  Placed m(4, 3);
  for (uint32_t t = 1; t <= 3; ++t) ASSERT_TRUE(m.put(key_at(t, 0) + t, t));
  bool inserted = true;
  EXPECT_EQ(m.find_or_insert(key_at(0, 9), inserted), nullptr);
  EXPECT_FALSE(m.put(key_at(0, 9), 1));
  EXPECT_TRUE(m.put(key_at(2, 2), 20));  // present: an update, not an insert
  EXPECT_EQ(m.find(key_at(2, 2))->value, 20u);
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.find(key_at(0, 9)), nullptr);  // the probe still ends at the empty slot
}

// A run that wraps from the last slot to the first: deleting at its start
// must pull the wrapped entries back across the end of the array.
TEST(FlatMap, DeletionShiftsBackAcrossTheWrap) {
  Placed m(8, 7);
  const uint32_t a = key_at(6, 1), b = key_at(6, 2), c = key_at(7, 1), d = key_at(6, 3),
                 e = key_at(1, 1);
  for (uint32_t k : {a, b, c, d, e}) ASSERT_TRUE(m.put(k, k));
  const auto at = [&](uint32_t k) { return m.index_of(m.find(k)); };
  ASSERT_EQ(at(a), 6u);
  ASSERT_EQ(at(b), 7u);
  ASSERT_EQ(at(c), 0u);
  ASSERT_EQ(at(d), 1u);
  ASSERT_EQ(at(e), 2u);  // its home 1 is d's
  m.erase(m.find(a));
  EXPECT_EQ(m.find(a), nullptr);
  EXPECT_EQ(at(b), 6u);
  EXPECT_EQ(at(c), 7u);  // back across the wrap, to its home
  EXPECT_EQ(at(d), 0u);
  EXPECT_EQ(at(e), 1u);  // its home
  for (uint32_t k : {b, c, d, e}) EXPECT_EQ(m.find(k)->value, k);
  m.erase(m.find(c));  // a hole at the end of the array, a run after the wrap
  EXPECT_EQ(at(b), 6u);
  EXPECT_EQ(at(d), 7u);
  EXPECT_EQ(at(e), 1u);
  m.erase(b);
  m.erase(d);
  EXPECT_EQ(at(e), 1u);
  EXPECT_EQ(m.size(), 1u);
  m.erase(e);
  EXPECT_EQ(m.size(), 0u);
  for (uint32_t k : {a, b, c, d, e}) EXPECT_EQ(m.find(k), nullptr);
}

// An entry at its home slot stays there when an earlier entry of its run is
// deleted (moved before its home, it could not be found).
TEST(FlatMap, DeletionLeavesEntriesAtTheirHome) {
  Placed m(8, 7);
  const uint32_t a = key_at(7, 1), b = key_at(0, 1), c = key_at(7, 2);
  for (uint32_t k : {a, b, c}) ASSERT_TRUE(m.put(k, k));
  const auto at = [&](uint32_t k) { return m.index_of(m.find(k)); };
  ASSERT_EQ(at(a), 7u);
  ASSERT_EQ(at(b), 0u);
  ASSERT_EQ(at(c), 1u);
  m.erase(a);
  EXPECT_EQ(at(b), 0u);  // at home: stays
  EXPECT_EQ(at(c), 7u);  // jumps over b, back across the wrap to its home
}

TEST(FlatMap, ClearAndForEach) {
  Placed m(16, 12);
  for (uint32_t t = 1; t <= 10; ++t) ASSERT_TRUE(m.put(key_at(t % 5, t), t));
  uint32_t sum = 0, n = 0;
  m.for_each([&](Placed::Slot& s) {
    sum += s.value;
    ++n;
  });
  EXPECT_EQ(n, 10u);
  EXPECT_EQ(sum, 55u);
  m.clear();
  EXPECT_EQ(m.size(), 0u);
  m.for_each([&](Placed::Slot&) { ADD_FAILURE() << "cleared"; });
  for (uint32_t t = 1; t <= 10; ++t) EXPECT_EQ(m.find(key_at(t % 5, t)), nullptr);
}

TEST(FlatMap, MessageIdKeysTakeEveryThirtyTwoBitValue) {
  FlatMap<MsgIdKey<0>, uint32_t> m(8, 4);
  for (uint32_t id : {0u, 1u, UINT32_MAX}) ASSERT_TRUE(m.put(id, id ^ 5));
  for (uint32_t id : {0u, 1u, UINT32_MAX}) {
    ASSERT_NE(m.find(id), nullptr) << id;
    EXPECT_EQ(m.find(id)->value, id ^ 5);
  }
  EXPECT_EQ(m.find(2), nullptr);
  static_assert(sizeof(FlatMap<MsgIdKey<0>, uint64_t>::Slot) == 16);
}

struct FewHomes {
  using Key = uint32_t;
  static constexpr Key kEmpty = 0;
  static bool is_empty(Key k) { return k == 0; }
  static size_t hash(Key k) { return k % 5; }  // five homes in 32 slots: long runs
};

// Random inserts, updates and deletes on a small table with heavy
// collisions, checked against std::unordered_map after every step.
TEST(FlatMap, AgreesWithUnorderedMap) {
  FlatMap<FewHomes, uint32_t> m(32, 24);
  std::unordered_map<uint32_t, uint32_t> ref;
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const uint32_t k = 1 + rng() % 40;
    const uint32_t op = rng() % 3;
    if (op == 0) {
      const bool ok = m.put(k, static_cast<uint32_t>(step));
      const bool fits = ref.count(k) != 0 || ref.size() < 24;
      ASSERT_EQ(ok, fits) << step;
      if (ok) ref[k] = static_cast<uint32_t>(step);
    } else if (op == 1) {
      m.erase(k);
      ref.erase(k);
    }
    ASSERT_EQ(m.size(), ref.size()) << step;
    for (uint32_t q = 1; q <= 40; ++q) {
      const auto* s = m.find(q);
      const auto it = ref.find(q);
      ASSERT_EQ(s != nullptr, it != ref.end()) << step << " key " << q;
      if (s != nullptr) {
        ASSERT_EQ(s->value, it->second);
      }
    }
  }
}

}  // namespace
}  // namespace mercury::transport
