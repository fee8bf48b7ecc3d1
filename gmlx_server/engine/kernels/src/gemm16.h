// Many activation rows (prefill) against the repacked K-quants on AVX-512 VNNI and AVX-VNNI: 32 (16) weight rows
// are decoded once into an int16 panel (sub-block scales folded in, k in pairs, the rows interleaved), then every
// activation row meets it through vpdpwssd with the row's code pair broadcast, one int32 lane a weight row.
// vpdpwssd does twice the products of an FMA of its width, and no float panel is written (Qwen 1.5B's prefill
// 1.4x sgemm's on AVX-512).
#pragma once

#include <algorithm>
#include <vector>

#include "qdot.h"
#include "repack.h"

namespace gk {
namespace GK_ISA {

#if defined(GK_AVX512VNNI) || defined(GK_AVXVNNI)
#define GK_GEMM16 1
namespace g16 {

// The vector kit: WI int32 lanes and WF float lanes of one register, kLanes of them; a panel holds two
// registers' worth of weight rows, a tile kTile activation rows (2 x kTile accumulators, two weight registers
// and a broadcast within the register file: 32 zmm, 16 ymm).
#if defined(GK_AVX512VNNI)
using WI = __m512i;
using WF = __m512;
constexpr int kLanes = 16, kTile = 8;
inline WI iload(const int32_t* p) { return _mm512_loadu_si512(p); }
inline WI ibcast(int32_t v) { return _mm512_set1_epi32(v); }
inline WI izero() { return _mm512_setzero_si512(); }
// acc += the pairwise products of w and x: as asm, since GCC copied every accumulator of the intrinsic's loop
// into another register each step (twice the instructions the products take).
__attribute__((always_inline)) inline void dp(WI& acc, WI w, WI x) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
}
inline WF fload(const float* p) { return _mm512_loadu_ps(p); }
inline void fstore(float* p, WF v) { _mm512_storeu_ps(p, v); }
inline WF fset1(float v) { return _mm512_set1_ps(v); }
inline WF fmul(WF a, WF b) { return _mm512_mul_ps(a, b); }
inline WF fmadd(WF a, WF b, WF c) { return _mm512_fmadd_ps(a, b, c); }
inline WF cvt(WI a) { return _mm512_cvtepi32_ps(a); }
// the first n lanes of v to y (n <= 0: none)
inline void store_first(float* y, WF v, int n) {
  _mm512_mask_storeu_ps(y, n >= kLanes ? 0xFFFF : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1), v);
}
inline void put(int16_t* out, const q16::V& v) { _mm512_storeu_si512(out, v.v); }
// int16 lane L of 32 positions belongs to sub-block (L / 2) % 8 in both repacked layouts (repack.h)
inline q16::V lane_scales(__m128i eight) {
  const __m512i idx = _mm512_set_epi16(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0,
                                       7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  return {_mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(_mm256_castsi128_si256(eight)))};
}
#else
using WI = __m256i;
using WF = __m256;
constexpr int kLanes = 8, kTile = 6;
inline WI iload(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline WI ibcast(int32_t v) { return _mm256_set1_epi32(v); }
inline WI izero() { return _mm256_setzero_si256(); }
__attribute__((always_inline)) inline void dp(WI& acc, WI w, WI x) {  // as asm: see the AVX-512 kit
  asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));
}
inline WF fload(const float* p) { return _mm256_loadu_ps(p); }
inline void fstore(float* p, WF v) { _mm256_storeu_ps(p, v); }
inline WF fset1(float v) { return _mm256_set1_ps(v); }
inline WF fmul(WF a, WF b) { return _mm256_mul_ps(a, b); }
inline WF fmadd(WF a, WF b, WF c) { return _mm256_fmadd_ps(a, b, c); }
inline WF cvt(WI a) { return _mm256_cvtepi32_ps(a); }
inline void store_first(float* y, WF v, int n) {
  _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), v);
}
inline void put(int16_t* out, const q16::V& v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v.lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), v.hi);
}
inline q16::V lane_scales(__m128i eight) {  // lanes 0..15 and 16..31 alike: scale j in lanes 2j, 2j + 1
  const __m256i pairs = _mm256_set_m128i(_mm_unpackhi_epi16(eight, eight), _mm_unpacklo_epi16(eight, eight));
  return {pairs, pairs};
}
#endif
constexpr int kRows = 2 * kLanes;  // weight rows a panel holds

