#include "agg/isa.h"

#include <cpuid.h>

namespace mercury::agg {

const Isa& cpu_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    Isa i;
    i.avx2 = __builtin_cpu_supports("avx2") != 0;
    i.avx512f = __builtin_cpu_supports("avx512f") != 0;
    i.avx512bw = __builtin_cpu_supports("avx512bw") != 0;
    i.avx512vl = __builtin_cpu_supports("avx512vl") != 0;
    i.avx512dq = __builtin_cpu_supports("avx512dq") != 0;
    i.avx512bf16 = __builtin_cpu_supports("avx512bf16") != 0;
    // F16C: cpuid leaf 1, ECX bit 29; its VEX registers are AVX's, whose OS
    // support the avx2 flag above has checked.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    i.f16c = i.avx2 && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    return i;
  }();
  return isa;
}

}  // namespace mercury::agg
