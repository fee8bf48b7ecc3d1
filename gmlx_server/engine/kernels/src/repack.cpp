#include "repack.h"

#include <cstring>

namespace gk {

namespace {

// Q4_K's codes: 32-byte chunk c holds sub-block 2c in its low nibbles and 2c + 1 in its high ones.
inline int natural_byte(int n) { return 32 * (n / 64) + n % 32; }
inline int natural_shift(int n) { return 4 * ((n / 32) % 2); }

// Q6_K's natural element n: ql nibble (k / 2) of byte 64h + 32(k & 1) + i, qh bits 2k..2k+1 of byte 128 + 32h + i
// for n = 128h + 32k + i.
inline int q6_code(const uint8_t* w, int n) {
  const int h = n / 128, k = (n % 128) / 32, i = n % 32;
  const int lo = (w[64 * h + 32 * (k & 1) + i] >> (4 * (k / 2))) & 15;
  return lo | (((w[128 + 32 * h + i] >> (2 * k)) & 3) << 4);
}

inline void q6_set(uint8_t* w, int n, int c) {
  const int h = n / 128, k = (n % 128) / 32, i = n % 32;
  w[64 * h + 32 * (k & 1) + i] |= static_cast<uint8_t>((c & 15) << (4 * (k / 2)));
  w[128 + 32 * h + i] |= static_cast<uint8_t>((c >> 4) << (2 * k));
}

// the repacked block's byte holding position p's code bits (q6kr_element's comment)
inline int q6r_code(const uint8_t* w, int p) {
  const int s = p / 32, h = (p / 16) % 2, i = p % 16, q = s / 2, v = s % 4;
  const uint8_t pb = w[16 * (2 * q + h) + i];  // q = 2g + v / 2
  if (v % 2 == 0) return pb & 63;
  return ((w[128 + 16 * q + i] >> (4 * h)) & 15) | ((pb >> 6) << 4);
}

inline void q6r_set(uint8_t* w, int p, int c) {
  const int s = p / 32, h = (p / 16) % 2, i = p % 16, q = s / 2, v = s % 4;
  uint8_t& pb = w[16 * (2 * q + h) + i];
  if (v % 2 == 0) {
    pb |= static_cast<uint8_t>(c);
    return;
  }
  w[128 + 16 * q + i] |= static_cast<uint8_t>((c & 15) << (4 * h));
  pb |= static_cast<uint8_t>((c >> 4) << 6);
}

}  // namespace

void repack_q6k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, in += 210, out += 210) {
    std::memset(out, 0, 192);
    std::memcpy(out + 192, in + 192, 18);
    for (int p = 0; p < 256; ++p) q6r_set(out, p, q6_code(in, kQ6KROrder.at[p]));
  }
}

void unrepack_q6k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, in += 210, out += 210) {
    std::memset(out, 0, 192);
    std::memcpy(out + 192, in + 192, 18);
    for (int p = 0; p < 256; ++p) q6_set(out, kQ6KROrder.at[p], q6r_code(in, p));
  }
}

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
