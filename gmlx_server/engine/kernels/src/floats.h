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

// Each format: HAS_B (b is not always 0), BITS (codes < 2^BITS, but Q8_0's signed), MAPS per block
// (one per group; Q6_K one per 16 elements), scales() fills a row's maps a[j], b[j] (w = a * code + b),
// codes() is elements e..e+L-1 of group g of a block as 32-bit integer lanes.
struct DQ4_0 {
  static constexpr int QK = 32, BYTES = 18, GROUPS = 1, MAPS = 1, BITS = 4;
  static constexpr bool HAS_B = true;
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    f16_cols(p, BYTES, nb, a, nullptr);
    for (int64_t i = 0; i < nb; ++i) b[i] = -8.0f * a[i];
  }
  static VI codes(const uint8_t* p, int, int e) { return nibble32<BITS>(p + 2, e); }
};

struct DQ4_1 {
  static constexpr int QK = 32, BYTES = 20, GROUPS = 1, MAPS = 1, BITS = 4;
  static constexpr bool HAS_B = true;
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) { f16_cols(p, BYTES, nb, a, b); }
  static VI codes(const uint8_t* p, int, int e) { return nibble32<BITS>(p + 4, e); }
};

struct DQ5_0 {
  static constexpr int QK = 32, BYTES = 22, GROUPS = 1, MAPS = 1, BITS = 5;
  static constexpr bool HAS_B = true;
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    f16_cols(p, BYTES, nb, a, nullptr);
    for (int64_t i = 0; i < nb; ++i) b[i] = -16.0f * a[i];
  }
  static VI codes(const uint8_t* p, int, int e) { return or_bit4(nibble32<BITS>(p + 6, e), u32_at(p + 2) >> e); }
};

struct DQ5_1 {
  static constexpr int QK = 32, BYTES = 24, GROUPS = 1, MAPS = 1, BITS = 5;
  static constexpr bool HAS_B = true;
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) { f16_cols(p, BYTES, nb, a, b); }
  static VI codes(const uint8_t* p, int, int e) { return or_bit4(nibble32<BITS>(p + 8, e), u32_at(p + 4) >> e); }
};

struct DQ8_0 {
  static constexpr int QK = 32, BYTES = 34, GROUPS = 1, MAPS = 1, BITS = 8;
  static constexpr bool HAS_B = false;
  static void scales(const uint8_t* p, int64_t nb, float* a, float*) { f16_cols(p, BYTES, nb, a, nullptr); }
  static VI codes(const uint8_t* p, int, int e) { return i8(p + 2 + e); }
};

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit (scale, min) pairs.
inline void k_scales(const uint8_t* p, int64_t nb, int bytes, float* a, float* b) {
  for (int64_t i = 0; i < nb; ++i, p += bytes) {
#if defined(GK_SCALE_MIN_VEC)
    k_scale_min_vec(p + 4, f16_at(p), f16_at(p + 2), a + 8 * i, b + 8 * i);
#else
    k_scale_min(p + 4, f16_at(p), f16_at(p + 2), a + 8 * i, b + 8 * i);
#endif
  }
}

// K-quant 4-bit codes: 32-byte chunk c holds sub-block 2c (low nibbles) and 2c + 1 (high nibbles).
template <int BITS>
inline VI k_nibble(const uint8_t* qs, int g, int e) {
  const VI v = u8(qs + 32 * (g >> 1) + e);
  return (g & 1) ? shr(v, 4) : low4<BITS>(v);
}

struct DQ4_K {
  static constexpr int QK = 256, BYTES = 144, GROUPS = 8, MAPS = 8, BITS = 4;
  static constexpr bool HAS_B = true;
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) { k_scales(p, nb, BYTES, a, b); }
  static VI codes(const uint8_t* p, int g, int e) { return k_nibble<BITS>(p + 16, g, e); }
};

struct DQ5_K {
  static constexpr int QK = 256, BYTES = 176, GROUPS = 8, MAPS = 8, BITS = 5;
  static constexpr bool HAS_B = true;
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) { k_scales(p, nb, BYTES, a, b); }
  // bit g of qh[i] is bit 4 of element i of sub-block g
  static VI codes(const uint8_t* p, int g, int e) {
    return or_bit4(k_nibble<BITS>(p + 48, g, e), bitplane(p + 16, g) >> e);
  }
};

