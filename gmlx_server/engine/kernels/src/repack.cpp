// Repacking goes through the block's 256 codes: unpacked in one layout's order, permuted, packed in the other's.
#include "repack.h"

#include <cstring>

namespace gk {

namespace {

// The packs keep each code's low 4 bits (Q5_K's fifth goes elsewhere).
// Q4_K: 32-byte chunk c holds element i of sub-block 2c in its low nibble and of 2c + 1 in its high one.
void q4_codes(const uint8_t* q, uint8_t* code) {
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 32; ++i) code[64 * c + i] = q[32 * c + i] & 15, code[64 * c + 32 + i] = q[32 * c + i] >> 4;
}
void q4_pack(const uint8_t* code, uint8_t* q) {
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 32; ++i) q[32 * c + i] = static_cast<uint8_t>((code[64 * c + i] & 15) | (code[64 * c + 32 + i] << 4));
}

// Q5_KR's nibbles: position 32r + i (i < 16) is the low nibble of byte 16r + i, 32r + 16 + i its high one.
// (Q4_KR's positions are Q4_K's: q4_codes and q4_pack.)
void q5r_nibbles(const uint8_t* q, uint8_t* code) {
  for (int r = 0; r < 8; ++r)
    for (int i = 0; i < 16; ++i) code[32 * r + i] = q[16 * r + i] & 15, code[32 * r + 16 + i] = q[16 * r + i] >> 4;
}
void q5r_pack_nibbles(const uint8_t* code, uint8_t* q) {
  for (int r = 0; r < 8; ++r)
    for (int i = 0; i < 16; ++i) q[16 * r + i] = static_cast<uint8_t>((code[32 * r + i] & 15) | (code[32 * r + 16 + i] << 4));
}

// Q5_K: Q4_K's nibbles 32 bytes on (w + 32), and bit j of qh[e] (w) the fifth bit of element 32j + e.
void q5_codes(const uint8_t* w, uint8_t* code) {
  q4_codes(w + 32, code);
  for (int n = 0; n < 256; ++n) code[n] = static_cast<uint8_t>(code[n] | (((w[n % 32] >> (n / 32)) & 1) << 4));
}
void q5_pack(const uint8_t* code, uint8_t* w) {
  q4_pack(code, w + 32);  // (the packs keep each code's low 4 bits)
  std::memset(w, 0, 32);
  for (int n = 0; n < 256; ++n) w[n % 32] = static_cast<uint8_t>(w[n % 32] | ((code[n] >> 4) << (n / 32)));
}

// Q5_KR: Q4_KR's nibbles at w + 32; position p's fifth bit is bit p / 32 of qh byte p % 32.
void q5r_codes(const uint8_t* w, uint8_t* code) {
  q5r_nibbles(w + 32, code);
  for (int p = 0; p < 256; ++p) code[p] = static_cast<uint8_t>(code[p] | (((w[p % 32] >> (p / 32)) & 1) << 4));
}
void q5r_pack(const uint8_t* code, uint8_t* w) {
  q5r_pack_nibbles(code, w + 32);
  std::memset(w, 0, 32);
  for (int p = 0; p < 256; ++p) w[p % 32] = static_cast<uint8_t>(w[p % 32] | ((code[p] >> 4) << (p / 32)));
}

// Q6_K: element 128h + 32k + i is nibble k / 2 of ql[64h + 32(k & 1) + i] and bits 2k..2k+1 of qh[32h + i].
void q6_codes(const uint8_t* w, uint8_t* code) {
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 32; ++i)
        code[128 * h + 32 * k + i] = static_cast<uint8_t>(((w[64 * h + 32 * (k & 1) + i] >> (4 * (k / 2))) & 15) |
                                                          (((w[128 + 32 * h + i] >> (2 * k)) & 3) << 4));
}
void q6_pack(const uint8_t* code, uint8_t* w) {
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 32; ++i) {
      const uint8_t* c = code + 128 * h + i;
      w[64 * h + i] = static_cast<uint8_t>((c[0] & 15) | ((c[64] & 15) << 4));
      w[64 * h + 32 + i] = static_cast<uint8_t>((c[32] & 15) | ((c[96] & 15) << 4));
      w[128 + 32 * h + i] = static_cast<uint8_t>((c[0] >> 4) | ((c[32] >> 4) << 2) | ((c[64] >> 4) << 4) | ((c[96] >> 4) << 6));
    }
}

// Q6_KR (repack.h): quarter q's positions 64q + j (j < 32) read bits 0..5 of P byte 32q + j, 64q + 32 + j the
// nibble j / 16 of N byte 16q + j % 16 with bits 6..7 of P byte 32q + j on top.
void q6r_codes(const uint8_t* w, uint8_t* code) {
  for (int q = 0; q < 4; ++q)
    for (int j = 0; j < 32; ++j) {
      const uint8_t p = w[32 * q + j];
      code[64 * q + j] = p & 63;
      code[64 * q + 32 + j] = static_cast<uint8_t>(((w[128 + 16 * q + j % 16] >> (4 * (j / 16))) & 15) | ((p >> 6) << 4));
    }
}
void q6r_pack(const uint8_t* code, uint8_t* w) {
  for (int q = 0; q < 4; ++q) {
    for (int j = 0; j < 32; ++j) w[32 * q + j] = static_cast<uint8_t>(code[64 * q + j] | ((code[64 * q + 32 + j] >> 4) << 6));
    for (int i = 0; i < 16; ++i)
      w[128 + 16 * q + i] = static_cast<uint8_t>((code[64 * q + 32 + i] & 15) | ((code[64 * q + 48 + i] & 15) << 4));
  }
}

using Codes = void (*)(const uint8_t*, uint8_t*);

// Each block's codes from one layout to the other: to the repacked order (position p takes element order[p]) or
// back (element order[p] takes position p); the scales (`kept_bytes` from `kept`) are copied as they are.
template <Codes Unpack, Codes Pack>
void convert(const uint8_t* in, uint8_t* out, int64_t blocks, int bytes, int codes_at, int kept, int kept_bytes,
             bool to_repacked, const uint8_t* order) {
  for (int64_t b = 0; b < blocks; ++b, in += bytes, out += bytes) {
    uint8_t from[256], to[256];
    Unpack(in + codes_at, from);
    for (int p = 0; p < 256; ++p) {
      if (to_repacked) to[p] = from[order[p]];
      else to[order[p]] = from[p];
    }
    Pack(to, out + codes_at);
    std::memcpy(out + kept, in + kept, static_cast<size_t>(kept_bytes));
  }
}

}  // namespace

void repack_q4k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  convert<q4_codes, q4_pack>(in, out, blocks, 144, 16, 0, 16, true, kQ4KROrder.at);
}
void unrepack_q4k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  convert<q4_codes, q4_pack>(in, out, blocks, 144, 16, 0, 16, false, kQ4KROrder.at);
}
void repack_q5k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  convert<q5_codes, q5r_pack>(in, out, blocks, 176, 16, 0, 16, true, kQ5KROrder.at);
}
void unrepack_q5k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  convert<q5r_codes, q5_pack>(in, out, blocks, 176, 16, 0, 16, false, kQ5KROrder.at);
}
void repack_q6k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  convert<q6_codes, q6r_pack>(in, out, blocks, 210, 0, 192, 18, true, kQ6KROrder.at);
}
void unrepack_q6k(const uint8_t* in, uint8_t* out, int64_t blocks) {
  convert<q6r_codes, q6_pack>(in, out, blocks, 210, 0, 192, 18, false, kQ6KROrder.at);
}

}  // namespace gk
