// The thread contract: an Owner claims its object for the first thread that
// runs an _st call, lets that thread in again, aborts any other, and moves
// only where it is handed over. Compiled with the checks on whatever the
// build's owner_checks, so the mechanism itself is always tested; the node
// tests show a wrong-thread call into a real component aborting.
#define MERCURY_OWNER_CHECKS 1
#include "base/owner.h"

#include <gtest/gtest.h>

#include <thread>

namespace mercury::base {
namespace {

// An object with the contract, as every class with _st functions has it.
class Counter {
 public:
  void bump_st() {
    MERCURY_OWNED(owner_);
    ++n_;
  }
  void hand_over() { owner_.hand_over(); }
  [[nodiscard]] const Owner& owner() const { return owner_; }
  [[nodiscard]] int n() const { return n_; }

 private:
  Owner owner_;
  int n_ = 0;
};

TEST(Owner, TheFirstCallerOwnsTheObject) {
  Counter c;
  EXPECT_EQ(c.owner().owner(), 0u);
  c.bump_st();
  c.bump_st();
  EXPECT_EQ(c.owner().owner(), Owner::self());
  EXPECT_EQ(c.n(), 2);
}

TEST(OwnerDeathTest, AWrongThreadCallAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Counter c;
  c.bump_st();
  EXPECT_DEATH(
      {
        std::thread t([&c] { c.bump_st(); });
        t.join();
      },
      "bump_st called on thread .*, but its object belongs to thread");
}

TEST(Owner, AHandedOverObjectGoesToItsNextCaller) {
  Counter c;
  c.bump_st();
  c.hand_over();
  uint64_t there = 0;
  std::thread t([&] {
    c.bump_st();
    there = c.owner().owner();
  });
  t.join();
  EXPECT_EQ(there, c.owner().owner());
  EXPECT_NE(there, Owner::self());
  EXPECT_EQ(c.n(), 2);
}

}  // namespace
}  // namespace mercury::base
