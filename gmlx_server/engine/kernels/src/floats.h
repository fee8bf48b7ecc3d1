// GGUF blocks decoded straight to fp32 vectors, and the few-row matmul over them. A row's scales are
// decoded first into per-16-element maps (w = a * code + b, as in formats.h), so the inner loop only
// widens codes to 32-bit lanes and broadcasts maps from memory.
#pragma once

#include <vector>

#include "formats.h"
#include "simd.h"

namespace gk {
namespace GK_ISA {

// A byte's low nibble; lut16 reads only its index's low 4 bits, so 4-bit codes skip the mask there.
template <int BITS>
inline VI low4(VI v) {
#if defined(GK_LUT)
  if constexpr (BITS == 4) return v;
#endif
  return band(v, 15);
}

// Q4_0 / Q4_1 nibbles: byte j holds element j (low) and j + 16 (high).
template <int BITS>
inline VI nibble32(const uint8_t* qs, int e) {
  const VI v = u8(qs + (e & 15));
  return e < 16 ? low4<BITS>(v) : shr(v, 4);
}

// Q5_0 / Q5_1: bit i of the little-endian uint32 qh is bit 4 of element i.
inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The maps of one row, half by half: a[2 * group + h], b[2 * group + h] for h = 0 (elements 0..15), 1.
inline void put(float* a, float* b, int64_t i, float av, float bv) {
  a[2 * i] = a[2 * i + 1] = av;
  b[2 * i] = b[2 * i + 1] = bv;
}

// Each format: HAS_B (b is not always 0), BITS (codes < 2^BITS, but Q8_0's signed), scales() fills a
// row's maps, codes() is elements e..e+L-1 of group g of a block as 32-bit integer lanes.
struct DQ4_0 {
  static constexpr int QK = 32, BYTES = 18, GROUPS = 1;
  static constexpr bool HAS_B = true;
  static constexpr int BITS = 4;  // code width
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    for (int64_t i = 0; i < nb; ++i, p += BYTES) put(a, b, i, f16_at(p), -8.0f * f16_at(p));
  }
  static VI codes(const uint8_t* p, int, int e) { return nibble32<BITS>(p + 2, e); }
};

struct DQ4_1 {
  static constexpr int QK = 32, BYTES = 20, GROUPS = 1;
  static constexpr bool HAS_B = true;
  static constexpr int BITS = 4;  // code width
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    for (int64_t i = 0; i < nb; ++i, p += BYTES) put(a, b, i, f16_at(p), f16_at(p + 2));
  }
  static VI codes(const uint8_t* p, int, int e) { return nibble32<BITS>(p + 4, e); }
};

struct DQ5_0 {
  static constexpr int QK = 32, BYTES = 22, GROUPS = 1;
  static constexpr bool HAS_B = true;
  static constexpr int BITS = 5;  // code width
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    for (int64_t i = 0; i < nb; ++i, p += BYTES) put(a, b, i, f16_at(p), -16.0f * f16_at(p));
  }
  static VI codes(const uint8_t* p, int, int e) { return bor(nibble32<BITS>(p + 6, e), bit4(u32_at(p + 2) >> e)); }
};

struct DQ5_1 {
  static constexpr int QK = 32, BYTES = 24, GROUPS = 1;
  static constexpr bool HAS_B = true;
  static constexpr int BITS = 5;  // code width
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    for (int64_t i = 0; i < nb; ++i, p += BYTES) put(a, b, i, f16_at(p), f16_at(p + 2));
  }
  static VI codes(const uint8_t* p, int, int e) { return bor(nibble32<BITS>(p + 8, e), bit4(u32_at(p + 4) >> e)); }
};

struct DQ8_0 {
  static constexpr int QK = 32, BYTES = 34, GROUPS = 1;
  static constexpr bool HAS_B = false;
  static constexpr int BITS = 8;  // code width
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    for (int64_t i = 0; i < nb; ++i, p += BYTES) put(a, b, i, f16_at(p), 0.0f);
  }
  static VI codes(const uint8_t* p, int, int e) { return i8(p + 2 + e); }
};

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit (scale, min) pairs.
inline void k_scales(const uint8_t* p, int64_t nb, int bytes, float* a, float* b) {
  for (int64_t i = 0; i < nb; ++i, p += bytes) {
    float sa[8], sb[8];
    k_scale_min(p + 4, f16_at(p), f16_at(p + 2), sa, sb);
    for (int g = 0; g < 8; ++g) put(a, b, 8 * i + g, sa[g], sb[g]);
  }
}

