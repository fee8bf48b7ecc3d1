// Attention for many query rows (prefill) in one pass over the keys, 16 at a time, with an online softmax:
// the scores never exist as a whole, and exp2 is a vector polynomial. MLX's CPU path materializes them and
// spends ~20 ns an element in its scalar exp, which made prefill attention a third of SmolLM2's 512-token
// prefill and most of a 3,000-token one. This file splits the work into tasks; the per-row kernel over a
// key block is vec_kernels.h's block_row, compiled per instruction set and taken from the chosen Isa table.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "flash.h"
#include "kernels.h"

namespace gk {

namespace {

constexpr int64_t W = kFlashWidth;
constexpr float kLowest = std::numeric_limits<float>::lowest();

// Floats of a task's scratch: a key block transposed, then (a float16 cache) its value rows widened.
int64_t scratch_floats(const FlashArgs& a) { return a.D * W + (a.half ? W * a.Dv : 0); }

// One task: query positions [l0, l1) of the r heads that share KV head g, over the keys [s_begin, s_end)
// (s_begin a multiple of W). Leaves each row's running max and sum in st and its unnormalized output in acc.
// kt: scratch_floats(a). A float16 block is widened once here for all the task's rows (r in decode, r * 64 in
// prefill), not by each row.
void run_task(const FlashArgs& a, int64_t b, int64_t g, int64_t l0, int64_t l1, int64_t s_begin, int64_t s_end,
              RowState* st, float* acc, float* kt) {
  const int64_t n = l1 - l0;
  for (int64_t row = 0; row < a.r * n; ++row) st[row] = RowState{kLowest, 0.0f};
  std::memset(acc, 0, sizeof(float) * a.r * n * a.Dv);
  const Isa& isa = active_isa();  // the key-block kernels of the chosen instruction set
  FlashArgs at = a;
  at.k = kv_at(a.k, b * a.kb + g * a.kh, a.half);
  at.v = kv_at(a.v, b * a.vb + g * a.vh, a.half);
  float* vt = kt + a.D * W;
  const int64_t vs = a.half ? a.Dv : a.vs;  // the value rows block_row reads: widened, or the cache's own
  for (int64_t s0 = s_begin; s0 < s_end; s0 += W) {
    isa.transpose_keys(at, s0, kt);
    if (a.half) isa.widen_values(at, s0, vt);
    const float* vb = a.half ? vt : static_cast<const float*>(at.v) + s0 * a.vs;
    for (int64_t i = 0; i < a.r; ++i) {
      const int64_t h = g * a.r + i;
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t limit = std::min(a.causal ? a.S - a.L + l : a.S - 1, s_end - 1);
        if (s0 > limit) continue;
        const int64_t row = i * n + (l - l0);
        const uint8_t* mrow = a.kind ? a.mask + (b * a.mb + h * a.mh + l * a.ml) * a.esize : nullptr;
        isa.block_row(at, a.q + b * a.qb + h * a.qh + l * a.ql, kt, vb, vs, s0, limit, mrow, st[row],
                      acc + row * a.Dv);
      }
    }
  }
}

float* out_row(const FlashArgs& a, int64_t b, int64_t h, int64_t l) { return a.out + b * a.ob + h * a.oh + l * a.ol; }

struct Tasks {
  int64_t qblocks, per_b, count;
  explicit Tasks(const FlashArgs& a)
      : qblocks((a.L + kFlashBlock - 1) / kFlashBlock), per_b(a.Hk * qblocks), count(a.B * per_b) {}
  // task t -> (b, g, l0, l1); the last query blocks see the most keys under a causal mask: they go first
  void at(const FlashArgs& a, int64_t t, int64_t& b, int64_t& g, int64_t& l0, int64_t& l1) const {
    b = t / per_b, g = (t % per_b) / qblocks;
    l0 = (qblocks - 1 - t % qblocks) * kFlashBlock, l1 = std::min(l0 + kFlashBlock, a.L);
  }
  int64_t top(const FlashArgs& a, int64_t l1) const { return a.causal ? a.S - a.L + l1 - 1 : a.S - 1; }
};

void whole(const FlashArgs& a, const Tasks& tasks) {
  parallel_for(tasks.count, [&](int64_t t) {
    int64_t b, g, l0, l1;
    tasks.at(a, t, b, g, l0, l1);
    const int64_t rows = a.r * (l1 - l0);
    thread_local std::vector<float> kt, acc;
    thread_local std::vector<RowState> st;
    kt.resize(static_cast<size_t>(scratch_floats(a))), acc.resize(static_cast<size_t>(rows * a.Dv)), st.resize(rows);
    run_task(a, b, g, l0, l1, 0, tasks.top(a, l1) + 1, st.data(), acc.data(), kt.data());
    for (int64_t i = 0; i < a.r; ++i)
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t row = i * (l1 - l0) + (l - l0);
        const float inv = 1.0f / st[row].l;
        float* y = out_row(a, b, g * a.r + i, l);
        for (int64_t c = 0; c < a.Dv; ++c) y[c] = acc[row * a.Dv + c] * inv;
      }
  });
}

