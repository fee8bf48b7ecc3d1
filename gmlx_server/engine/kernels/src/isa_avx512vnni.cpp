// x86-64 AVX-512 VNNI (+VL) on 256-bit registers (Cascade Lake, Ice Lake, Zen 4 and later).
#define GK_ISA avx512vnni
#define GK_ISA_NAME "avx512-vnni"
#include "isa_impl.h"

namespace gk {
const Isa& isa_avx512vnni() { return avx512vnni::table; }
}  // namespace gk
