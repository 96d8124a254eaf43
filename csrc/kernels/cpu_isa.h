// Which x86 vector extensions the host kernels use. The module is built for baseline x86-64; kernels
// that gain from wider vectors are compiled a second and third time for AVX2 and AVX-512 (GCC target
// attributes on the same loops) and chosen at run time: by default the best the CPU and the OS
// support, detected once. Every copy computes the same scalar math without reassociation or FMA
// contraction, so the choice changes speed, never results (tests compare them bitwise);
// set_cpu_isa exists so that tests and benchmarks can run each copy.
#pragma once

namespace bagua {

enum class CpuIsa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// "baseline", "avx2", "avx512".
const char* cpu_isa_name(CpuIsa isa);
// Whether this CPU and OS run kernels built for isa (baseline: always).
bool cpu_isa_supported(CpuIsa isa);
// The ISA the kernels use now.
CpuIsa cpu_isa();
// Makes the kernels use isa from now on (all threads); throws InvalidArgument if it is unsupported here.
void set_cpu_isa(CpuIsa isa);

}  // namespace bagua

// For the files that compile their loops once per ISA (kernels/compress_cpu.cc,
// kernels/low_rank_cpu.cc; kernels/cpu_isa_copies.h makes the copies): whether
// this compiler builds the x86 copies, the target attributes of the AVX2 and
// AVX-512 copies, and `return ns::fn(args)` for the namespace (baseline, avx2,
// avx512) of the ISA in use. fn must deduce
// its template arguments (the macro splits on commas).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BAGUA_X86_ISAS 1
#define BAGUA_AVX2_TARGET __attribute__((target("avx2")))
#define BAGUA_AVX512_TARGET __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512dq")))
#define BAGUA_ISA_CALL(fn, ...)                                    \
  switch (::bagua::cpu_isa()) {                                    \
    case ::bagua::CpuIsa::kAvx512: return avx512::fn(__VA_ARGS__); \
    case ::bagua::CpuIsa::kAvx2: return avx2::fn(__VA_ARGS__);     \
    default: return baseline::fn(__VA_ARGS__);                     \
  }
#else
#define BAGUA_X86_ISAS 0
#define BAGUA_ISA_CALL(fn, ...) return baseline::fn(__VA_ARGS__);
#endif
