// GKHeads: an attention layer's q, k and v heads from its projections in one primitive (fast_ops.h). A decode
// step dispatched about fourteen ops per layer for this (each a slice, reshape, transpose, norm, RoPE or cast),
// and on the CPU backend every op's dispatch costs about as much as its work.
#include <stdexcept>
#include <vector>

#include "encode.h"
#include "fast_ops.h"
#include "mlx/types/half_types.h"
#include "primitive.h"
#include "rows.h"
#include "strided.h"

namespace gk {

namespace {

// The spec's checks, and what the op reads after its sources: offsets, periods, then the q and k norm weights
std::vector<mx::array> spec_inputs(const HeadsSpec& spec, int B, const std::optional<mx::array>& q_norm,
                                   const std::optional<mx::array>& k_norm, std::optional<float> base,
                                   const std::variant<int, mx::array>& offset, const std::optional<mx::array>& freqs,
                                   mx::Stream stream) {
  const int D = spec.head_dim;
  if (spec.dims <= 0 || spec.dims % 2 || spec.dims > D) throw std::invalid_argument("heads: dims must be even, <= D");
  if (base.has_value() == freqs.has_value()) throw std::invalid_argument("heads: give exactly one of base, freqs");
  if (q_norm.has_value() != k_norm.has_value()) throw std::invalid_argument("heads: both norms or neither");
  std::vector<mx::array> inputs = {rope_offsets(offset, B, stream), rope_periods(spec.dims, base, freqs, stream)};
  for (const auto* w : {&q_norm, &k_norm}) {
    if (!w->has_value()) continue;
    if ((*w)->ndim() != 1 || (*w)->shape(0) != D) throw std::invalid_argument("heads: norm weights must be (D,)");
    inputs.push_back((*w)->dtype() == mx::float32 ? **w : mx::astype(**w, mx::float32, stream));
  }
  return inputs;
}

// Each part (q, k, v: heads * D, kv_heads * D, kv_heads * D columns from cols[i]) inside its source's width
void check_parts(const HeadsSpec& spec, const std::vector<int>& cols, const int (&source_widths)[3]) {
  if (spec.heads <= 0 || spec.kv_heads <= 0 || spec.head_dim <= 0)
    throw std::invalid_argument("heads: positive head counts");
  if (cols.size() != 3) throw std::invalid_argument("heads: three sources and three columns");
  const int D = spec.head_dim, widths[3] = {spec.heads * D, spec.kv_heads * D, spec.kv_heads * D};
  for (int i = 0; i < 3; ++i)
    if (cols[i] < 0 || cols[i] + widths[i] > source_widths[i])
      throw std::invalid_argument("heads: a part past its source");
}

std::vector<mx::array> make_heads(std::vector<mx::array> inputs, std::vector<mx::array> rest, int B, int L,
                                  const HeadsSpec& spec, const std::vector<int>& cols, bool normed, bool half_kv,
                                  const HeadsProjection& proj, mx::Stream stream) {
  inputs.insert(inputs.end(), rest.begin(), rest.end());
  const mx::Dtype kv = half_kv ? mx::float16 : mx::float32;
  const mx::Shape kv_shape = {B, spec.kv_heads, L, spec.head_dim};
  return mx::array::make_arrays({{B, spec.heads, L, spec.head_dim}, kv_shape, kv_shape}, {mx::float32, kv, kv},
                                std::make_shared<Heads>(stream, spec, cols, normed, proj), inputs);
}

}  // namespace

std::vector<mx::array> heads(const std::vector<mx::array>& src, const std::vector<int>& cols, const HeadsSpec& spec,
                             const std::optional<mx::array>& q_norm, const std::optional<mx::array>& k_norm,
                             std::optional<float> base, const std::variant<int, mx::array>& offset,
                             const std::optional<mx::array>& freqs, bool half_kv, mx::StreamOrDevice s) {
  if (src.size() != 3) throw std::invalid_argument("heads: three sources and three columns");
  for (const mx::array& a : src)
    if (a.dtype() != mx::float32 || a.ndim() != 3 || a.shape(0) != src[0].shape(0) || a.shape(1) != src[0].shape(1))
      throw std::invalid_argument("heads: float32 (B, L, W) sources of one B and L");
  check_parts(spec, cols, {src[0].shape(2), src[1].shape(2), src[2].shape(2)});
  const auto stream = mx::to_stream(s);
  const int B = src[0].shape(0), L = src[0].shape(1);
  return make_heads(src, spec_inputs(spec, B, q_norm, k_norm, base, offset, freqs, stream), B, L, spec, cols,
                    q_norm.has_value(), half_kv, {}, stream);
}

std::vector<mx::array> heads_of(const mx::array& x, const mx::array& w, int type, int k,
                                const std::optional<mx::array>& bias, const std::vector<int>& cols,
                                const HeadsSpec& spec, const std::optional<mx::array>& q_norm,
                                const std::optional<mx::array>& k_norm, std::optional<float> base,
                                const std::variant<int, mx::array>& offset, const std::optional<mx::array>& freqs,
                                bool half_kv, mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32 || x.ndim() != 3) throw std::invalid_argument("heads_of: float32 x (B, L, k) only");
  const auto stream = mx::to_stream(s);
  mx::Shape shape;
  auto inputs = matmul_inputs(x, w, type, k, bias, -1, std::nullopt, stream, shape);
  const int n = shape.back();
  check_parts(spec, cols, {n, n, n});
  const int B = x.shape(0), L = x.shape(1);
  return make_heads(inputs, spec_inputs(spec, B, q_norm, k_norm, base, offset, freqs, stream), B, L, spec, cols,
                    q_norm.has_value(), half_kv, {type, k, bias.has_value()}, stream);
}

