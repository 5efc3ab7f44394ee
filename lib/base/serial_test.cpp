#include "base/serial.h"

#include <gtest/gtest.h>

namespace mercury::base {
namespace {

TEST(SerialDiff, OrdersAcrossTheWrap) {
  EXPECT_EQ(serial_diff(5, 3), 2);
  EXPECT_EQ(serial_diff(3, 5), -2);
  EXPECT_EQ(serial_diff(7, 7), 0);
  // 2 comes 4 after 0xFFFFFFFE once the counter wraps.
  EXPECT_EQ(serial_diff(2, 0xFFFFFFFEu), 4);
  EXPECT_EQ(serial_diff(0xFFFFFFFEu, 2), -4);
  // The largest distances either way that still order correctly.
  EXPECT_EQ(serial_diff(0x7FFFFFFFu, 0), INT32_MAX);
  EXPECT_EQ(serial_diff(0, 0x7FFFFFFFu), -INT32_MAX);
  // Half the circle apart: the order is lost (a is "before" b both ways round).
  EXPECT_LT(serial_diff(0x80000000u, 0), 0);
  EXPECT_LT(serial_diff(0, 0x80000000u), 0);
}

}  // namespace
}  // namespace mercury::base
