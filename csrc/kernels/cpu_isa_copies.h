// Compiles the loops of BAGUA_ISA_LOOPS (a quoted file name) once per instruction set of
// kernels/cpu_isa.h: in the namespaces baseline, avx2 and avx512 (the x86 copies only where
// BAGUA_X86_ISAS), each with BAGUA_ISA_NS naming its namespace and BAGUA_ISA_TARGET its target
// attribute. BAGUA_ISA_AVX2_EXTRA, when defined, is included in the AVX2 copy only (loops written
// with AVX2 intrinsics). Include it where the loops' enclosing namespace is open; it undefines
// BAGUA_ISA_LOOPS and BAGUA_ISA_AVX2_EXTRA, so each file names its own. No include guard: one
// inclusion per set of loops.

#define BAGUA_ISA_NS baseline
#define BAGUA_ISA_TARGET
#include BAGUA_ISA_LOOPS
#undef BAGUA_ISA_NS
#undef BAGUA_ISA_TARGET

#if BAGUA_X86_ISAS
#define BAGUA_ISA_NS avx2
#define BAGUA_ISA_TARGET BAGUA_AVX2_TARGET
#include BAGUA_ISA_LOOPS
#ifdef BAGUA_ISA_AVX2_EXTRA
#include BAGUA_ISA_AVX2_EXTRA
#endif
#undef BAGUA_ISA_NS
#undef BAGUA_ISA_TARGET

#define BAGUA_ISA_NS avx512
#define BAGUA_ISA_TARGET BAGUA_AVX512_TARGET
#include BAGUA_ISA_LOOPS
#undef BAGUA_ISA_NS
#undef BAGUA_ISA_TARGET
#endif

#undef BAGUA_ISA_LOOPS
#undef BAGUA_ISA_AVX2_EXTRA