namespace {

// x @ W^T (+ bias) for a projected Heads (inputs x, w, then the bias), into ys; xs: x's row-major copy if needed
const float* project(const std::vector<mx::array>& inputs, const HeadsProjection& proj, std::vector<float>& xs,
                     std::vector<float>& ys) {
  const int64_t m = static_cast<int64_t>(inputs[0].size()) / proj.k;
  ys.resize(static_cast<size_t>(m * inputs[1].shape(0)));
  gguf_product(row_major(inputs[0], xs), m, inputs[1], proj.type, proj.k, proj.biased ? &inputs[2] : nullptr,
               ys.data());
  return ys.data();
}

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
  enc.dispatch([inputs, outputs, sp = spec_, cols = cols_, normed = normed_, proj = proj_]() mutable {
    std::vector<float> bufs[3], pbuf, wq, wk;
    std::vector<int32_t> obuf;
    const float* srcs[3];
    int64_t widths[3];
    const size_t at = proj.type >= 0 ? 2 + proj.biased : 3;  // the offsets' input, after the sources
    if (proj.type >= 0) {  // one projection's output, computed here as GGUFMatmul computes it
      srcs[0] = srcs[1] = srcs[2] = project(inputs, proj, bufs[0], bufs[1]);
      widths[0] = widths[1] = widths[2] = inputs[1].shape(0);
    } else {
      for (int i = 0; i < 3; ++i) srcs[i] = row_major(inputs[i], bufs[i]), widths[i] = inputs[i].shape(2);
    }
    const mx::array& offsets = inputs[at];
    const int32_t* offs = row_major(offsets, obuf);
    const float* per = row_major(inputs[at + 1], pbuf);
    const float* qn = normed ? row_major(inputs[at + 2], wq) : nullptr;
    const float* kn = normed ? row_major(inputs[at + 3], wk) : nullptr;
    const int64_t B = outputs[0].shape(0), L = outputs[0].shape(2), D = sp.head_dim;
    const int half = sp.dims / 2;
    std::vector<float> c(half), s(half), tmp(2 * D);
    float* q = outputs[0].data<float>();
    const bool f16 = outputs[1].dtype() == mx::float16;
    for (int64_t b = 0; b < B; ++b) {
      const int32_t o = offs[offsets.size() == 1 ? 0 : b];
      for (int64_t t = 0; t < L; ++t) {
        rope_angles(static_cast<float>(o + t) * sp.scale, per, half, c.data(), s.data());
        const float* row[3];
        for (int i = 0; i < 3; ++i) row[i] = srcs[i] + (b * L + t) * widths[i] + cols[i];
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
         spec_.scale == o.spec_.scale && cols_ == o.cols_ && normed_ == o.normed_ && proj_.type == o.proj_.type &&
         proj_.k == o.proj_.k && proj_.biased == o.proj_.biased;
}

}  // namespace gk
