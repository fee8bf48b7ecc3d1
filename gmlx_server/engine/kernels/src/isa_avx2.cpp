// x86-64 AVX2 + FMA + F16C (compiled with those flags; chosen at run time by dispatch.cpp).
#define GK_ISA avx2
#define GK_ISA_NAME "avx2"
#include "isa_impl.h"

namespace gk {
const Isa& isa_avx2() { return avx2::table; }
}  // namespace gk
