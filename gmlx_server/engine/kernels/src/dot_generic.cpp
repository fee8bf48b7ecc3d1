// Portable kernels: GCC/Clang vector extensions without ISA-specific intrinsics (NEON dot on arm64).
#define GK_ISA generic
#if defined(__ARM_FEATURE_DOTPROD)
#define GK_ISA_NAME "neon-dotprod"
#elif defined(__ARM_NEON)
#define GK_ISA_NAME "neon"
#else
#define GK_ISA_NAME "generic"
#endif
#include "dot_impl.h"

namespace gk {
const Isa& isa_generic() { return generic::table; }
}  // namespace gk
