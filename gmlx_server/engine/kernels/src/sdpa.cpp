// Attention as one CPU primitive: MLX's CPU path spends a dozen ops (and their dispatch) per layer on it. One
// sequence's few query rows (decode, speculative verification) over fewer than kFlashKeys keys run row by row
// (vec_kernels.h's attend, from the chosen Isa table); a batch, more rows or more keys, flash.cpp (its B * H
// row tasks were twice the flash path's time at 4 rows).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "encode.h"
#include "fast_ops.h"
#include "flash.h"
#include "kernels.h"

namespace gk {

namespace {

// A 4-D view of float32 or float16 elements (strides in elements): its buffer when the last stride is 1, else
// a gathered row-major copy.
struct View4 {
  const void* p;
  int64_t s0, s1, s2;
  bool half;
  std::vector<uint8_t> copy;

  explicit View4(const mx::array& a) : half(a.dtype() == mx::float16) {
    if (a.strides()[3] == 1) {
      p = a.data<void>();
      s0 = a.strides()[0], s1 = a.strides()[1], s2 = a.strides()[2];
      return;
    }
    const size_t es = a.itemsize();
    copy.resize(a.size() * es);
    const uint8_t* src = static_cast<const uint8_t*>(a.data<void>());
    size_t i = 0;
    for (int64_t a0 = 0; a0 < a.shape(0); ++a0)
      for (int64_t a1 = 0; a1 < a.shape(1); ++a1)
        for (int64_t a2 = 0; a2 < a.shape(2); ++a2)
          for (int64_t a3 = 0; a3 < a.shape(3); ++a3, i += es)
            std::memcpy(copy.data() + i, src + es * (a0 * a.strides()[0] + a1 * a.strides()[1] +
                                                     a2 * a.strides()[2] + a3 * a.strides()[3]), es);
    p = copy.data();
    s2 = a.shape(3), s1 = s2 * a.shape(2), s0 = s1 * a.shape(1);
  }
  const void* at(int64_t i0, int64_t i1, int64_t i2) const { return kv_at(p, i0 * s0 + i1 * s1 + i2 * s2, half); }
  const float* fat(int64_t i0, int64_t i1, int64_t i2) const { return static_cast<const float*>(at(i0, i1, i2)); }
};

// The mask's strides as a (B, H, L, S) view: leading dimensions it lacks, and those of size 1, read stride 0.
std::array<int64_t, 4> mask_strides(const mx::array& m) {
  std::array<int64_t, 4> st{0, 0, 0, 0};
  for (int i = 0; i < m.ndim(); ++i) st[4 - m.ndim() + i] = m.shape(i) == 1 ? 0 : m.strides()[i];
  return st;
}

}  // namespace

mx::array sdpa(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
               const std::optional<mx::array>& mask, bool causal, bool flat, int keys, mx::StreamOrDevice s) {
  for (const auto* a : {&q, &k, &v}) {
    if (a->ndim() != 4) throw std::invalid_argument("sdpa: (B, H, L, D) arrays only");
  }
  const bool kv_ok = k.dtype() == v.dtype() && (k.dtype() == mx::float32 || k.dtype() == mx::float16);
  if (q.dtype() != mx::float32 || !kv_ok)
    throw std::invalid_argument("sdpa: float32 queries; keys and values both float32 or both float16");
  if (keys > k.shape(2) || v.shape(2) != k.shape(2)) throw std::invalid_argument("sdpa: keys past k and v's rows");
  const int64_t B = q.shape(0), H = q.shape(1), L = q.shape(2), S = keys >= 0 ? keys : k.shape(2);
  if (k.shape(0) != B || v.shape(0) != B || k.shape(1) != v.shape(1) || H % k.shape(1) || k.shape(3) != q.shape(3))
    throw std::invalid_argument("sdpa: q (B, H, L, D), k (B, Hk, S, D), v (B, Hk, S, Dv) with H a multiple of Hk");
  if (causal && L > S) throw std::invalid_argument("sdpa: causal needs at least as many keys as queries");
  const auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {q, k, v};
  int kind = 0;
  if (mask) {  // read through broadcast strides (mask_strides): a broadcast_to op per layer cost more than it did
    mx::array m = *mask;
    const int64_t want[4] = {B, H, L, S};
    bool fits = m.ndim() <= 4;
    for (int i = 0; fits && i < m.ndim(); ++i) {
      const int64_t n = m.shape(i), w = want[4 - m.ndim() + i];
      fits = n == 1 || n == w;
    }
    if (!fits) throw std::invalid_argument("sdpa: the mask must broadcast to (B, H, L, S)");
    kind = m.dtype() == mx::bool_ ? 1 : 2;
    if (kind == 2 && m.dtype() != mx::float32) m = mx::astype(m, mx::float32, stream);
    inputs.push_back(m);
  }
  const mx::Shape shape = flat ? mx::Shape{q.shape(0), q.shape(2), q.shape(1) * v.shape(3)}
                               : mx::Shape{q.shape(0), q.shape(1), q.shape(2), v.shape(3)};
  return mx::array(shape, mx::float32, std::make_shared<SDPA>(stream, scale, causal, kind, flat, keys < 0 ? -1 : keys),
                   inputs);
}

void SDPA::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  mx::array& out = outputs[0];
  auto& enc = begin_eval(stream(), inputs, out);
  enc.dispatch([inputs, out, scale = scale_, causal = causal_, kind = kind_, flat = flat_, keys = keys_]() mutable {
    const mx::array &q = inputs[0], &k = inputs[1], &v = inputs[2];
    const View4 qv(q), kv(k), vv(v);
    const int64_t B = q.shape(0), H = q.shape(1), L = q.shape(2), S = keys >= 0 ? keys : k.shape(2);
    const int64_t r = H / k.shape(1), Dv = v.shape(3);
    const uint8_t* mbase = kind ? static_cast<const uint8_t*>(inputs[3].data<void>()) : nullptr;
    const int64_t esize = kind == 1 ? 1 : 4;
    float* y = out.data<float>();
    const int64_t ob = H * L * Dv, oh = flat ? Dv : L * Dv, ol = flat ? H * Dv : Dv;  // (B, L, H, Dv) when flat
    if ((L >= kFlashRows || S >= kFlashKeys || B > 1) && flash_fits(q.shape(3), Dv)) {
      FlashArgs fa{qv.fat(0, 0, 0), kv.p, vv.p, y, qv.s0, qv.s1, qv.s2, kv.s0, kv.s1, kv.s2, vv.s0, vv.s1, vv.s2,
                   mbase, 0, 0, 0, 0, esize, kind, B, H, k.shape(1), r, L, S, q.shape(3), Dv, scale * kLog2e,
                   causal, kv.half};
      if (kind) {
        const auto st = mask_strides(inputs[3]);
        fa.mb = st[0], fa.mh = st[1], fa.ml = st[2], fa.ms = st[3];
      }
      fa.ob = ob, fa.oh = oh, fa.ol = ol;
      flash_attention(fa);
      return;
    }
    const auto attend = active_isa().attend;
    parallel_for(B * H * L, [&](int64_t task) {
      thread_local std::vector<float> scores;  // S scores, then a widened fp16 row (vec_kernels.h attend)
      scores.resize(static_cast<size_t>(S + std::max<int64_t>(q.shape(3), Dv)));
      const int64_t b = task / (H * L), h = (task / L) % H, l = task % L;
      AttendRow row{qv.fat(b, h, l), kv.at(b, h / r, 0), kv.s2, vv.at(b, h / r, 0), vv.s2,
              causal ? S - L + l : S - 1, q.shape(3), Dv, scale * kLog2e, nullptr, kind, 0, kv.half};
      if (kind) {
        const auto st = mask_strides(inputs[3]);
        row.mask = mbase + (b * st[0] + h * st[1] + l * st[2]) * esize;
        row.ms = st[3];
      }
      attend(row, scores.data(), y + b * ob + h * oh + l * ol);
    });
  });
}

void SDPA::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GKSDPA runs on the CPU device only");
}

bool SDPA::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const SDPA&>(other);
  return scale_ == o.scale_ && causal_ == o.causal_ && kind_ == o.kind_ && flat_ == o.flat_ && keys_ == o.keys_;
}

}  // namespace gk
