// The kernels' instruction-set tables and the drivers' entry points (dispatch.cpp): the quantized matmul over
// GGUF blocks as stored, and the attention and activation kernels, each compiled once per ISA (isa_*.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flash.h"

namespace gk {

constexpr float kLog2e = 1.4426950408889634f;  // attention's scores are in log2 units (exp2 is the cheap one)

// 32 activations quantized to int8: x[i] ~= d * q[i]; s0/s1 = d * sum(q) over each 16-element half.
struct XBlock {
  float d, s0, s1, pad;
  int8_t q[32];
};

// Activation rows quantized to int16 (qdot.h): row r's k codes at q + r * k, one scale per group (32
// elements, or 256 for the K-quants) at d + r * k / group, and d * (sum of codes) per 32 at s + r * k / 32.
struct XRows {
  int16_t* q;
  float* d;
  float* s;
  int64_t k;
};

// The largest activation code of the few-row int16 kernels (qdot.h), and of the many-row product (gemm16.h):
// 14 bits there, so that an int32 lane sums a run of products without overflow (13 bits, a whole Q4_K block a
// run, flipped a near-tied greedy token between a prompt-cache hit and its cold run).
constexpr int kRowsFull = 32767, kGemmFull = 16383;
// From this many activation rows on, the formats the int16 GEMM reads take it (gemm16.h), where the ISA has one. At
// 24-47 rows it ran 1.2-2.1x the few-row kernels on Zen 4, but its rounding then moved a short prompt's logprobs
// past 1e-3 against a prompt-cache hit's fp32 tail (test_tools_structured_sdk): it starts where sgemm does.
constexpr int64_t kGemmRows = 48;

struct Isa {
  const char* name;
  // activation rows up to which the int16 kernels beat the fp32 ones for every format on this ISA (AVX2's
  // fp32 decode costs more than its vpmaddwd products: bench/kernel_speed.py); above, dispatch.cpp's table
  int int16_rows;
  void (*rows)(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XBlock* x,
               int64_t m_rows, int64_t xstride, float* y, int64_t ldy);
  void (*rows_q16)(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XRows& x,
                   int64_t m_rows, float* y, int64_t ldy);
  // the same product with fp32 activations (x is (m_rows, k) row-major): no activation rounding
  void (*rows_f)(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const float* x,
                 int64_t m_rows, int64_t k, float* y, int64_t ldy);
  void (*quantize_row)(const float* x, int64_t k, XBlock* out);
  void (*quantize_q16)(const float* x, int64_t k, int group, const uint8_t* order, int64_t row, const XRows& out,
                       int full);
  // many activation rows against a repacked K-quant or a 32-block format (gemm16.h; rows quantized to kGemmFull):
  // null where the ISA has none, and sgemm on dequantized panels does that work
  void (*gemm_q16)(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XRows& x,
                   int64_t m_rows, float* y, int64_t ldy);
  // activation rows of one tile of that product: its codes come interleaved tile by tile (rows padded with zeros
  // to whole tiles), pair p of the tile's row c at int32 p * gemm_tile + c of the tile's k / 2 * gemm_tile
  int gemm_tile;
  void (*dequant_row)(int type, const uint8_t* w, int64_t k, float* out);
  // K rows [s0, s0 + kFlashWidth) of a.k (fp32 or fp16) as D vectors of kFlashWidth floats (flash.cpp)
  void (*transpose_keys)(const FlashArgs& a, int64_t s0, float* kt);
  // V rows [s0, s0 + kFlashWidth) of a float16 a.v widened to floats, Dv apart (flash.cpp)
  void (*widen_values)(const FlashArgs& a, int64_t s0, float* vt);
  // key block [s0, s0 + kFlashWidth) against one query row: kt the block's keys transposed, vb its value rows
  // (float, vs apart) (flash.cpp)
  void (*block_row)(const FlashArgs& a, const float* q, const float* kt, const float* vb, int64_t vs, int64_t s0,
                    int64_t limit, const uint8_t* mrow, RowState& st, float* acc);
  void (*attend)(const AttendRow& r, float* scores, float* out);  // one row of the few-row path (sdpa.cpp)
  // act(g) * u (u may be null) over n floats: kind 0 SiLU, 1 GELU's tanh form (glu.cpp)
  void (*gate_span)(int kind, const float* g, const float* u, float* y, int64_t n);
};

// The table every kernel runs from: the fastest this CPU supports, or the one set_isa chose.
const Isa& active_isa();

// y (m, n) = x (m, k) @ W^T for W (n, k) stored as GGUF blocks of `type`, on the kernel thread pool.
void matmul(int type, const uint8_t* w, int64_t n, int64_t k, const float* x, int64_t m, float* y);
// fn(0..tasks-1) on the kernel thread pool (other CPU primitives share it)
void parallel_for(int64_t tasks, const std::function<void(int64_t)>& fn);
// rows (r, row_bytes) of GGUF blocks -> (r, k) floats
void dequantize(int type, const uint8_t* w, int64_t r, int64_t k, float* out);

// bytes of one row of k elements, or -1 when no kernel reads `type` or k is not whole blocks
int64_t row_bytes(int type, int64_t k);
const char* isa_name();
std::vector<std::string> isa_names();  // usable on this CPU, fastest first
void set_isa(const std::string& name);
int threads();
void set_threads(int n);  // n <= 0: the cores this process may run on
// Many-row matmuls dequantize W panels into a preloaded BLAS's sgemm when one is there (and allowed).
bool sgemm_available();
void set_sgemm(bool on);
// How few-row matmuls take activations: "auto" (default: int16 up to a per-format row count, fp32 beyond),
// "f32" (exact; weights decoded to fp32 in registers), "int16" (rounded per 32, or per 256 for the
// K-quants, to 1/32767 of the group's largest: integer dot products, qdot.h) or "int8" (llama.cpp's
// rounding: a block's largest activation sets the step of the other 31, and some models' outliers make
// that visible in the logits: SmolLM2's moved by 1.2, Gemma 3's by 0.8, where int16 moves them by 0.007).
void set_activations(const std::string& mode);
std::string activations();

}  // namespace gk
