// Portable kernels: GCC/Clang vector extensions without ISA-specific intrinsics (NEON dot on arm64).
#define GK_ISA generic
#include "simd.h"
#if defined(GK_NEON_DOT)
#define GK_ISA_NAME "neon-dotprod"
#elif defined(GK_NEON)
#define GK_ISA_NAME "neon"
#else
#define GK_ISA_NAME "generic"
#endif
#include "isa_impl.h"

namespace gk {
const Isa& isa_generic() { return generic::table; }
}  // namespace gk
