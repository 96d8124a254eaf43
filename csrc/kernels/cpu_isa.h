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