// Elements one int32 lane may sum before it is flushed to fp32: |code x sub-block scale| is at most 945
// (Q4_K), 1953 (Q5_K) or 4096 (Q6_K), activation codes at most kGemmFull; the products stay below 2^31.
constexpr int flush_elements(int type) { return type == Q4_KR ? 128 : type == Q5_KR ? 64 : 32; }
static_assert(945LL * kGemmFull * 128 < (1LL << 31) && 1953LL * kGemmFull * 64 < (1LL << 31) &&
              4096LL * kGemmFull * 32 < (1LL << 31));

// One row's blocks as scaled int16 codes (out, in the activations' order), its block scales into dv[b * kRows + r],
// Q4_K/Q5_K's min terms (-dmin x min of sub-block s) into mv[(b * 8 + s) * kRows + r].
template <int T>
inline void decode_row(const uint8_t* w, int64_t nb, int r, int16_t* out, float* dv, float* mv) {
  using namespace q16;
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (T == Q6_KR) {
      const uint8_t* blk = w + 210 * b;
      dv[b * kRows + r] = f16_at(blk + 208);
      for (int q = 0; q < 4; ++q) {
        const auto* scales = reinterpret_cast<const __m128i*>(blk + 192 + 8 * (q / 2));
        const __m128i s8 = _mm_cvtepi8_epi16(_mm_loadl_epi64(scales));
        const V sc = lane_scales(s8);
        const V p = u8w(blk + 32 * q);
        const V a = subc(band(p, 63), 32), c = subc(bor(nib32(blk + 128 + 16 * q), band(srli(p, 2), 0x30)), 32);
        put(out + 256 * b + 64 * q, mul(a, sc));
        put(out + 256 * b + 64 * q + 32, mul(c, sc));
      }
    } else {
      constexpr bool Q5 = T == Q5_KR;
      const uint8_t* blk = w + (Q5 ? 176 : 144) * b;
      const KS ks = k_scales(blk + 4);
      alignas(16) uint8_t sm[16];
      ks_store(ks, sm);
      const float d = f16_at(blk), dmin = f16_at(blk + 2);
      dv[b * kRows + r] = d;
      for (int s = 0; s < 8; ++s) mv[(b * 8 + s) * kRows + r] = -dmin * static_cast<float>(sm[8 + s]);
      const V sc = lane_scales(_mm_cvtepu8_epi16(ks));
      if constexpr (Q5) {
        const V qh = u8w(blk + 16);
        [&]<int... S>(std::integer_sequence<int, S...>) {
          ([&] { put(out + 256 * b + 32 * S, mul(bor(nib32(blk + 48 + 16 * S), fifth_bits<S>(qh)), sc)); }(), ...);
        }(std::make_integer_sequence<int, 8>{});
      } else {
        for (int c = 0; c < 4; ++c) {
          V lo, hi;
          nib64(blk + 16 + 32 * c, lo, hi);
          put(out + 256 * b + 64 * c, mul(lo, sc)), put(out + 256 * b + 64 * c + 32, mul(hi, sc));
        }
      }
    }
  }
}

