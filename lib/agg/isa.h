// The instruction sets this CPU runs, read once: what the runtime choice of
// kernels (optimizer.cpp, half.cpp) goes by. Internal to lib/agg.
//
// Each flag means the CPU has the instructions and the OS saves their
// registers (GCC's and clang's __builtin_cpu_supports check both; F16C, which
// clang 14's builtin does not know, is cpuid leaf 1 with AVX's own check).
// Control path: the first call reads cpuid (a function-local static,
// thread-safe); later calls return the same flags, from any thread.
#pragma once

namespace mercury::agg {

struct Isa {
  bool avx2 = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512bf16 = false;
  /// AVX-512F/BW/VL: what the AVX-512 kernel units are compiled for (lib/agg/meson.build).
  [[nodiscard]] bool avx512() const { return avx512f && avx512bw && avx512vl; }
};

const Isa& cpu_isa();

}  // namespace mercury::agg
