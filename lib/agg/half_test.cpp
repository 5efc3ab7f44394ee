// The half-precision kernels (half.h), every implementation this CPU runs
// (each instruction set's unit, half_kernels.h), against an oracle that shares no code with them: a
// 16-bit pattern's value from its fields with ldexp, and rounding to nearest even done in double
// with nearbyint. Widening is checked on all 65 536 patterns of each type,
// rounding on sweeps of float32 patterns that cover every exponent (so
// subnormals, overflow and infinities) with the bits below the rounding point
// at zero, just below, on and just above the tie; NaNs by the rule half.h
// states.
#include "agg/half.h"
#include "agg/half_kernels.h"
#include "agg/isa.h"

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace mercury::agg {
namespace {

using wire::Dtype;

struct Format {
  Dtype dtype;
  int man_bits;  // stored mantissa bits
  int exp_bits;
  int bias;
};
constexpr Format kBf16{Dtype::kBFloat16, 7, 8, 127};
constexpr Format kFp16{Dtype::kFloat16, 10, 5, 15};

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

bool is_nan16(const Format& f, uint16_t h) {
  const int exp = (h >> f.man_bits) & ((1 << f.exp_bits) - 1);
  return exp == (1 << f.exp_bits) - 1 && (h & ((1 << f.man_bits) - 1)) != 0;
}

// The value of a non-NaN pattern.
double value_of(const Format& f, uint16_t h) {
  const int exp = (h >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int man = h & ((1 << f.man_bits) - 1);
  double v;
  if (exp == (1 << f.exp_bits) - 1) {
    v = HUGE_VAL;
  } else if (exp == 0) {
    v = std::ldexp(man, 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp((1 << f.man_bits) + man, exp - f.bias - f.man_bits);
  }
  return (h & 0x8000) != 0 ? -v : v;
}

// x (not NaN) rounded to the format: to nearest, ties to even, with
// gradual underflow; past the largest finite value, infinity.
double round_to(const Format& f, double x) {
  if (x == 0 || std::isinf(x)) return x;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  const int ulp = std::max(e - 1, 1 - f.bias) - f.man_bits;
  const double q = std::nearbyint(std::ldexp(std::fabs(x), -ulp));  // FE_TONEAREST: ties to even
  double r = std::ldexp(q, ulp);
  const double max_finite =
      std::ldexp((2 << f.man_bits) - 1, (1 << f.exp_bits) - 2 - f.bias - f.man_bits);
  if (r > max_finite) r = HUGE_VAL;
  return std::copysign(r, x);
}

// What widening gives a pattern, bit for bit (half.h: exact; NaNs by rule).
uint32_t widened(const Format& f, uint16_t h) {
  if (is_nan16(f, h)) {
    if (f.dtype == Dtype::kBFloat16) return uint32_t{h} << 16;                      // as it was
    return uint32_t{h & 0x8000u} << 16 | 0x7fc00000u | uint32_t{h & 0x3ffu} << 13;  // quiet
  }
  return bits(static_cast<float>(value_of(f, h)));  // exact: every pattern is a float
}

// What rounding gives a float32, as a check of the kernel's output `h`.
testing::AssertionResult rounds_right(const Format& f, uint32_t u, uint16_t h) {
  const float x = std::bit_cast<float>(u);
  char what[96];
  std::snprintf(what, sizeof what, "%s of 0x%08x gave 0x%04x",
                std::string(dtype_name(f.dtype)).c_str(), u, h);
  if (std::isnan(x)) {
    const uint16_t want =
        f.dtype == Dtype::kBFloat16
            ? static_cast<uint16_t>((u >> 16) | 0x40u)
            : static_cast<uint16_t>((u >> 16 & 0x8000u) | 0x7e00u | (u >> 13 & 0x3ffu));
    if (h == want) return testing::AssertionSuccess();
    return testing::AssertionFailure() << what << ", the NaN rule says 0x" << std::hex << want;
  }
  if (is_nan16(f, h)) return testing::AssertionFailure() << what << ": a NaN";
  const double want = round_to(f, x);
  const double got = value_of(f, h);
  if (got == want && std::signbit(got) == std::signbit(want)) return testing::AssertionSuccess();
  return testing::AssertionFailure() << what << " = " << got << ", want " << want;
}

std::vector<std::byte> to_bytes(const std::vector<uint16_t>& v, size_t misalign) {
  std::vector<std::byte> b(misalign + 2 * v.size());
  std::memcpy(b.data() + misalign, v.data(), 2 * v.size());
  return b;
}

const Format& format_of(Dtype d) { return d == Dtype::kBFloat16 ? kBf16 : kFp16; }

// The variants, and the portable kernels of every unit this CPU runs (what
// another CPU's variants would be), named after their unit.
std::vector<HalfKernels> every_kernel(Dtype d) {
  const std::span<const HalfKernels> v = half_kernel_variants(d);
  std::vector<HalfKernels> all(v.begin(), v.end());
  const bool bf16 = d == Dtype::kBFloat16;
  auto add = [&](const HalfSet& set, std::string_view name) {
    HalfKernels k = bf16 ? set.bf16_portable : set.fp16_portable;
    k.name = name;
    all.push_back(k);
  };
  add(kHalfBaseline, "portable (the build's flags)");
  if (cpu_isa().avx2 && cpu_isa().f16c) add(kHalfAvx2, "portable (avx2)");
  return all;
}

// The variants this CPU must get, whatever the build's -march: the native
// instructions are tested wherever the CPU has them (this machine: AVX-512
// BF16 and F16C).
TEST(AggHalf, TheVariantsAreTheOnesThisCpuRuns) {
  auto names = [](Dtype d) {
    std::string s;
    for (const HalfKernels& k : half_kernel_variants(d)) s += std::string(k.name) + " ";
    return s;
  };
  EXPECT_EQ(half_kernel_variants(Dtype::kBFloat16).front().name, "portable");
  EXPECT_EQ(half_kernel_variants(Dtype::kFloat16).front().name, "portable");
  EXPECT_TRUE(half_kernel_variants(Dtype::kFloat32).empty());
  EXPECT_TRUE(half_kernel_variants(Dtype::kBytes).empty());
  const Isa& isa = cpu_isa();
  const bool avx512 = isa.avx512f && isa.avx512bw && isa.avx512vl;
  const bool f16c = isa.avx2 && isa.f16c;
  EXPECT_EQ(names(Dtype::kBFloat16),
            std::string("portable ") + (avx512 ? "avx512 " : "") +
                (avx512 && isa.avx512bf16 && isa.avx512dq ? "avx512_bf16 " : ""));
  EXPECT_EQ(names(Dtype::kFloat16),
            std::string("portable ") + (avx512 ? "avx512 " : "") + (f16c ? "f16c " : ""));
  // The portable kernels are the widest unit's.
  const HalfSet& widest = avx512 ? kHalfAvx512 : f16c ? kHalfAvx2 : kHalfBaseline;
  EXPECT_EQ(half_kernel_variants(Dtype::kBFloat16).front().widen_sum,
            widest.bf16_portable.widen_sum);
  EXPECT_EQ(half_kernel_variants(Dtype::kFloat16).front().narrow, widest.fp16_portable.narrow);
  for (const Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    EXPECT_EQ(half_kernels(d, true).name, "portable") << names(d);
    EXPECT_EQ(half_kernels(d).name, half_kernel_variants(d).back().name) << names(d);
  }
}

// The scalar definitions against the oracle, and a few cases by hand.
TEST(AggHalf, TheScalarDefinitionsMatchTheOracle) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    ASSERT_EQ(bits(bf16_to_float(static_cast<uint16_t>(h))),
              widened(kBf16, static_cast<uint16_t>(h)));
    ASSERT_EQ(bits(fp16_to_float(static_cast<uint16_t>(h))),
              widened(kFp16, static_cast<uint16_t>(h)));
  }
  // bfloat16 ties to even, subnormal ties, rounding up to infinity and to
  // the smallest normal; float16 overflow at 65520, subnormal steps.
  struct Case {
    uint32_t in;
    uint16_t bf16, fp16;
  };
  for (const Case c : {Case{0x3f808000, 0x3f80, 0x3c04},  // 1 + 2^-8: bfloat16 tie, down to even
                       Case{0x3f818000, 0x3f82, 0x3c0c},  // 1 + 3 x 2^-8: tie, up to even
                       Case{0x3f808001, 0x3f81, 0x3c04},  // just above the tie
                       Case{0x3f801000, 0x3f80, 0x3c00},  // 1 + 2^-11: float16 tie, down to even
                       Case{0x3f803000, 0x3f80, 0x3c02},  // 1 + 3 x 2^-11: tie, up to even
                       Case{0x00008000, 0x0000, 0x0000},  // subnormal tie to even (0)
                       Case{0x00018000, 0x0002, 0x0000},  // subnormal tie to even (2)
                       Case{0x007fffff, 0x0080, 0x0000},  // up to the smallest normal
                       Case{0x7f7fffff, 0x7f80, 0x7c00},  // float32 max: bfloat16 infinity
                       Case{0x477fe000, 0x4780, 0x7bff},  // 65504: float16 max
                       Case{0x477fefff, 0x4780, 0x7bff},  // just under 65520
                       Case{0x477ff000, 0x4780, 0x7c00},  // 65520: float16 infinity
                       Case{0x33000000, 0x3300, 0x0000},  // 2^-25: tie between 0 and 2^-24
                       Case{0x33000001, 0x3300, 0x0001},  // above it
                       Case{0x33c00000, 0x33c0, 0x0002},  // 1.5 x 2^-24: tie, up to even
                       Case{0x387fc000, 0x3880, 0x03ff},  // the largest float16 subnormal
                       Case{0x80000000, 0x8000, 0x8000},  // -0
                       Case{0xff800000, 0xff80, 0xfc00},  // -infinity
                       Case{0x7f800001, 0x7fc0, 0x7e00},  // signalling NaN: quiet
                       Case{0xffc12345, 0xffc1, 0xfe09}}) {
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(c.in)), c.bf16) << std::hex << c.in;
    EXPECT_EQ(float_to_fp16(std::bit_cast<float>(c.in)), c.fp16) << std::hex << c.in;
    EXPECT_TRUE(rounds_right(kBf16, c.in, c.bf16));
    EXPECT_TRUE(rounds_right(kFp16, c.in, c.fp16));
  }
}