// Q6_K: ql[128] qh[64] int8 scales[16] d; w = d * scale * (q - 32) per 16-element sub-block. Half h of
// the block (128 elements) is four groups k: low (k < 2) or high nibbles of ql[h*64 + 32*(k&1)], and
// bits 2k..2k+1 of qh[h*32 + i] as bits 4..5.
struct DQ6_K {
  static constexpr int QK = 256, BYTES = 210, GROUPS = 8, MAPS = 16, BITS = 6;
  static constexpr bool HAS_B = true;
  static void scales(const uint8_t* p, int64_t nb, float* a, float* b) {
    for (int64_t i = 0; i < nb; ++i, p += BYTES) {
      const VF d = set1(f16_at(p + 208));
      for (int j = 0; j < 16; j += L) {
        const VF v = mul(cvt(i8(p + 192 + j)), d);
        storef(a + 16 * i + j, v);
        storef(b + 16 * i + j, mul(v, set1(-32.0f)));
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

template <class Fn>
inline bool with_floats(int type, Fn&& f) {
  return by_type<DQ4_0, DQ4_1, DQ5_0, DQ5_1, DQ8_0, DQ4_K, DQ5_K, DQ6_K>(type, f);
}

// Elements e..e+L-1 of group g of block `blk`, whose maps start at a, b.
template <class F>
inline VF decode(const uint8_t* blk, int g, int e, const float* a, const float* b) {
  const int s = F::MAPS == 16 ? 2 * g + (e >> 4) : F::MAPS == 8 ? g : 0;
#if defined(GK_LUT)
  // the group's 16 or 32 possible values, built once per group (the two chunks share them)
  if constexpr (F::BITS == 4) return lut16(F::codes(blk, g, e), fmadd(iota(0), set1(a[s]), set1(b[s])));
  if constexpr (F::BITS == 5)
    return lut32(F::codes(blk, g, e), fmadd(iota(0), set1(a[s]), set1(b[s])), fmadd(iota(16), set1(a[s]), set1(b[s])));
#endif
  if constexpr (F::HAS_B) return fmadd(cvt(F::codes(blk, g, e)), set1(a[s]), set1(b[s]));
  return mul(cvt(F::codes(blk, g, e)), set1(a[s]));
}

// y[i + r * ldy] = dot(weight row i, activation row r) for NW weight rows (row_bytes apart; row i's maps
// at a + i * ms, b + i * ms) x NR activation rows packed chunk by chunk (xp[(c * NR + r) * L + j] is
// element c * L + j of row r).
template <class F, int NW, int NR>
inline void tile_f(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* a, const float* b, int64_t ms,
                   const float* xp, float* y, int64_t ldy) {
  VF acc[NW][NR];
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = zero();
  for (int64_t blk = 0; blk < nblocks; ++blk, w += F::BYTES, xp += F::QK * NR, a += F::MAPS, b += F::MAPS) {
#pragma GCC unroll 8
    for (int g = 0; g < F::GROUPS; ++g) {
#pragma GCC unroll 4
      for (int e = 0; e < 32; e += L) {
        VF v[NW];
#pragma GCC unroll 16
        for (int i = 0; i < NW; ++i) v[i] = decode<F>(w + i * row_bytes, g, e, a + i * ms, b + i * ms);
#pragma GCC unroll 16
        for (int r = 0; r < NR; ++r) {
          const VF xr = loadf(xp + ((g * 32 + e) / L * NR + r) * L);  // loaded once for the NW rows
#pragma GCC unroll 16
          for (int i = 0; i < NW; ++i) acc[i][r] = fmadd(v[i], xr, acc[i][r]);
        }
      }
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < NR; ++r) y[i + r * ldy] = vsum(acc[i][r]);
}

// Tiles of 4 weight rows x 4 activation rows on AVX-512 (16 accumulators; wider tiles measured slower:
// register spills, and x reloaded per weight row), 2 x 4 with 16 registers.
#if defined(GK_AVX512)
constexpr int kTileW = 4;
#else
constexpr int kTileW = 2;
#endif
constexpr int kTileR = 4;
constexpr int64_t kRowBlock = 96;  // activation rows packed at a time (L2)
constexpr int64_t kPanel = 32;     // weight rows whose maps are decoded at a time (L1)

// Asks for the next panel's bytes while this one computes: a panel is read twice (its maps, then its
// tiles), and waiting on memory in the first pass would leave the second idle.
inline void prefetch(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 3);
}

// Rows [0, nr) of x (ldx floats apart) packed for tile_f<_, _, nr>.
inline void pack(const float* x, int64_t ldx, int64_t nr, int64_t k, float* out) {
  for (int64_t c = 0; c < k / L; ++c)
    for (int64_t r = 0; r < nr; ++r) std::memcpy(out + (c * nr + r) * L, x + r * ldx + c * L, sizeof(float) * L);
}

// The activation tiles of a row block: 4 rows at a time, then 2, 1.
inline int64_t next_tile(int64_t left) { return left >= kTileR ? kTileR : left >= 2 ? 2 : 1; }

template <class F, int NW>
inline void tile_any(int64_t nr, const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* a, const float* b,
                     int64_t ms, const float* xp, float* y, int64_t ldy) {
  if (nr == kTileR) return tile_f<F, NW, kTileR>(w, row_bytes, nblocks, a, b, ms, xp, y, ldy);
  if (nr == 2) return tile_f<F, NW, 2>(w, row_bytes, nblocks, a, b, ms, xp, y, ldy);
  tile_f<F, NW, 1>(w, row_bytes, nblocks, a, b, ms, xp, y, ldy);
}

// A panel of weight rows [0, rows) against a packed block of mb activation rows: the rows' maps first
// (row j's a then b, ms floats apart), then every activation tile against every weight tile.
template <class F, int NW>
inline void panel_f(const uint8_t* w, int64_t row_bytes, int64_t nblocks, int64_t rows, const float* xp, int64_t mb,
                    int64_t k, float* y, int64_t ldy) {
  const int64_t nm = nblocks * F::MAPS, ms = 2 * nm, tiles = rows / NW;
  thread_local std::vector<float> maps;
  if (static_cast<int64_t>(maps.size()) < rows * ms) maps.resize(rows * ms);
  float* const base = maps.data();
  for (int64_t j = 0; j < rows; ++j) F::scales(w + j * row_bytes, nblocks, base + j * ms, base + j * ms + nm);
  for (int64_t m = 0, nr; m < mb; m += nr, xp += nr * k) {
    nr = next_tile(mb - m);
    float* ym = y + m * ldy;
    for (int64_t t = 0; t < tiles; ++t) {
      const float* a = base + t * NW * ms;
      tile_any<F, NW>(nr, w + t * NW * row_bytes, row_bytes, nblocks, a, a + nm, ms, xp, ym + t * NW, ldy);
    }
    for (int64_t j = tiles * NW; j < rows; ++j)
      tile_any<F, 1>(nr, w + j * row_bytes, row_bytes, nblocks, base + j * ms, base + j * ms + nm, ms, xp, ym + j, ldy);
  }
}

// Weight rows [n0, n1) against all m_rows activation rows (x is (m_rows, k)); y is (m_rows, ldy).
template <class F>
inline void rows_of(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const float* x, int64_t m_rows,
                    int64_t k, float* y, int64_t ldy) {
  const int64_t nblocks = row_bytes / F::BYTES;
  thread_local std::vector<float> packed;
  for (int64_t m0 = 0; m0 < m_rows; m0 += kRowBlock) {
    const int64_t mb = m_rows - m0 < kRowBlock ? m_rows - m0 : kRowBlock;
    if (static_cast<int64_t>(packed.size()) < mb * k) packed.resize(mb * k);
    for (int64_t m = 0, nr; m < mb; m += nr) {
      nr = next_tile(mb - m);
      pack(x + (m0 + m) * k, k, nr, k, packed.data() + m * k);
    }
    for (int64_t n = n0; n < n1; n += kPanel) {
      const int64_t rows = n1 - n < kPanel ? n1 - n : kPanel;
      prefetch(w + (n + rows) * row_bytes, (n1 - n - rows < kPanel ? n1 - n - rows : kPanel) * row_bytes);
      panel_f<F, kTileW>(w + n * row_bytes, row_bytes, nblocks, rows, packed.data(), mb, k, y + m0 * ldy + n, ldy);
    }
  }
}

inline void rows_f(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const float* x,
                   int64_t m_rows, int64_t k, float* y, int64_t ldy) {
  with_floats(type, [&]<class F>() { rows_of<F>(w, row_bytes, n0, n1, x, m_rows, k, y, ldy); });
}

// A repacked row (repack.h) to floats in its kernels' order: each 256-block's position p holds element
// order[p] (sgemm panels, whose activations dispatch.cpp permutes alike).
// (restrict: a uint8_t pointer may alias the floats, which kept GCC from widening the loops)
inline void dequant_repacked_row(int type, const uint8_t* __restrict w, int64_t k, float* __restrict out) {
  float a[32], b[32];  // per byte i of 32: its sub-block's scale (and the K-quant's min term); loops GCC widens
  for (int64_t blk = 0; blk < k / 256; ++blk, out += 256) {
    if (type == Q4_KR) {  // positions 64c + 32h + i: nibble h of code byte 32c + i
      float sa[8], sb[8];
      k_scale_min(w + 4, f16_at(w), f16_at(w + 2), sa, sb);
      for (int i = 0; i < 32; ++i) a[i] = sa[(i % 16) / 2], b[i] = sb[(i % 16) / 2];
      for (int c = 0; c < 4; ++c) {
        const uint8_t* q = w + 16 + 32 * c;
        for (int i = 0; i < 32; ++i) out[64 * c + i] = a[i] * static_cast<float>(q[i] & 15) + b[i];
        for (int i = 0; i < 32; ++i) out[64 * c + 32 + i] = a[i] * static_cast<float>(q[i] >> 4) + b[i];
      }
      w += 144;
      continue;
    }
    if (type == Q5_KR) {  // positions 32r + 16h + i: nibble h of byte 16r + i, the fifth bit r of qh byte 16h + i
      float sa[8], sb[8];
      k_scale_min(w + 4, f16_at(w), f16_at(w + 2), sa, sb);
      for (int i = 0; i < 16; ++i) a[i] = sa[i / 2], b[i] = sb[i / 2];
      for (int r = 0; r < 8; ++r) {
        const uint8_t* q = w + 48 + 16 * r;
        for (int i = 0; i < 16; ++i) out[32 * r + i] = a[i] * static_cast<float>((q[i] & 15) | ((w[16 + i] >> r) & 1) << 4) + b[i];
        for (int i = 0; i < 16; ++i)
          out[32 * r + 16 + i] = a[i] * static_cast<float>((q[i] >> 4) | ((w[32 + i] >> r) & 1) << 4) + b[i];
      }
      w += 176;
      continue;
    }
    const float d = f16_at(w + 208);
    for (int q = 0; q < 4; ++q) {
      if (q % 2 == 0)
        for (int i = 0; i < 16; ++i) a[i] = d * static_cast<float>(static_cast<int8_t>(w[192 + 4 * q + i / 2]));
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = w + 32 * q + 16 * h;
        const uint8_t* n = w + 128 + 16 * q;
        float* o = out + 64 * q + 16 * h;
        for (int i = 0; i < 16; ++i) o[i] = a[i] * static_cast<float>((p[i] & 63) - 32);
        for (int i = 0; i < 16; ++i) o[32 + i] = a[i] * static_cast<float>((((n[i] >> (4 * h)) & 15) | ((p[i] >> 6) << 4)) - 32);
      }
    }
    w += 210;
  }
}

// One row of k elements to floats (a repacked type's in its kernels' order).
inline void dequant_row(int type, const uint8_t* w, int64_t k, float* out) {
  if (natural_type(type) != type) return dequant_repacked_row(type, w, k, out);
  with_floats(type, [&]<class F>() {
    const int64_t nblocks = k / F::QK, nm = nblocks * F::MAPS;
    thread_local std::vector<float> maps;
    if (static_cast<int64_t>(maps.size()) < 2 * nm) maps.resize(2 * nm);
    const float *a = maps.data(), *b = a + nm;
    F::scales(w, nblocks, maps.data(), maps.data() + nm);
    for (int64_t blk = 0; blk < nblocks; ++blk, w += F::BYTES, a += F::MAPS, b += F::MAPS, out += F::QK) {
#pragma GCC unroll 8
      for (int g = 0; g < F::GROUPS; ++g)
#pragma GCC unroll 4
        for (int e = 0; e < 32; e += L) storef(out + g * 32 + e, decode<F>(w, g, e, a, b));
    }
  });
}

}  // namespace GK_ISA
}  // namespace gk
