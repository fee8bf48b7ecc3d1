// Q4_K blocks repacked at load for the int16 kernels (qdot.h, row_q4kr): the 128 code bytes reordered so that
// each 16 of them hold 4 elements of every 32-element sub-block, so one int32 lane sums one sub-block over the
// whole block and the block's scales apply once, in fp32. The 16 bytes of d, dmin and scales stay; the size too.
#pragma once

#include <cstdint>

namespace gk {

constexpr int kQ4KR = 112;  // the repacked type's id (ggml assigns none above 41)

// The natural element (0..255) at repacked position p = 32r + 16h + 2j + t: element 4r + 2h + t of sub-block
// j. Position p's code is byte 16r + 2j + t, low nibble for h = 0.
constexpr int q4kr_element(int p) {
  return 32 * ((p / 2) % 8) + 4 * (p / 32) + 2 * ((p / 16) % 2) + p % 2;
}

struct Q4KROrder {
  uint8_t at[256];
  constexpr Q4KROrder() : at() {
    for (int p = 0; p < 256; ++p) at[p] = static_cast<uint8_t>(q4kr_element(p));
  }
};
inline constexpr Q4KROrder kQ4KROrder;

// `blocks` 144-byte blocks from Q4_K to the repacked layout, and back.
void repack_q4k(const uint8_t* in, uint8_t* out, int64_t blocks);
void unrepack_q4k(const uint8_t* in, uint8_t* out, int64_t blocks);

}  // namespace gk
