// Attention for many query rows (prefill) in one pass over the keys, 16 at a time, with an online softmax:
// the scores never exist as a whole, and exp2 is a vector polynomial. MLX's CPU path materializes them and
// spends ~20 ns an element in its scalar exp, which made prefill attention a third of SmolLM2's 512-token
// prefill and most of a 3,000-token one.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "flash.h"
#include "kernels.h"
#include "vmath.h"

namespace gk {

namespace {

using namespace vm;
constexpr float kLowest = std::numeric_limits<float>::lowest();

struct RowState {
  float m, l;  // running max (log2 units) and sum of weights
};

// Key block [s0, s0 + W) against one query row: scores, mask, online softmax, and the weighted V rows.
GK_CLONES void block_row(const FlashArgs& a, const float* q, const float* kt, int64_t s0, int64_t limit,
                         const uint8_t* mrow, RowState& st, float* acc) {
  const v16* k = reinterpret_cast<const v16*>(kt);
  v16 c[4] = {};  // four chains: one accumulator would wait on each FMA's latency
  int64_t d = 0;
  for (; d + 4 <= a.D; d += 4)
    for (int u = 0; u < 4; ++u) c[u] += q[d + u] * k[d + u];
  for (; d < a.D; ++d) c[0] += q[d] * k[d];
  v16 s = ((c[0] + c[1]) + (c[2] + c[3])) * a.scale;
  for (int j = a.kind == 0 && s0 + W - 1 <= limit ? W : 0; j < W; ++j) {  // only edge blocks and masks
    const int64_t key = s0 + j;
    if (key > limit) {
      s[j] = kLowest;
    } else if (a.kind == 1) {
      if (!reinterpret_cast<const bool*>(mrow)[key * a.ms]) s[j] = kLowest;
    } else if (a.kind == 2) {
      s[j] += reinterpret_cast<const float*>(mrow)[key * a.ms] * kLog2e;
    }
  }
  const float m = st.m > hmax(s) ? st.m : hmax(s);
  const float fix = std::exp2(st.m - m);  // 0 on the first block (st.m is the lowest float)
  const int64_t last = limit - s0 < W - 1 ? limit - s0 : W - 1;
  v16 p = exp2v(s - m);
  for (int64_t j = last + 1; j < W; ++j) p[j] = 0.0f;  // past the row's last key: never a weight
  st.l = st.l * fix + hsum(p);
  st.m = m;
  // four output vectors at a time held in registers across the block's keys (through memory, every FMA
  // would wait on the previous one's store)
  v16* out = reinterpret_cast<v16*>(acc);
  for (int64_t i = 0; i < a.Dv / W; i += 4) {
    const int64_t n = a.Dv / W - i < 4 ? a.Dv / W - i : 4;
    v16 o[4];
    for (int64_t u = 0; u < n; ++u) o[u] = out[i + u] * fix;
    for (int64_t j = 0; j <= last; ++j) {
      const float pj = p[j];
      const v16* vr = reinterpret_cast<const v16*>(a.v + (s0 + j) * a.vs) + i;
      for (int64_t u = 0; u < n; ++u) o[u] += pj * vr[u];
    }
    for (int64_t u = 0; u < n; ++u) out[i + u] = o[u];
  }
}

// K rows [s0, s0 + W) as D vectors of W keys (past the end: zeros, masked by the row limits).
void transpose_keys(const FlashArgs& a, int64_t s0, float* kt) {
  const int64_t n = a.S - s0 < W ? a.S - s0 : W;
  if (n < W) std::memset(kt, 0, sizeof(float) * a.D * W);
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = a.k + (s0 + j) * a.ks;
    for (int64_t d = 0; d < a.D; ++d) kt[d * W + j] = kr[d];
  }
}

}  // namespace

bool flash_fits(int64_t D, int64_t Dv) { return D > 0 && Dv % W == 0; }

void flash_attention(const FlashArgs& a) {
  const int64_t qblocks = (a.L + kFlashBlock - 1) / kFlashBlock;
  const int64_t per_b = a.Hk * qblocks;
  // the last query blocks see the most keys under a causal mask: hand them out first
  parallel_for(a.B * per_b, [&](int64_t task) {
    const int64_t b = task / per_b, g = (task % per_b) / qblocks, qb = qblocks - 1 - task % qblocks;
    const int64_t l0 = qb * kFlashBlock, l1 = l0 + kFlashBlock < a.L ? l0 + kFlashBlock : a.L;
    const int64_t rows = a.r * (l1 - l0);
    thread_local std::vector<float> kt, acc;
    thread_local std::vector<RowState> st;
    kt.resize(static_cast<size_t>(a.D * W));
    acc.assign(static_cast<size_t>(rows * a.Dv), 0.0f);
    st.assign(static_cast<size_t>(rows), RowState{kLowest, 0.0f});
    FlashArgs at = a;
    at.k = a.k + b * a.kb + g * a.kh;
    at.v = a.v + b * a.vb + g * a.vh;
    const int64_t top = a.causal ? a.S - a.L + l1 - 1 : a.S - 1;
    for (int64_t s0 = 0; s0 <= top; s0 += W) {
      transpose_keys(at, s0, kt.data());
      for (int64_t i = 0; i < a.r; ++i) {
        const int64_t h = g * a.r + i;
        for (int64_t l = l0; l < l1; ++l) {
          const int64_t limit = a.causal ? a.S - a.L + l : a.S - 1;
          if (s0 > limit) continue;
          const int64_t row = i * (l1 - l0) + (l - l0);
          const uint8_t* mrow = a.kind ? a.mask + (b * a.mb + h * a.mh + l * a.ml) * a.esize : nullptr;
          block_row(at, a.q + b * a.qb + h * a.qh + l * a.ql, kt.data(), s0, limit, mrow, st[row],
                    acc.data() + row * a.Dv);
        }
      }
    }
    for (int64_t i = 0; i < a.r; ++i)
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t row = i * (l1 - l0) + (l - l0);
        const float inv = 1.0f / st[row].l;
        float* y = a.out + ((b * a.H + g * a.r + i) * a.L + l) * a.Dv;
        for (int64_t c = 0; c < a.Dv; ++c) y[c] = acc[row * a.Dv + c] * inv;
      }
  });
}

}  // namespace gk
