// Many-query-row attention (prefill): see flash.cpp.
#pragma once

#include <cstdint>

namespace gk {

constexpr int64_t kFlashRows = 16;   // from this many query rows, the flash path
constexpr int64_t kFlashKeys = 64;  // and from this many keys for one sequence's fewer rows (decode)
constexpr int64_t kSplitKeys = 128;  // the fewest keys a task takes when a call's keys are split across tasks
constexpr int64_t kFlashWidth = 16;  // keys per block: one v16 of scores (simd.h)
constexpr int64_t kFlashBlock = 64;  // query positions per task (times the heads sharing a KV head): each
                                     // transposed key block serves them all

// Element strides; the last dimension of q, k, v, out is contiguous. mask: bytes of the (B, H, L, S) mask
// (kind 1 bool, 2 additive float in natural-log units, 0 none), strides in elements. k and v are float, or
// IEEE fp16 bits when `half` (a float16 KV cache: half the bytes a long context reads, widened in registers).
struct FlashArgs {
  const float* q;
  const void *k, *v;
  float* out;  // rows of Dv floats at the o* strides
  int64_t qb, qh, ql, kb, kh, ks, vb, vh, vs;
  const uint8_t* mask;
  int64_t mb, mh, ml, ms, esize;
  int kind;
  int64_t B, H, Hk, r, L, S, D, Dv;
  float scale;  // in log2 units
  bool causal;
  bool half;
  int64_t ob = 0, oh = 0, ol = 0;  // out's strides in floats for (b, h, l): (B, H, L, Dv), or (B, L, H, Dv) flat
};

// The KV element `elems` elements past p: float, or fp16 when `half`.
inline const void* kv_at(const void* p, int64_t elems, bool half) {
  return static_cast<const char*>(p) + elems * (half ? 2 : 4);
}

// One query row's online softmax: running max (log2 units) and sum of weights.
struct RowState {
  float m, l;
};

// One query row against keys 0..limit for the few-row path (sdpa.cpp): softmax(scale * q.k + mask) v.
struct AttendRow {
  const float* q;
  const void* k;  // float, or fp16 when half (as FlashArgs)
  int64_t ks;
  const void* v;
  int64_t vs;
  int64_t limit, D, Dv;
  float scale;  // in log2 units
  const uint8_t* mask;  // bool (kind 1) or float (kind 2) mask row, element stride ms
  int kind;
  int64_t ms;
  bool half;
};

bool flash_fits(int64_t D, int64_t Dv);
void flash_attention(const FlashArgs& a);

}  // namespace gk