// Every 16-bit pattern through each variant's widen_sum with one source,
// from an odd address, in calls of varying length (vector bodies and tails).
TEST(AggHalf, WideningIsExactForEveryPatternInEveryVariant) {
  for (const Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    std::vector<uint16_t> all(0x10000);
    for (uint32_t h = 0; h < all.size(); ++h) all[h] = static_cast<uint16_t>(h);
    const std::vector<std::byte> src = to_bytes(all, 1);
    for (const HalfKernels& k : every_kernel(d)) {
      std::vector<float> out(all.size());
      uint64_t done = 0;
      for (uint64_t len = 1; done < all.size(); len = len * 3 % 101 + 1) {
        const uint64_t n = std::min<uint64_t>(len, all.size() - done);
        const std::byte* p = src.data() + 1 + 2 * done;
        k.widen_sum(&p, 1, n, out.data() + done);
        done += n;
      }
      for (uint32_t h = 0; h < all.size(); ++h) {
        ASSERT_EQ(bits(out[h]), widened(format_of(d), static_cast<uint16_t>(h)))
            << dtype_name(d) << " " << k.name << " 0x" << std::hex << h;
      }
    }
  }
}

// n contributions summed in rank order: the float32 sum of the widened
// elements, left to right, bit for bit, for the unrolled counts (1, 2, 4,
// 8) and others, lengths with every tail, sources at odd addresses, values
// of every kind (random patterns include NaNs, infinities and subnormals).
// Where NaNs meet the sum is a NaN: which one's payload survives depends on
// the operand order the compiler gives a commutative add (C++ leaves it
// open), so only NaN-ness is compared there.
TEST(AggHalf, WidenSumIsTheRankOrderFloat32SumInEveryVariant) {
  std::mt19937 rng(42);
  for (const Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    const Format& f = format_of(d);
    for (const uint32_t n : {1u, 2u, 3u, 4u, 5u, 8u, 13u}) {
      for (const uint64_t elements : {1ull, 7ull, 15ull, 16ull, 17ull, 33ull, 704ull, 1001ull}) {
        std::vector<std::vector<uint16_t>> c(n, std::vector<uint16_t>(elements));
        for (auto& v : c) {
          for (uint16_t& h : v) {
            // Half random patterns, half values near 1 of varied magnitude,
            // so that the sums round (and their order shows).
            h = rng() % 2 ? static_cast<uint16_t>(rng())
                          : (d == Dtype::kBFloat16 ? float_to_bf16 : float_to_fp16)(
                                std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f,
                                           static_cast<int>(rng() % 9) - 4) *
                                (rng() % 2 ? 1.0f : -1.0f));
          }
        }
        std::vector<std::vector<std::byte>> bytes;
        std::vector<const std::byte*> src;
        for (uint32_t r = 0; r < n; ++r) bytes.push_back(to_bytes(c[r], 1 + r % 2));
        for (uint32_t r = 0; r < n; ++r) src.push_back(bytes[r].data() + 1 + r % 2);
        std::vector<float> want(elements);
        for (uint64_t i = 0; i < elements; ++i) {
          float s = std::bit_cast<float>(widened(f, c[0][i]));
          for (uint32_t r = 1; r < n; ++r) s = s + std::bit_cast<float>(widened(f, c[r][i]));
          want[i] = s;
        }
        for (const HalfKernels& k : every_kernel(d)) {
          std::vector<float> out(elements + 1, 7.0f);
          k.widen_sum(src.data(), n, elements, out.data());
          for (uint64_t i = 0; i < elements; ++i) {
            if (std::isnan(want[i])) {
              ASSERT_TRUE(std::isnan(out[i])) << k.name << " n=" << n << " i=" << i;
              continue;
            }
            ASSERT_EQ(bits(out[i]), bits(want[i])) << dtype_name(d) << " " << k.name << " n=" << n
                                                   << " elements=" << elements << " i=" << i;
          }
          EXPECT_EQ(out[elements], 7.0f) << k.name << ": wrote past the end";
        }
      }
    }
  }
}

