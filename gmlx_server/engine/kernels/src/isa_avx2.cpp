// x86-64 AVX2 + FMA + F16C (compiled with those flags; chosen at run time by dispatch.cpp).
#define GK_ISA avx2
#define GK_ISA_NAME "avx2"
// int16 beat fp32 at 2 to 8 rows in every format on a Zen 3 (1.3-2x; 2 threads, cold weights)
#define GK_INT16_ROWS 8
// four activation rows share a weight block's decode: one int32 register a row's accumulator (qdot.h) fits them
#define GK_Q16_TILE 4
#include "isa_impl.h"

namespace gk {
const Isa& isa_avx2() { return avx2::table; }
}  // namespace gk