// The products of one flush: FL code pairs from p0 into the tile's int32 lanes (the accumulators in registers);
// xt is the tile's codes, pair p of row c at xt[p * kTile + c].
template <int FL>
__attribute__((always_inline)) inline void products(const int32_t* panel32, const int32_t* xt, int64_t p0,
                                                    WI (&a)[kTile][2]) {
#pragma GCC unroll 16
  for (int c = 0; c < kTile; ++c) a[c][0] = a[c][1] = izero();
  const int32_t* pw = panel32 + p0 * kRows;
  const int32_t* px = xt + p0 * kTile;
  for (int i = 0; i < FL; ++i, pw += kRows, px += kTile) {
    const WI w0 = iload(pw), w1 = iload(pw + kLanes);
#pragma GCC unroll 16
    for (int c = 0; c < kTile; ++c) {
      const WI xv = ibcast(px[c]);
      dp(a[c][0], w0, xv);
      dp(a[c][1], w1, xv);
    }
  }
}

// The same, not inlined, for the K-quants' long flushes: inlined beside their flushes GCC spilled the weights to the
// stack (0.6x with a flush of a whole Q4_K block). The call costs the 32-blocks' short ones more than it saves.
template <int FL>
__attribute__((noinline)) void products_apart(const int32_t* panel32, const int32_t* xt, int64_t p0,
                                              WI (&out)[kTile][2]) {
  WI a[kTile][2];
  products<FL>(panel32, xt, p0, a);
#pragma GCC unroll 16
  for (int c = 0; c < kTile; ++c) out[c][0] = a[c][0], out[c][1] = a[c][1];
}

// Block b of the kTile activation rows r0.. (a tile, x.q interleaved: Isa::gemm_tile) against a decoded panel,
// added to their fp32 sums fa (kRows a row).
template <int T>
inline void tile(const int32_t* panel32, const float* dv, const float* mv, const XRows& x, int64_t r0, int64_t b,
                 float* fa) {
  constexpr int FL = flush_elements(T) / 2;  // code pairs a flush
  const int32_t* xt = reinterpret_cast<const int32_t*>(x.q) + r0 * (x.k / 2);
  const int64_t xb = x.k / 256, xs = x.k / 32;
  for (int64_t p0 = 128 * b; p0 < 128 * (b + 1); p0 += FL) {
    WI a[kTile][2];
    products_apart<FL>(panel32, xt, p0, a);
    const WF d[2] = {fload(dv + b * kRows), fload(dv + b * kRows + kLanes)};
    for (int c = 0; c < kTile; ++c) {
      float* f = fa + (r0 + c) * kRows;
      const WF s = fset1(x.d[(r0 + c) * xb + b]);
      for (int h = 0; h < 2; ++h) fstore(f + kLanes * h, fmadd(cvt(a[c][h]), fmul(d[h], s), fload(f + kLanes * h)));
    }
  }
  if constexpr (T != Q6_KR) {  // the min terms: sub-blocks outside, so the rows' FMAs do not wait on each other
    WF f[kTile][2];
#pragma GCC unroll 16
    for (int c = 0; c < kTile; ++c) {
      f[c][0] = fload(fa + (r0 + c) * kRows);
      f[c][1] = fload(fa + (r0 + c) * kRows + kLanes);
    }
    for (int s = 0; s < 8; ++s) {
      const WF m0 = fload(mv + (b * 8 + s) * kRows), m1 = fload(mv + (b * 8 + s) * kRows + kLanes);
#pragma GCC unroll 16
      for (int c = 0; c < kTile; ++c) {
        const WF xsum = fset1(x.s[(r0 + c) * xs + 8 * b + s]);
        f[c][0] = fmadd(m0, xsum, f[c][0]);
        f[c][1] = fmadd(m1, xsum, f[c][1]);
      }
    }
#pragma GCC unroll 16
    for (int c = 0; c < kTile; ++c) {
      fstore(fa + (r0 + c) * kRows, f[c][0]);
      fstore(fa + (r0 + c) * kRows + kLanes, f[c][1]);
    }
  }
}

// The 32-element blocks (natural layout): each block's codes (offset folded in, so signed), its scale into
// dv[j * kRows + r] and, for Q4_1/Q5_1, its min into mv[j * kRows + r].
template <class B>
inline void decode_row32(const uint8_t* w, int64_t nb32, int r, int16_t* out, float* dv, float* mv) {
  for (int64_t j = 0; j < nb32; ++j, w += B::BYTES) {
    const q16::Block32<B> blk(w);
    put(out + 32 * j, blk.c);
    dv[j * kRows + r] = blk.d;
    if constexpr (B::MIN) mv[j * kRows + r] = blk.m;
  }
}

