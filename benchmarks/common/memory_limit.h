// The memory-bandwidth limit of aggregation, shared by the benchmarks that
// hold a server's work against it (agg/agg_bench, server/server_bench).
//
// The limit kernel is agg::reduce_sum() of n gradient buffers into one
// more, each read as one contiguous stream (the best case for the memory
// system): the rate at which this core can read gradient. A benchmark times
// it over the same buffers its variants aggregate from, in the same run.
// The buffers live on (transparent) 2 MB pages, as DPDK's mbufs do in
// hugepages, so neither side of a ratio measures 4 KB-page TLB misses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace mercury::bench {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Floats = std::unique_ptr<float[], FreeDeleter>;

/// `elements` floats on 2 MB pages (rounded up to whole pages), zeroed.
/// Throws std::bad_alloc.
Floats huge_floats(uint64_t elements);

/// One pass of the limit kernel: out = src[0] + ... + src[n-1], `bytes`
/// (a multiple of 4) of each. Returns the bytes read, n x bytes.
uint64_t limit_sum(const std::byte* const* src, uint32_t n, uint64_t bytes, float* out);

}  // namespace mercury::bench
