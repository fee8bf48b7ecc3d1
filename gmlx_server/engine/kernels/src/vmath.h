// 16-lane float vectors (GCC/Clang vector extensions: one zmm on AVX-512, two ymm on AVX2, NEON quads on
// arm64) and the exp2 the attention and activation kernels need.
#pragma once

#include <cstdint>
#include <cstring>

// A function compiled for the baseline, AVX2 and AVX-512 (x86-64-v4), picked at load time by the CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GK_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define GK_CLONES
#endif

namespace gk {
namespace vm {

// aligned(4): loads from plain float buffers need no 64-byte alignment
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i32v16 __attribute__((vector_size(64), aligned(4)));
constexpr int W = 16;

inline v16 splat(float x) { return v16{} + x; }
inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }
inline v16 vmin(v16 a, v16 b) { return a < b ? a : b; }

// Horizontal max and sum in four halving steps.
inline float hmax(v16 v) {
  v = vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  v = vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  v = vmax(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return v[0];
}

inline float hsum(v16 v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

// 2^x: x = n + f with n an integer (round to nearest) and |f| <= 1/2; 2^f by its Taylor series in f ln 2 to
// the 7th power (relative error < 1e-7); 2^n in the exponent bits. x is clamped to [-127, 127]: 0 below.
inline v16 exp2v(v16 x) {
  x = vmin(vmax(x, splat(-127.0f)), splat(127.0f));
  const v16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const v16 n = (x + magic) - magic;
  const v16 y = (x - n) * 0.6931471805599453f;
  v16 p = splat(1.0f / 5040.0f);
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = p * y + c;
  const i32v16 bits = (__builtin_convertvector(n, i32v16) + 127) << 23;  // n = -127: 0.0
  v16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

constexpr float kLog2e = 1.4426950408889634f;

}  // namespace vm
}  // namespace gk