// K-quant 4-bit codes: 32-byte chunk c holds sub-block 2c (low nibbles) and 2c + 1 (high nibbles).
template <int BITS>
inline VI k_nibble(const uint8_t* qs, int g, int e) {
  const VI v = u8(qs + 32 * (g >> 1) + e);
  return (g & 1) ? shr(v, 4) : low4<BITS>(v);
}

struct DQ4_K {
  static constexpr int QK = 256, BYTES = 144, GROUPS = 8;
  static constexpr bool HAS_B = true;
  static constexpr int BITS = 4;  // code width
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) { k_scales(p, nb, BYTES, a, b); }
  static VI codes(const uint8_t* p, int g, int e) { return k_nibble<BITS>(p + 16, g, e); }
};

struct DQ5_K {
  static constexpr int QK = 256, BYTES = 176, GROUPS = 8;
  static constexpr bool HAS_B = true;
  static constexpr int BITS = 5;  // code width
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) { k_scales(p, nb, BYTES, a, b); }
  // bit g of qh[i] is bit 4 of element i of sub-block g
  static VI codes(const uint8_t* p, int g, int e) {
    return bor(k_nibble<BITS>(p + 48, g, e), bit4(bitplane(p + 16, g) >> e));
  }
};

// Q6_K: ql[128] qh[64] int8 scales[16] d; w = d * scale * (q - 32) per 16-element sub-block. Half h of
// the block (128 elements) is four groups k: low (k < 2) or high nibbles of ql[h*64 + 32*(k&1)], and
// bits 2k..2k+1 of qh[h*32 + i] as bits 4..5.
struct DQ6_K {
  static constexpr int QK = 256, BYTES = 210, GROUPS = 8;
  static constexpr bool HAS_B = true;
  static constexpr int BITS = 6;  // code width
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    for (int64_t i = 0; i < nb; ++i, p += BYTES) {
      const float d = f16_at(p + 208);
      for (int j = 0; j < 16; ++j) {
        a[16 * i + j] = d * static_cast<float>(static_cast<int8_t>(p[192 + j]));
        b[16 * i + j] = -32.0f * a[16 * i + j];
      }
    }
  }
  static VI codes(const uint8_t* p, int g, int e) {
    const int h = g >> 2, k = g & 3;
    const VI ql = u8(p + h * 64 + 32 * (k & 1) + e);
    const VI hi = shl(band(shr(u8(p + 128 + h * 32 + e), 2 * k), 3), 4);
    return bor(k < 2 ? band(ql, 15) : shr(ql, 4), hi);
  }
};

// Calls f.template operator()<Format>() for the runtime type; false for a type with no kernel.
template <class Fn>
inline bool with_floats(int type, Fn&& f) {
  switch (type) {
    case Q4_0: f.template operator()<DQ4_0>(); return true;
    case Q4_1: f.template operator()<DQ4_1>(); return true;
    case Q5_0: f.template operator()<DQ5_0>(); return true;
    case Q5_1: f.template operator()<DQ5_1>(); return true;
    case Q8_0: f.template operator()<DQ8_0>(); return true;
    case Q4_K: f.template operator()<DQ4_K>(); return true;
    case Q5_K: f.template operator()<DQ5_K>(); return true;
    case Q6_K: f.template operator()<DQ6_K>(); return true;
    default: return false;
  }
}

// Elements e..e+L-1 of group g of block `blk`, whose maps start at a, b.
template <class F>
inline VF decode(const uint8_t* blk, int g, int e, const float* a, const float* b) {
  const int s = 2 * g + (F::BITS == 6 ? e >> 4 : 0);  // only Q6_K's halves scale differently
#if defined(GK_LUT)
  // the group's 16 or 32 possible values, built once per group (the two chunks share them)
  if constexpr (F::BITS == 4) return lut16(F::codes(blk, g, e), fmadd(iota(0), set1(a[s]), set1(b[s])));
  if constexpr (F::BITS == 5)
    return lut32(F::codes(blk, g, e), fmadd(iota(0), set1(a[s]), set1(b[s])), fmadd(iota(16), set1(a[s]), set1(b[s])));
#endif
  if constexpr (F::HAS_B) return fmadd(cvt(F::codes(blk, g, e)), set1(a[s]), set1(b[s]));
  return mul(cvt(F::codes(blk, g, e)), set1(a[s]));
}

