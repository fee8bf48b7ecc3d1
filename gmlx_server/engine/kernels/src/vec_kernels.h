// The kernels of attention (fp32 queries over an fp32 or fp16 KV cache) and the gated activations, compiled
// once per instruction set with the matmuls (isa_impl.h): flash.cpp's key blocks, sdpa.cpp's few-row path and
// glu.cpp's spans call them through the chosen Isa table. Written in v16.h's kit.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>

#include "flash.h"
#include "kernels.h"
#include "v16.h"

namespace gk {
namespace GK_ISA {

using namespace vm;
static_assert(W == kFlashWidth, "flash.cpp transposes keys in blocks of the v16 width");

// KV elements as floats: T is float, or uint16_t for a float16 cache's fp16 bits (widened in registers;
// 16 at a time: v16.h's row16).
inline float widen1(const float* p) { return *p; }
inline float widen1(const uint16_t* p) { return h2f(*p); }

// n elements of p as floats: p itself when T is float, else widened into buf (n floats).
inline const float* widen_row(const float* p, int64_t, float*) { return p; }
inline const float* widen_row(const uint16_t* p, int64_t n, float* buf) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store16(buf + i, h2f16(p + i));
  for (; i < n; ++i) buf[i] = h2f(p[i]);
  return buf;
}

// K rows [s0, s0 + W) as D vectors of W keys (past the end: zeros, masked by the row limits). A whole block's
// dims go 16 at a time through registers (decode reads each block for only a few query rows, so the
// transpose is much of its attention); a ragged block and the dims past the last 16 go one by one.
template <typename T>
inline void transpose_keys_t(const FlashArgs& a, int64_t s0, float* kt) {
  const int64_t n = a.S - s0 < W ? a.S - s0 : W;
  const T* k = static_cast<const T*>(a.k) + s0 * a.ks;
  int64_t d = 0;
  if (n == W) {
    for (; d + W <= a.D; d += W) transpose_block(k + d, a.ks, kt + d * W);
  } else {
    std::memset(kt, 0, sizeof(float) * a.D * W);
  }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t e = d; e < a.D; ++e) kt[e * W + j] = widen1(k + j * a.ks + e);
}

inline void transpose_keys(const FlashArgs& a, int64_t s0, float* kt) {
  a.half ? transpose_keys_t<uint16_t>(a, s0, kt) : transpose_keys_t<float>(a, s0, kt);
}

// V rows [s0, s0 + W) of a float16 cache as floats, Dv apart: once per key block for every row of a task.
inline void widen_values(const FlashArgs& a, int64_t s0, float* vt) {
  const int64_t n = a.S - s0 < W ? a.S - s0 : W;
  const uint16_t* v = static_cast<const uint16_t*>(a.v) + s0 * a.vs;
  for (int64_t j = 0; j < n; ++j) widen_row(v + j * a.vs, a.Dv, vt + j * a.Dv);
}

// out[0..N) = out * fix + sum over keys j <= last of p[j] * (V row j's N vectors from vb, rows vs floats apart)
template <int N>
inline void weigh_values(v16* out, const v16& p, const float* vb, int64_t vs, int64_t last, float fix) {
  v16 o[N];
  for (int u = 0; u < N; ++u) o[u] = out[u] * fix;
  for (int64_t j = 0; j <= last; ++j) {
    const float pj = p[j];
    const v16* vr = reinterpret_cast<const v16*>(vb + j * vs);
    for (int u = 0; u < N; ++u) o[u] += pj * vr[u];
  }
  for (int u = 0; u < N; ++u) out[u] = o[u];
}

