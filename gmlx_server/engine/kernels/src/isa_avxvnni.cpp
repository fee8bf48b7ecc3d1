// x86-64 AVX2 with AVX-VNNI's vpdpbusd on 256-bit registers (Alder Lake, Sapphire Rapids and later).
#define GK_ISA avxvnni
#define GK_ISA_NAME "avx-vnni"
#include "isa_impl.h"

namespace gk {
const Isa& isa_avxvnni() { return avxvnni::table; }
}  // namespace gk
