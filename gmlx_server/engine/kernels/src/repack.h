// K-quant blocks repacked at load for the int16 kernels (qdot.h, row_q4kr, row_q45kr and row_q6kr): the codes
// reordered so that each 32 codes the kernel decodes hold 4 elements of 8 sub-blocks, one int32 lane sums one
// sub-block over the block, and the sub-blocks' scales apply once a block, in fp32. Scales and sizes stay.
#pragma once

#include <cstdint>

namespace gk {

constexpr int kQ4KR = 112, kQ5KR = 113, kQ6KR = 114;  // the repacked types' ids (ggml assigns none above 41)

// Q4_K_R's bytes: byte 16r + 2j + t holds elements 4r + t (low nibble) and 4r + 2 + t (high) of sub-block j.
// Its positions follow Q4_K's own nibble order, position 64c + 32h + i for nibble h of byte 32c + i, so that one
// 32-byte load feeds 64 codes (the kernels' nib64): the element at position q, natural numbering 32j + e.
constexpr int q4kr_element(int q) {
  const int c = q / 64, h = (q / 32) % 2, i = q % 32, r = 2 * c + i / 16, u = i % 16;
  return 32 * (u / 2) + 4 * r + 2 * h + u % 2;
}

// Q5_K_R's positions p = 32r + 16h + 2j + t (Q4_K_R's bytes, nibbles 32 bytes further on; element 4r + 2h + t
// of sub-block j): each 16 code bytes (nib32) make 32 positions, and the fifth bit of position p is bit r of qh
// byte 16h + 2j + t.
constexpr int q5kr_element(int p) {
  return 32 * ((p / 2) % 8) + 4 * (p / 32) + 2 * ((p / 16) % 2) + p % 2;
}


// Q6_K's 16-element sub-blocks: position p = 32s + 16h + 2l + t, s = 4g + v, is element 4v + 2h + t of
// sub-block 8g + l. Even v read their 6-bit codes from bits 0..5 of bytes P (the first 128: v = 2q of half g
// from bytes 32(2g + q) + 16h + 2l + t); odd v take their low 4 bits from the nibbles (h) of bytes N (the next
// 64: byte 16(2g + q) + 2l + t) and their top 2 from bits 6..7 of the same P byte as v - 1. Scales and d stay.
constexpr int q6kr_element(int p) {
  return 16 * (8 * (p / 128) + (p / 2) % 8) + 4 * ((p / 32) % 4) + 2 * ((p / 16) % 2) + p % 2;
}

template <int (*Element)(int)>
struct Order {
  uint8_t at[256];
  constexpr Order() : at() {
    for (int p = 0; p < 256; ++p) at[p] = static_cast<uint8_t>(Element(p));
  }
};
inline constexpr Order<q4kr_element> kQ4KROrder;
inline constexpr Order<q5kr_element> kQ5KROrder;
inline constexpr Order<q6kr_element> kQ6KROrder;

// `blocks` blocks from Q4_K (144 bytes), Q5_K (176) or Q6_K (210) to their repacked layouts, and back.
void repack_q4k(const uint8_t* in, uint8_t* out, int64_t blocks);
void unrepack_q4k(const uint8_t* in, uint8_t* out, int64_t blocks);
void repack_q5k(const uint8_t* in, uint8_t* out, int64_t blocks);
void unrepack_q5k(const uint8_t* in, uint8_t* out, int64_t blocks);
void repack_q6k(const uint8_t* in, uint8_t* out, int64_t blocks);
void unrepack_q6k(const uint8_t* in, uint8_t* out, int64_t blocks);

}  // namespace gk