// Blocks [j0, j1) of a 32-block format against the tile: a flush a block, as its scales change there (the
// products' bound: 128 x kGemmFull x 32 < 2^31).
template <class B>
inline void tile32(const int32_t* panel32, const float* dv, const float* mv, const XRows& x, int64_t r0, int64_t j0,
                   int64_t j1, float* fa) {
  const int32_t* xt = reinterpret_cast<const int32_t*>(x.q) + r0 * (x.k / 2);
  const int64_t xs = x.k / 32;
  for (int64_t j = j0; j < j1; ++j) {
    WI a[kTile][2];
    products<16>(panel32, xt, 16 * j, a);
    const WF d[2] = {fload(dv + j * kRows), fload(dv + j * kRows + kLanes)};
#pragma GCC unroll 16  // a[] indexed by a loop counter would live in memory, and every product with it
    for (int c = 0; c < kTile; ++c) {
      float* f = fa + (r0 + c) * kRows;
      const WF s = fset1(x.d[(r0 + c) * xs + j]);
      for (int h = 0; h < 2; ++h) {
        WF v = fmadd(cvt(a[c][h]), fmul(d[h], s), fload(f + kLanes * h));
        if constexpr (B::MIN) v = fmadd(fload(mv + j * kRows + kLanes * h), fset1(x.s[(r0 + c) * xs + j]), v);
        fstore(f + kLanes * h, v);
      }
    }
  }
}

// The two families behind one interface for the panel loop: len elements of a row decoded (one span), and span b
// (256 elements; a 32-block format's last one may be shorter) of a tile.
template <int T>
struct KQuant {
  static constexpr int kScaled = 256;  // elements a dv entry scales
  static void decode(const uint8_t* w, int64_t len, int r, int16_t* out, float* dv, float* mv) {
    decode_row<T>(w, len / 256, r, out, dv, mv);
  }
  static void span(const int32_t* pc, const float* dv, const float* mv, const XRows& x, int64_t r0, int64_t b,
                   float* fa) {
    tile<T>(pc, dv, mv, x, r0, b, fa);
  }
};
template <class B>
struct Blocks32 {
  static constexpr int kScaled = 32;
  static void decode(const uint8_t* w, int64_t len, int r, int16_t* out, float* dv, float* mv) {
    decode_row32<B>(w, len / 32, r, out, dv, mv);
  }
  static void span(const int32_t* pc, const float* dv, const float* mv, const XRows& x, int64_t r0, int64_t b,
                   float* fa) {
    tile32<B>(pc, dv, mv, x, r0, 8 * b, std::min<int64_t>(8 * b + 8, x.k / 32), fa);
  }
};

// A panel's buffers (one set a thread): the decoded rows, their code pairs interleaved (pair p of row r at
// codes[p * 32 + r]), the blocks' scales and min terms (decode_row), and the fp32 sums of the activation rows.
struct Panel {
  std::vector<int16_t> rows;
  std::vector<int32_t> codes;
  std::vector<float> dv, mv, fa;

