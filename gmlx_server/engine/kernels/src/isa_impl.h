// Everything compiled once per instruction set, and that set's table: each isa_*.cpp defines GK_ISA (its
// namespace) and GK_ISA_NAME, gets its target flags from CMakeLists.txt, and includes this file once.
#pragma once

#include "dot_impl.h"
#include "gemm16.h"
#include "kernels.h"
#include "vec_kernels.h"

namespace gk {
namespace GK_ISA {

#ifndef GK_INT16_ROWS
#define GK_INT16_ROWS 0  // the per-format table alone
#endif

#if defined(GK_GEMM16)
#define GK_GEMM_Q16 &gemm_q16, g16::kTile
#else
#define GK_GEMM_Q16 nullptr, 0
#endif

inline const Isa table = {GK_ISA_NAME, GK_INT16_ROWS, &rows, &rows_q16, &rows_f, &quantize_row, &quantize_q16,
                          GK_GEMM_Q16, &dequant_row, &transpose_keys, &widen_values, &block_row, &attend, &gate_span};

}  // namespace GK_ISA
}  // namespace gk