// Few tasks over many keys (decode at a long context, Gemma's one KV head): each task's keys in `splits`
// ranges on the pool, then each row's partial softmaxes merged (rescaled to the largest running max).
void split_keys(const FlashArgs& a, const Tasks& tasks, int64_t splits) {
  const int64_t rows_max = a.r * std::min(kFlashBlock, a.L), slot = rows_max * a.Dv;
  std::vector<float> acc(static_cast<size_t>(tasks.count * splits * slot));
  std::vector<RowState> st(static_cast<size_t>(tasks.count * splits * rows_max));
  parallel_for(tasks.count * splits, [&](int64_t job) {
    const int64_t t = job / splits, k = job % splits;
    int64_t b, g, l0, l1;
    tasks.at(a, t, b, g, l0, l1);
    const int64_t keys = tasks.top(a, l1) + 1, chunk = ((keys + splits - 1) / splits + W - 1) / W * W;
    thread_local std::vector<float> kt;
    kt.resize(static_cast<size_t>(scratch_floats(a)));
    run_task(a, b, g, l0, l1, k * chunk, std::min((k + 1) * chunk, keys), st.data() + job * rows_max,
             acc.data() + job * slot, kt.data());
  });
  parallel_for(tasks.count, [&](int64_t t) {
    int64_t b, g, l0, l1;
    tasks.at(a, t, b, g, l0, l1);
    for (int64_t i = 0; i < a.r; ++i)
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t row = i * (l1 - l0) + (l - l0);
        float m = kLowest, sum = 0.0f;
        for (int64_t k = 0; k < splits; ++k) m = std::max(m, st[(t * splits + k) * rows_max + row].m);
        float* y = out_row(a, b, g * a.r + i, l);
        std::fill(y, y + a.Dv, 0.0f);
        for (int64_t k = 0; k < splits; ++k) {
          const RowState& p = st[(t * splits + k) * rows_max + row];
          const float w = std::exp2(p.m - m);  // a range with no key of this row: l = 0, adds nothing
          sum += p.l * w;
          const float* part = acc.data() + (t * splits + k) * slot + row * a.Dv;
          for (int64_t c = 0; c < a.Dv; ++c) y[c] += part[c] * w;
        }
        for (int64_t c = 0; c < a.Dv; ++c) y[c] /= sum;
      }
  });
}

}  // namespace

bool flash_fits(int64_t D, int64_t Dv) { return D > 0 && Dv % W == 0; }

void flash_attention(const FlashArgs& a) {
  const Tasks tasks(a);
  const int64_t want = 4 * threads();  // tasks enough to keep the pool busy to the end
  const int64_t splits = tasks.count >= want ? 1 : std::min((want + tasks.count - 1) / tasks.count, a.S / kSplitKeys);
  if (splits > 1) {
    split_keys(a, tasks, splits);
  } else {
    whole(a, tasks);
  }
}

}  // namespace gk