// Key block [s0, s0 + W) against one query row: scores, mask, online softmax, and the weighted V rows (vb, vs
// floats apart: the cache's fp32 rows or a float16 block widened).
inline void block_row(const FlashArgs& a, const float* q, const float* kt, const float* vb, int64_t vs, int64_t s0,
                      int64_t limit, const uint8_t* mrow, RowState& st, float* acc) {
  const float lowest = std::numeric_limits<float>::lowest();
  const v16* k = reinterpret_cast<const v16*>(kt);
  v16 c[4] = {};  // four chains: one accumulator would wait on each FMA's latency
  int64_t d = 0;
  for (; d + 4 <= a.D; d += 4)
    for (int u = 0; u < 4; ++u) c[u] += q[d + u] * k[d + u];
  for (; d < a.D; ++d) c[0] += q[d] * k[d];
  v16 s = ((c[0] + c[1]) + (c[2] + c[3])) * a.scale;
  for (int j = a.kind == 0 && s0 + W - 1 <= limit ? W : 0; j < W; ++j) {  // only edge blocks and masks
    const int64_t key = s0 + j;
    if (key > limit) {
      s[j] = lowest;
    } else if (a.kind == 1) {
      if (!reinterpret_cast<const bool*>(mrow)[key * a.ms]) s[j] = lowest;
    } else if (a.kind == 2) {
      s[j] += reinterpret_cast<const float*>(mrow)[key * a.ms] * kLog2e;
    }
  }
  const float m = st.m > hmax(s) ? st.m : hmax(s);
  // 0 on the first block (st.m is the lowest float); 1 (exp2(0)) where the max held, without the libm call
  const float fix = m == st.m ? 1.0f : std::exp2(st.m - m);
  const int64_t last = limit - s0 < W - 1 ? limit - s0 : W - 1;
  v16 p = exp2v(s - m);
  for (int64_t j = last + 1; j < W; ++j) p[j] = 0.0f;  // past the row's last key: never a weight
  st.l = st.l * fix + hsum(p);
  st.m = m;
  // four output vectors at a time held in registers across the block's keys: a count fixed at compile time
  // (with a runtime count GCC kept them on the stack, every FMA waiting on a store: a third of decode attention)
  v16* out = reinterpret_cast<v16*>(acc);
  const int64_t spans = a.Dv / W;
  int64_t i = 0;
  for (; i + 4 <= spans; i += 4) weigh_values<4>(out + i, p, vb + i * W, vs, last, fix);
  switch (spans - i) {
    case 3: weigh_values<3>(out + i, p, vb + i * W, vs, last, fix); break;
    case 2: weigh_values<2>(out + i, p, vb + i * W, vs, last, fix); break;
    case 1: weigh_values<1>(out + i, p, vb + i * W, vs, last, fix); break;
    default: break;
  }
}

// row: a float16 cache's key or value row widened once (it is read D or Dv times), unused for float
template <typename T>
inline void attend_t(const AttendRow& r, float* scores, float* out, float* row) {
  const float lowest = std::numeric_limits<float>::lowest();
  const T* K = static_cast<const T*>(r.k);
  const T* V = static_cast<const T*>(r.v);
  float mx_ = lowest;
  for (int64_t s = 0; s <= r.limit; ++s) {
    const float* k = widen_row(K + s * r.ks, r.D, row);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= r.D; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += r.q[i + j] * k[i + j];
    float d = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < r.D; ++i) d += r.q[i] * k[i];
    float sc = d * r.scale;
    if (r.kind == 1 && !reinterpret_cast<const bool*>(r.mask)[s * r.ms]) sc = lowest;
    if (r.kind == 2) sc += reinterpret_cast<const float*>(r.mask)[s * r.ms] * kLog2e;
    scores[s] = sc;
    mx_ = sc > mx_ ? sc : mx_;
  }
  for (int64_t i = 0; i < r.Dv; ++i) out[i] = 0.0f;
  float sum = 0.0f;
  for (int64_t s = 0; s <= r.limit; ++s) {
    const float p = std::exp2(scores[s] - mx_);
    sum += p;
    const float* v = widen_row(V + s * r.vs, r.Dv, row);
    for (int64_t i = 0; i < r.Dv; ++i) out[i] += p * v[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < r.Dv; ++i) out[i] *= inv;
}

// scores: limit + 1 floats, then max(D, Dv) for a float16 cache's widened rows (sdpa.cpp sizes it)
inline void attend(const AttendRow& r, float* scores, float* out) {
  float* row = scores + r.limit + 1;
  r.half ? attend_t<uint16_t>(r, scores, out, row) : attend_t<float>(r, scores, out, row);
}


inline void gate_span(int kind, const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const v16 x = load16(g + i);
    v16 a;
    if (kind == 0) {  // x * sigmoid(x)
      a = x / (1.0f + exp2v(x * -kLog2e));
    } else {  // 0.5 x (1 + tanh(c (x + 0.044715 x^3))), tanh(t) = 1 - 2 / (1 + e^(2t))
      const v16 t = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      a = 0.5f * x * (2.0f - 2.0f / (1.0f + exp2v(t * (2.0f * kLog2e))));
    }
    if (u != nullptr) a *= load16(u + i);
    store16(y + i, a);
  }
  for (; i < n; ++i) {  // the tail through the same vector code, one lane used
    float g1[W] = {}, u1[W] = {}, y1[W];
    g1[0] = g[i], u1[0] = u != nullptr ? u[i] : 0.0f;
    gate_span(kind, g1, u != nullptr ? u1 : nullptr, y1, W);
    y[i] = y1[0];
  }
}

}  // namespace GK_ISA
}  // namespace gk
