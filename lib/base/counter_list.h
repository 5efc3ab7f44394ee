// Counter structs declared from one list, so that summing, printing,
// telemetry and tests walk the same fields and none can be forgotten.
//
// A component lists its counters once, as an X-macro of (name, description):
//
//   #define MERCURY_FOO_COUNTERS(X)  (each line but the last ends in a backslash)
//     X(packets, "packets taken from the port")
//     X(drops, "packets dropped, all reasons")
//
//   struct FooCounters {
//     MERCURY_FOO_COUNTERS(MERCURY_COUNTER_DECLARE)
//     std::array<uint64_t, kReasonCount> by_reason{};   // optional named arrays
//
//     template <class F> void for_each(F&& f) const {
//       MERCURY_FOO_COUNTERS(MERCURY_COUNTER_VISIT)
//       base::visit_array(f, "reason_", by_reason,
//                              [](size_t i) { return reason_name(Reason(i)); });
//     }
//     FooCounters& operator+=(const FooCounters& o) {
//       MERCURY_FOO_COUNTERS(MERCURY_COUNTER_ADD)
//       base::add_array(by_reason, o.by_reason);
//       return *this;
//     }
//   };
//
// for_each(f) calls f(prefix, name, value) for every counter: prefix is ""
// for a scalar, the array's prefix ("drop_", ...) for an element, whose name
// is the element's reason name. A telemetry group or a stats line then
// prints prefix + name.
//
// Header-only, no dependencies: the pure components (transport, agg) use it
// as well as the DPDK ones. Control path: for_each is for readers (telemetry,
// stats lines, tests); the datapath only increments fields.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

/// One uint64_t field per list entry.
#define MERCURY_COUNTER_DECLARE(name, doc) uint64_t name = 0;
/// `name += o.name;` inside an operator+=(const T& o).
#define MERCURY_COUNTER_ADD(name, doc) name += o.name;
/// `f("", "name", name);` inside a for_each(F&& f).
#define MERCURY_COUNTER_VISIT(name, doc) f(std::string_view{}, std::string_view{#name}, name);
/// Gauges (current values, never summed) are listed as X(type, name, doc):
/// `type name{};` and `f("", "name", value widened to uint64_t);`.
#define MERCURY_GAUGE_DECLARE(type, name, doc) type name{};
#define MERCURY_GAUGE_VISIT(type, name, doc) \
  f(std::string_view{}, std::string_view{#name}, static_cast<uint64_t>(name));
/// One `{"name", "doc"}` entry of a description table.
#define MERCURY_COUNTER_DESCRIBE(name, doc) \
  ::mercury::base::CounterInfo{std::string_view{#name}, std::string_view{doc}},

namespace mercury::base {

/// A scalar counter's name and what it counts, for docs and --help texts.
struct CounterInfo {
  std::string_view name;
  std::string_view doc;
};

/// Calls f(prefix, name_of(i), a[i]) for every element of a counter array;
/// name_of(size_t) gives the element's name (its reason enum's name).
template <class F, size_t N, class NameOf>
void visit_array(F&& f, std::string_view prefix, const std::array<uint64_t, N>& a, NameOf name_of) {
  for (size_t i = 0; i < N; ++i) f(prefix, name_of(i), a[i]);
}

template <size_t N>
void add_array(std::array<uint64_t, N>& a, const std::array<uint64_t, N>& b) {
  for (size_t i = 0; i < N; ++i) a[i] += b[i];
}

}  // namespace mercury::base