// y[i + r * ldy] = dot(weight row i, activation row r) for NW weight rows (row_bytes apart, maps
// `stride` floats apart) x NR activation rows (ldx floats apart): a decoded chunk serves NR rows.
template <class F, int NW, int NR>
inline void tile_f(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* a, const float* b,
                   int64_t stride, const float* x, int64_t ldx, float* y, int64_t ldy) {
  VF acc[NW][NR];
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = zero();
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const float* xb = x + blk * F::QK;
    const int64_t s0 = blk * F::GROUPS * 2;
#pragma GCC unroll 8
    for (int g = 0; g < F::GROUPS; ++g) {
#pragma GCC unroll 4
      for (int e = 0; e < 32; e += L) {
#pragma GCC unroll 4
        for (int i = 0; i < NW; ++i) {
          const VF v = decode<F>(w + i * row_bytes + blk * F::BYTES, g, e, a + i * stride + s0, b + i * stride + s0);
#pragma GCC unroll 4
          for (int r = 0; r < NR; ++r) acc[i][r] = fmadd(v, loadf(xb + r * ldx + g * 32 + e), acc[i][r]);
        }
      }
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < NR; ++r) y[i + r * ldy] = vsum(acc[i][r]);
}

#if defined(__AVX512F__)
constexpr int kTileW = 4;  // 32 vector registers: 16 accumulators
#else
constexpr int kTileW = 2;  // 16 registers: 8 accumulators
#endif

// NW weight rows against all m_rows activation rows, their maps decoded once into thread-local scratch.
template <class F, int NW>
inline void tile_rows_f(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* x, int64_t m_rows,
                        int64_t k, float* y, int64_t ldy) {
  const int64_t stride = nblocks * F::GROUPS * 2;
  thread_local std::vector<float> maps;
  if (static_cast<int64_t>(maps.size()) < 2 * NW * stride) maps.resize(2 * NW * stride);
  float *a = maps.data(), *b = a + NW * stride;
  for (int i = 0; i < NW; ++i) F::scales(w + i * row_bytes, nblocks, a + i * stride, b + i * stride);
  int64_t m = 0;
  for (; m + 4 <= m_rows; m += 4)
    tile_f<F, NW, 4>(w, row_bytes, nblocks, a, b, stride, x + m * k, k, y + m * ldy, ldy);
  if (m + 2 <= m_rows) tile_f<F, NW, 2>(w, row_bytes, nblocks, a, b, stride, x + m * k, k, y + m * ldy, ldy), m += 2;
  if (m < m_rows) tile_f<F, NW, 1>(w, row_bytes, nblocks, a, b, stride, x + m * k, k, y + m * ldy, ldy);
}

// Weight rows [n0, n1) against all m_rows activation rows (x is (m_rows, k)); y is (m_rows, ldy).
inline void rows_f(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const float* x,
                   int64_t m_rows, int64_t k, float* y, int64_t ldy) {
  with_floats(type, [&]<class F>() {
    const int64_t nblocks = row_bytes / F::BYTES;
    int64_t n = n0;
    for (; n + kTileW <= n1; n += kTileW)
      tile_rows_f<F, kTileW>(w + n * row_bytes, row_bytes, nblocks, x, m_rows, k, y + n, ldy);
    for (; n < n1; ++n) tile_rows_f<F, 1>(w + n * row_bytes, row_bytes, nblocks, x, m_rows, k, y + n, ldy);
  });
}

// One row of k elements to floats.
inline void dequant_row(int type, const uint8_t* w, int64_t k, float* out) {
  with_floats(type, [&]<class F>() {
    const int64_t nblocks = k / F::QK, stride = nblocks * F::GROUPS * 2;
    thread_local std::vector<float> maps;
    if (static_cast<int64_t>(maps.size()) < 2 * stride) maps.resize(2 * stride);
    float *a = maps.data(), *b = a + stride;
    F::scales(w, nblocks, a, b);
    for (int64_t blk = 0; blk < nblocks; ++blk) {
#pragma GCC unroll 8
      for (int g = 0; g < F::GROUPS; ++g)
#pragma GCC unroll 4
        for (int e = 0; e < 32; e += L)
          storef(out + blk * F::QK + g * 32 + e,
                 decode<F>(w + blk * F::BYTES, g, e, a + blk * F::GROUPS * 2, b + blk * F::GROUPS * 2));
    }
  });
}

}  // namespace GK_ISA
}  // namespace gk
