// GKHeads: an attention layer's q, k and v heads from its projections in one primitive (fast_ops.h). A decode
// step dispatched about fourteen ops per layer for this (each a slice, reshape, transpose, norm, RoPE or cast),
// and on the CPU backend every op's dispatch costs about as much as its work.
#include <stdexcept>
#include <vector>

#include "encode.h"
#include "fast_ops.h"
#include "mlx/types/half_types.h"
#include "rows.h"
#include "strided.h"

namespace gk {

std::vector<mx::array> heads(const std::vector<mx::array>& src, const std::vector<int>& cols, const HeadsSpec& spec,
                             const std::optional<mx::array>& q_norm, const std::optional<mx::array>& k_norm,
                             std::optional<float> base, const std::variant<int, mx::array>& offset,
                             const std::optional<mx::array>& freqs, bool half_kv, mx::StreamOrDevice s) {
  if (src.size() != 3 || cols.size() != 3) throw std::invalid_argument("heads: three sources and three columns");
  const int D = spec.head_dim, widths[3] = {spec.heads * D, spec.kv_heads * D, spec.kv_heads * D};
  if (spec.heads <= 0 || spec.kv_heads <= 0 || D <= 0) throw std::invalid_argument("heads: positive head counts");
  for (int i = 0; i < 3; ++i) {
    const mx::array& a = src[i];
    if (a.dtype() != mx::float32 || a.ndim() != 3 || a.shape(0) != src[0].shape(0) || a.shape(1) != src[0].shape(1))
      throw std::invalid_argument("heads: float32 (B, L, W) sources of one B and L");
    if (cols[i] < 0 || cols[i] + widths[i] > a.shape(2)) throw std::invalid_argument("heads: a part past its source");
  }
  if (spec.dims <= 0 || spec.dims % 2 || spec.dims > D) throw std::invalid_argument("heads: dims must be even, <= D");
  if (base.has_value() == freqs.has_value()) throw std::invalid_argument("heads: give exactly one of base, freqs");
  if (q_norm.has_value() != k_norm.has_value()) throw std::invalid_argument("heads: both norms or neither");
  const auto stream = mx::to_stream(s);
  const int B = src[0].shape(0), L = src[0].shape(1);
  std::vector<mx::array> inputs = {src[0], src[1], src[2], rope_offsets(offset, B, stream),
                                   rope_periods(spec.dims, base, freqs, stream)};
  for (const auto* w : {&q_norm, &k_norm}) {
    if (!w->has_value()) continue;
    if ((*w)->ndim() != 1 || (*w)->shape(0) != D) throw std::invalid_argument("heads: norm weights must be (D,)");
    inputs.push_back((*w)->dtype() == mx::float32 ? **w : mx::astype(**w, mx::float32, stream));
  }
  const mx::Dtype kv = half_kv ? mx::float16 : mx::float32;
  const mx::Shape kv_shape = {B, spec.kv_heads, L, D};
  return mx::array::make_arrays({{B, spec.heads, L, D}, kv_shape, kv_shape}, {mx::float32, kv, kv},
                                std::make_shared<Heads>(stream, spec, cols, q_norm.has_value()), inputs);
}

namespace {

// One head's row into `out` (float or float16): normed, rotated, or copied, in that order where asked.
template <typename T>
void head_row(const float* in, const float* w, const HeadsSpec& sp, const float* c, const float* s, bool rotate,
              float* tmp, T* out) {
  const int D = sp.head_dim;
  if (w != nullptr) {
    norm_row(in, w, sp.eps, D, tmp + D);
    in = tmp + D;
  }
  if (rotate) {
    rope_row(in, c, s, sp.dims, sp.traditional, D, tmp);
    in = tmp;
  }
  for (int d = 0; d < D; ++d) out[d] = static_cast<T>(in[d]);
}

}  // namespace

void Heads::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& enc = begin_eval(stream(), inputs, outputs);
  enc.dispatch([inputs, outputs, sp = spec_, cols = cols_, normed = normed_]() mutable {
    std::vector<float> bufs[3], pbuf, wq, wk;
    std::vector<int32_t> obuf;
    const float* srcs[3];
    for (int i = 0; i < 3; ++i) srcs[i] = row_major(inputs[i], bufs[i]);
    const int32_t* offs = row_major(inputs[3], obuf);
    const float* per = row_major(inputs[4], pbuf);
    const float* qn = normed ? row_major(inputs[5], wq) : nullptr;
    const float* kn = normed ? row_major(inputs[6], wk) : nullptr;
    const int64_t B = outputs[0].shape(0), L = outputs[0].shape(2), D = sp.head_dim;
    const int half = sp.dims / 2;
    std::vector<float> c(half), s(half), tmp(2 * D);
    float* q = outputs[0].data<float>();
    const bool f16 = outputs[1].dtype() == mx::float16;
    for (int64_t b = 0; b < B; ++b) {
      const int32_t o = offs[inputs[3].size() == 1 ? 0 : b];
      for (int64_t t = 0; t < L; ++t) {
        rope_angles(static_cast<float>(o + t) * sp.scale, per, half, c.data(), s.data());
        const float* row[3];
        for (int i = 0; i < 3; ++i) row[i] = srcs[i] + (b * L + t) * inputs[i].shape(2) + cols[i];
        for (int h = 0; h < sp.heads; ++h)
          head_row(row[0] + h * D, qn, sp, c.data(), s.data(), true, tmp.data(), q + ((b * sp.heads + h) * L + t) * D);
        for (int h = 0; h < sp.kv_heads; ++h) {
          const int64_t at = ((b * sp.kv_heads + h) * L + t) * D;
          for (int part = 1; part < 3; ++part) {
            const float* w = part == 1 ? kn : nullptr;
            if (f16)
              head_row(row[part] + h * D, w, sp, c.data(), s.data(), part == 1, tmp.data(),
                       outputs[part].data<mx::float16_t>() + at);
            else
              head_row(row[part] + h * D, w, sp, c.data(), s.data(), part == 1, tmp.data(),
                       outputs[part].data<float>() + at);
          }
        }
      }
    }
  });
}

void Heads::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GKHeads runs on the CPU device only");
}

bool Heads::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Heads&>(other);
  return spec_.heads == o.spec_.heads && spec_.kv_heads == o.spec_.kv_heads && spec_.head_dim == o.spec_.head_dim &&
         spec_.eps == o.spec_.eps && spec_.dims == o.spec_.dims && spec_.traditional == o.spec_.traditional &&
         spec_.scale == o.spec_.scale && cols_ == o.cols_ && normed_ == o.normed_;
}

}  // namespace gk