// Rounding sweeps, per type: every value of the bits at and above the
// rounding point's neighbourhood, with the bits below it in each state
// (zero, 1, just below the tie, the tie, just above, all ones).
std::vector<uint32_t> rounding_sweep(const Format& f) {
  std::vector<uint32_t> in;
  if (f.dtype == Dtype::kBFloat16) {
    for (uint32_t hi = 0; hi < 0x10000; ++hi) {
      for (const uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
        in.push_back(hi << 16 | lo);
      }
    }
  } else {
    // float16 keeps 10 of float32's 23 mantissa bits for normals (fewer for
    // subnormals, whose rounding point lies higher: within the swept bits).
    for (uint32_t hi = 0; hi < (1u << 19); ++hi) {
      for (const uint32_t lo : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu}) {
        in.push_back(hi << 13 | lo);
      }
    }
  }
  return in;
}

TEST(AggHalf, RoundingIsToNearestEvenForEveryClassInEveryVariant) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  for (const Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    const Format& f = format_of(d);
    const std::vector<uint32_t> in = rounding_sweep(f);
    std::vector<float> src(in.size());
    std::memcpy(src.data(), in.data(), 4 * in.size());
    for (const HalfKernels& k : every_kernel(d)) {
      // Out to an odd address, in calls of varying length.
      std::vector<std::byte> out(1 + 2 * in.size() + 2, std::byte{0x5a});
      uint64_t done = 0;
      for (uint64_t len = 5; done < in.size(); len = len * 7 % 4099 + 1) {
        const uint64_t n = std::min<uint64_t>(len, in.size() - done);
        k.narrow(src.data() + done, n, out.data() + 1 + 2 * done);
        done += n;
      }
      EXPECT_EQ(out[0], std::byte{0x5a});
      EXPECT_EQ(out[out.size() - 1], std::byte{0x5a}) << k.name << ": wrote past the end";
      for (size_t i = 0; i < in.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, out.data() + 1 + 2 * i, 2);
        ASSERT_TRUE(rounds_right(f, in[i], h)) << k.name;
      }
    }
  }
}

// Random float32 patterns too (every bit below the rounding point varies).
TEST(AggHalf, RoundingOfRandomPatternsInEveryVariant) {
  std::mt19937 rng(7);
  std::vector<uint32_t> in(1 << 18);
  for (uint32_t& u : in) u = static_cast<uint32_t>(rng());
  std::vector<float> src(in.size());
  std::memcpy(src.data(), in.data(), 4 * in.size());
  for (const Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    for (const HalfKernels& k : every_kernel(d)) {
      std::vector<uint16_t> out(in.size());
      k.narrow(src.data(), in.size(), reinterpret_cast<std::byte*>(out.data()));
      for (size_t i = 0; i < in.size(); ++i) {
        ASSERT_TRUE(rounds_right(format_of(d), in[i], out[i])) << k.name;
      }
    }
  }
}

}  // namespace
}  // namespace mercury::agg
