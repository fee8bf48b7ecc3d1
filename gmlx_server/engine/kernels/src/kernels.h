// Quantized matmul over GGUF blocks as stored: the driver (dispatch.cpp) and the per-ISA tables.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gk {

// 32 activations quantized to int8: x[i] ~= d * q[i]; s0/s1 = d * sum(q) over each 16-element half.
struct XBlock {
  float d, s0, s1, pad;
  int8_t q[32];
};

// 32 activations quantized to int16 (the default few-row path): x[i] ~= d * q[i], s0/s1 as above.
struct XBlock16 {
  float d, s0, s1, pad;
  int16_t q[32];
};

struct Isa {
  const char* name;
  void (*rows)(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XBlock* x,
               int64_t m_rows, int64_t xstride, float* y, int64_t ldy);
  void (*rows16)(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XBlock16* x,
                 int64_t m_rows, int64_t xstride, float* y, int64_t ldy);
  // the same product with fp32 activations (x is (m_rows, k) row-major): no activation rounding
  void (*rows_f)(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const float* x,
                 int64_t m_rows, int64_t k, float* y, int64_t ldy);
  void (*quantize_row)(const float* x, int64_t k, XBlock* out);
  void (*quantize_row16)(const float* x, int64_t k, XBlock16* out);
  void (*dequant_row)(int type, const uint8_t* w, int64_t k, float* out);
};

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
// How few-row matmuls take activations: "f32" (default: exact; weights decoded to fp32 in registers,
// faster than the integer paths here since the decode, not the multiply, bounds them), "int16" (per-32
// int16 rounding, integer dot products) or "int8" (llama.cpp's rounding: a block's largest activation
// sets the step of the other 31, and some models' outliers make that visible in the logits).
void set_activations(const std::string& mode);
std::string activations();

}  // namespace gk
