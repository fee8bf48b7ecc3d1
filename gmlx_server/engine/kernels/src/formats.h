// GGUF weight blocks, read as stored. Written from the formats' definitions (the gguf package's
// GGML_QUANT_SIZES and dequantize_blocks): each format yields, per 32-element group, 32 integer codes
// and an affine map  w[i] = a[lane(i)] * code[i] + b[half(i)]  where lane(i) = i / 4 (8 lanes, so a
// 16-element sub-block scale is 4 lanes) and half(i) = i / 16. Codes are unsigned and < 64, except
// Q8_0's, which are signed int8.
//
// GCC/Clang vector extensions keep the decoders portable: AVX2 registers on x86-64, NEON pairs on arm64,
// plain code elsewhere; the fp16 scales go through simd.h's h2f.
#pragma once

#include <cstdint>
#include <cstring>

#include "repack.h"
#include "simd.h"

namespace gk {
namespace GK_ISA {

typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint8_t u8x32 __attribute__((vector_size(32)));
typedef int8_t i8x32 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));

enum QType : int { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
// the K-quants repacked at load (repack.h; no ggml type): only the int16 kernels read them as stored
constexpr int Q4_KR = kQ4KR, Q5_KR = kQ5KR, Q6_KR = kQ6KR;

// the format a repacked type's blocks come from (the type itself for the others)
inline int natural_type(int type) {
  return type == Q4_KR ? Q4_K : type == Q5_KR ? Q5_K : type == Q6_KR ? Q6_K : type;
}

// the formats the many-row int16 GEMM reads (gemm16.h): the repacked K-quants and the 32-element blocks
inline bool gemm16_reads(int type) {
  return type == Q4_KR || type == Q5_KR || type == Q6_KR || type == Q4_0 || type == Q4_1 || type == Q5_0 ||
         type == Q5_1 || type == Q8_0;
}

inline u8x16 load16(const uint8_t* p) {
  u8x16 v;
  std::memcpy(&v, p, 16);
  return v;
}

inline u8x32 load32(const uint8_t* p) {
  u8x32 v;
  std::memcpy(&v, p, 32);
  return v;
}

inline u8x32 cat(u8x16 lo, u8x16 hi) {
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                                 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
}

inline f32x8 splat(float v) { return f32x8{v, v, v, v, v, v, v, v}; }

inline f32x8 halves(float lo, float hi) { return f32x8{lo, lo, lo, lo, hi, hi, hi, hi}; }

// One 32-element group: codes and the affine map (a per lane, b per 16-element half).
struct Group {
  u8x32 q;
  f32x8 a;
  float b0, b1;
};

// Q4_0/Q4_1 layout: byte j holds element j (low nibble) and element j + 16 (high nibble).
inline u8x32 split_nibbles(const uint8_t* qs) {
  const u8x16 v = load16(qs);
  return cat(v & 0x0F, v >> 4);
}

// Q5_0/Q5_1 `qh`: bit i of a little-endian uint32 is bit 4 of element i.
inline u8x32 high_bits32(const uint8_t* qh) {
  u8x16 b = {};
  std::memcpy(&b, qh, 4);
  const u8x32 spread = __builtin_shufflevector(b, b, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
                                               2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const u8x32 bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
                     1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return (u8x32)((spread & bit) != 0) & 0x10;
}

// A format: BYTES per block of QK elements, GROUPS = QK / 32, SIGNED codes or not, HALF_SCALES when
// a group's two halves scale differently (Q6_K), and a per-block State that decodes group g. State construction reads the block's shared scales once.
struct FQ4_0 {
  static constexpr int QK = 32, BYTES = 18, GROUPS = 1;
  static constexpr bool SIGNED = false, HALF_SCALES = false;
  struct State {
    const uint8_t* p;
    explicit State(const uint8_t* b) : p(b) {}
    Group group(int) const {
      const float d = f16_at(p);
      return {split_nibbles(p + 2), splat(d), -8.0f * d, -8.0f * d};
    }
  };
};

struct FQ4_1 {
  static constexpr int QK = 32, BYTES = 20, GROUPS = 1;
  static constexpr bool SIGNED = false, HALF_SCALES = false;
  struct State {
    const uint8_t* p;
    explicit State(const uint8_t* b) : p(b) {}
    Group group(int) const {
      const float m = f16_at(p + 2);
      return {split_nibbles(p + 4), splat(f16_at(p)), m, m};
    }
  };
};

struct FQ5_0 {
  static constexpr int QK = 32, BYTES = 22, GROUPS = 1;
  static constexpr bool SIGNED = false, HALF_SCALES = false;
  struct State {
    const uint8_t* p;
    explicit State(const uint8_t* b) : p(b) {}
    Group group(int) const {
      const float d = f16_at(p);
      return {split_nibbles(p + 6) | high_bits32(p + 2), splat(d), -16.0f * d, -16.0f * d};
    }
  };
};

struct FQ5_1 {
  static constexpr int QK = 32, BYTES = 24, GROUPS = 1;
  static constexpr bool SIGNED = false, HALF_SCALES = false;
  struct State {
    const uint8_t* p;
    explicit State(const uint8_t* b) : p(b) {}
    Group group(int) const {
      const float m = f16_at(p + 2);
      return {split_nibbles(p + 8) | high_bits32(p + 4), splat(f16_at(p)), m, m};
    }
  };
};

struct FQ8_0 {
  static constexpr int QK = 32, BYTES = 34, GROUPS = 1;
  static constexpr bool SIGNED = true, HALF_SCALES = false;
  struct State {
    const uint8_t* p;
    explicit State(const uint8_t* b) : p(b) {}
    Group group(int) const { return {load32(p + 2), splat(f16_at(p)), 0.0f, 0.0f}; }
  };
};

// Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit (scale, min) pairs packed in 12 bytes; w = d*sc*q - dmin*m.
inline void k_scale_min(const uint8_t* s, float d, float dmin, float* a, float* b) {
  for (int j = 0; j < 4; ++j) {
    a[j] = d * static_cast<float>(s[j] & 0x3F);
    b[j] = -dmin * static_cast<float>(s[j + 4] & 0x3F);
    a[j + 4] = d * static_cast<float>((s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30));
    b[j + 4] = -dmin * static_cast<float>((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
  }
}

// K-quant 4-bit layout: 32-byte chunk c holds sub-block 2c (low nibbles) and 2c + 1 (high nibbles).
inline u8x32 k_nibbles(const uint8_t* qs, int g) {
  const u8x32 c = load32(qs + 32 * (g >> 1));
  return (g & 1) ? c >> 4 : c & 0x0F;
}

struct FQ4_K {
  static constexpr int QK = 256, BYTES = 144, GROUPS = 8;
  static constexpr bool SIGNED = false, HALF_SCALES = false;
  struct State {
    const uint8_t* p;
    float a[8], b[8];
    explicit State(const uint8_t* blk) : p(blk) { k_scale_min(p + 4, f16_at(p), f16_at(p + 2), a, b); }
    Group group(int g) const { return {k_nibbles(p + 16, g), splat(a[g]), b[g], b[g]}; }
  };
};

struct FQ5_K {
  static constexpr int QK = 256, BYTES = 176, GROUPS = 8;
  static constexpr bool SIGNED = false, HALF_SCALES = false;
  struct State {
    const uint8_t* p;
    u8x32 qh;
    float a[8], b[8];
    explicit State(const uint8_t* blk) : p(blk), qh(load32(blk + 16)) {
      k_scale_min(p + 4, f16_at(p), f16_at(p + 2), a, b);
    }
    Group group(int g) const {
      const u8x32 hi = ((qh >> g) & 1) << 4;  // bit g of qh[i] is bit 4 of element i of sub-block g
      return {k_nibbles(p + 48, g) | hi, splat(a[g]), b[g], b[g]};
    }
  };
};

// Q6_K: ql[128] qh[64] int8 scales[16] d; 16-element sub-blocks, w = d * scale * (q - 32).
// Half h (128 elements) = four groups k: low (k < 2) or high nibbles of ql[h*64 + 32*(k&1)], and
// bits 2k..2k+1 of qh[h*32 + i] as bits 4..5.
struct FQ6_K {
  static constexpr int QK = 256, BYTES = 210, GROUPS = 8;
  static constexpr bool SIGNED = false, HALF_SCALES = true;
  struct State {
    const uint8_t* p;
    float d;
    explicit State(const uint8_t* blk) : p(blk), d(f16_at(blk + 208)) {}
    Group group(int g) const {
      const int h = g >> 2, k = g & 3;
      const u8x32 c = load32(p + h * 64 + 32 * (k & 1));
      const u8x32 hi = ((load32(p + 128 + h * 32) >> (2 * k)) & 3) << 4;
      const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192) + 2 * g;
      const float a0 = d * static_cast<float>(sc[0]), a1 = d * static_cast<float>(sc[1]);
      return {(k < 2 ? c & 0x0F : c >> 4) | hi, halves(a0, a1), -32.0f * a0, -32.0f * a1};
    }
  };
};

// Calls f.template operator()<T>() with the T of the list (in QType order: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q4_K, Q5_K, Q6_K) for the runtime type; false for a type with no kernel.
template <class T40, class T41, class T50, class T51, class T80, class T4K, class T5K, class T6K, class Fn>
inline bool by_type(int type, Fn&& f) {
  switch (type) {
    case Q4_0: f.template operator()<T40>(); return true;
    case Q4_1: f.template operator()<T41>(); return true;
    case Q5_0: f.template operator()<T50>(); return true;
    case Q5_1: f.template operator()<T51>(); return true;
    case Q8_0: f.template operator()<T80>(); return true;
    case Q4_K: f.template operator()<T4K>(); return true;
    case Q5_K: f.template operator()<T5K>(); return true;
    case Q6_K: f.template operator()<T6K>(); return true;
    default: return false;
  }
}

template <class Fn>
inline bool with_format(int type, Fn&& f) {
  return by_type<FQ4_0, FQ4_1, FQ5_0, FQ5_1, FQ8_0, FQ4_K, FQ5_K, FQ6_K>(type, f);
}

// Bytes of one block of `type` (0 when no kernel reads it).
inline int block_bytes(int type) {
  int out = 0;
  with_format(natural_type(type), [&]<class F>() { out = F::BYTES; });
  return out;
}

// Bytes of one row of `k` elements, or -1 when `type` has no kernel or k does not fill whole blocks.
inline int64_t row_bytes(int type, int64_t k) {
  int64_t out = -1;
  with_format(natural_type(type), [&]<class F>() { out = (k % F::QK == 0) ? k / F::QK * F::BYTES : -1; });
  return out;
}

}  // namespace GK_ISA
}  // namespace gk
