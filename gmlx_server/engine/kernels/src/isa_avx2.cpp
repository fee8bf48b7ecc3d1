// x86-64 AVX2 + FMA + F16C (compiled with those flags; chosen at run time by dispatch.cpp).
#define GK_ISA avx2
#define GK_ISA_NAME "avx2"
// int16 at every row count: on a Zen 3 it beat fp32 at 2 to 47 rows in every format (1.1-2x; 2 threads, cold
// weights) and was level at 48 to 128 (where sgemm takes over when a BLAS is loaded)
#define GK_INT16_ROWS (1 << 30)
// four activation rows share a weight block's decode: one int32 register a row's accumulator (qdot.h) fits them
#define GK_Q16_TILE 4
#include "isa_impl.h"

namespace gk {
const Isa& isa_avx2() { return avx2::table; }
}  // namespace gk