  // Rows [0, valid) of w into the panel; the rows after them zero. A span (256 elements) of every row at a time, so
  // that the interleaving reads what was just decoded from L1 (whole rows first: 5% of the product).
  template <class F>
  void decode(const uint8_t* w, int64_t row_bytes, int valid, int64_t k) {
    rows.resize(static_cast<size_t>(kRows * 256));
    codes.resize(static_cast<size_t>(kRows * k / 2));
    dv.resize(static_cast<size_t>(k / 32 * kRows));  // a scale a block: 256 elements, or 32
    mv.resize(static_cast<size_t>(k / 32 * kRows));
    if (valid < kRows) {  // a last, partial panel: its missing rows contribute zeros
      std::fill(rows.begin(), rows.end(), 0);
      std::fill(dv.begin(), dv.end(), 0.0f);
      std::fill(mv.begin(), mv.end(), 0.0f);
    }
    const int32_t* from = reinterpret_cast<const int32_t*>(rows.data());
    for (int64_t e0 = 0; e0 < k; e0 += 256) {
      const int64_t len = std::min<int64_t>(256, k - e0);
      for (int r = 0; r < valid; ++r)
        F::decode(w + r * row_bytes + row_bytes * e0 / k, len, r, rows.data() + r * 256,
                  dv.data() + e0 / F::kScaled * kRows, mv.data() + e0 / 32 * kRows);
      int32_t* to = codes.data() + e0 / 2 * kRows;
      for (int64_t p = 0; p < len / 2; ++p)
#pragma GCC unroll 32
        for (int r = 0; r < kRows; ++r) to[p * kRows + r] = from[r * 128 + p];
    }
  }

  // The sums' first `valid` columns into y (m_rows rows, ldy apart): two stores a row (memcpy's rep movs took
  // 9% of the product).
  void store(int64_t m_rows, int valid, float* y, int64_t ldy) const {
    for (int64_t r = 0; r < m_rows; ++r) {
      store_first(y + r * ldy, fload(fa.data() + r * kRows), valid);
      store_first(y + r * ldy + kLanes, fload(fa.data() + r * kRows + kLanes), valid - kLanes);
    }
  }
};

template <class F>
inline void panels(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XRows& x, int64_t m_rows,
                   float* y, int64_t ldy) {
  const int64_t tiles = (m_rows + kTile - 1) / kTile;
  thread_local Panel pn;
  for (int64_t t0 = n0; t0 < n1; t0 += kRows) {
    const int valid = static_cast<int>(std::min<int64_t>(kRows, n1 - t0));
    pn.decode<F>(w + t0 * row_bytes, row_bytes, valid, x.k);
    pn.fa.assign(static_cast<size_t>(tiles * kTile * kRows), 0.0f);
    for (int64_t b = 0; b < (x.k + 255) / 256; ++b)  // the panel's span (16 KB) stays in L1 while every tile meets it
      for (int64_t t = 0; t < tiles; ++t)
        F::span(pn.codes.data(), pn.dv.data(), pn.mv.data(), x, t * kTile, b, pn.fa.data());
    pn.store(m_rows, valid, y + t0, ldy);
  }
}

}  // namespace g16

// Weight rows [n0, n1) of a repacked K-quant or a 32-block format (gemm16_reads) against all m_rows activation
// rows (quantized to kGemmFull); y is (m_rows, ldy).
inline void gemm_q16(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XRows& x,
                     int64_t m_rows, float* y, int64_t ldy) {
  using namespace g16;
  switch (type) {
    case Q4_KR: return panels<KQuant<Q4_KR>>(w, row_bytes, n0, n1, x, m_rows, y, ldy);
    case Q5_KR: return panels<KQuant<Q5_KR>>(w, row_bytes, n0, n1, x, m_rows, y, ldy);
    case Q6_KR: return panels<KQuant<Q6_KR>>(w, row_bytes, n0, n1, x, m_rows, y, ldy);
    case Q4_0: return panels<Blocks32<q16::B4_0>>(w, row_bytes, n0, n1, x, m_rows, y, ldy);
    case Q4_1: return panels<Blocks32<q16::B4_1>>(w, row_bytes, n0, n1, x, m_rows, y, ldy);
    case Q5_0: return panels<Blocks32<q16::B5_0>>(w, row_bytes, n0, n1, x, m_rows, y, ldy);
    case Q5_1: return panels<Blocks32<q16::B5_1>>(w, row_bytes, n0, n1, x, m_rows, y, ldy);
    case Q8_0: return panels<Blocks32<q16::B8_0>>(w, row_bytes, n0, n1, x, m_rows, y, ldy);
    default: return;
  }
}
#endif

}  // namespace GK_ISA
}  // namespace gk
