#include "repack.h"

#include <cstring>

namespace gk {

namespace {

// Q4_K's codes: 32-byte chunk c holds sub-block 2c in its low nibbles and 2c + 1 in its high ones.
inline int natural_byte(int n) { return 32 * (n / 64) + n % 32; }
inline int natural_shift(int n) { return 4 * ((n / 32) % 2); }

}  // namespace

void repack_q4k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, in += 144, out += 144) {
    std::memcpy(out, in, 16);
    uint8_t code[256];
    for (int n = 0; n < 256; ++n) code[n] = (in[16 + natural_byte(n)] >> natural_shift(n)) & 15;
    for (int i = 0; i < 128; ++i) {
      const int p = 32 * (i / 16) + i % 16;  // the low nibble's position; the high one's is 16 on
      out[16 + i] = static_cast<uint8_t>(code[kQ4KROrder.at[p]] | (code[kQ4KROrder.at[p + 16]] << 4));
    }
  }
}

void unrepack_q4k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, in += 144, out += 144) {
    std::memcpy(out, in, 16);
    uint8_t code[256];
    for (int i = 0; i < 128; ++i) {
      const int p = 32 * (i / 16) + i % 16;
      code[kQ4KROrder.at[p]] = in[16 + i] & 15;
      code[kQ4KROrder.at[p + 16]] = in[16 + i] >> 4;
    }
    for (int i = 0; i < 128; ++i) out[16 + i] = static_cast<uint8_t>(code[64 * (i / 32) + i % 32] | (code[64 * (i / 32) + 32 + i % 32] << 4));
  }
}

}  // namespace gk
