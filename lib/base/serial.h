// Serial-number arithmetic (RFC 1982) on 32-bit counters that wrap: sequence
// numbers, epochs, versions and clocks. Header-only.
#pragma once

#include <cstdint>

namespace mercury::base {

/// Signed distance a - b on the 32-bit circle: negative when a comes before
/// b, correct across the wrap as long as the two are less than 2^31 apart.
constexpr int32_t serial_diff(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b); }

}  // namespace mercury::base
