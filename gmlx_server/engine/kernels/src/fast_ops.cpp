#include "fast_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "encode.h"
#include "rows.h"
#include "strided.h"

namespace gk {

namespace {

void require_f32(const mx::array& x, const char* op) {
  if (x.dtype() != mx::float32) throw std::invalid_argument(std::string(op) + ": float32 input only");
}

}  // namespace

mx::array rope_offsets(const std::variant<int, mx::array>& offset, int batch, mx::Stream stream) {
  mx::array off = std::holds_alternative<int>(offset) ? mx::array(std::get<int>(offset), mx::int32)
                                                      : std::get<mx::array>(offset);
  if (off.size() != 1 && !(off.ndim() == 1 && off.shape(0) == batch))
    throw std::invalid_argument("rope: offset must be a scalar or one per batch row");
  return off.dtype() == mx::int32 ? off : mx::astype(off, mx::int32, stream);
}

mx::array rope_periods(int dims, std::optional<float> base, const std::optional<mx::array>& freqs, mx::Stream stream) {
  if (freqs) {
    if (freqs->ndim() != 1 || freqs->shape(0) != dims / 2) throw std::invalid_argument("rope: freqs must be (dims/2,)");
    return freqs->dtype() == mx::float32 ? *freqs : mx::astype(*freqs, mx::float32, stream);
  }
  std::vector<float> p(dims / 2);
  for (int i = 0; i < dims / 2; ++i) p[i] = static_cast<float>(std::pow(double(*base), 2.0 * i / dims));
  return mx::array(p.begin(), {dims / 2}, mx::float32);
}

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& w, float eps, mx::StreamOrDevice s) {
  require_f32(x, "rms_norm");
  if (x.ndim() < 1) throw std::invalid_argument("rms_norm: x must have at least one dimension");
  const auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {x};
  if (w) {
    if (w->ndim() != 1 || w->shape(0) != x.shape(-1))
      throw std::invalid_argument("rms_norm: weight must be 1-D with x's last dimension");
    inputs.push_back(w->dtype() == mx::float32 ? *w : mx::astype(*w, mx::float32, stream));
  }
  return mx::array(x.shape(), mx::float32, std::make_shared<RMSNorm>(stream, eps, w.has_value()), inputs);
}

void RMSNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  const mx::array& w = weighted_ ? inputs[1] : x;
  mx::array& out = outputs[0];
  auto& enc = begin_eval(stream(), inputs, out);
  enc.dispatch([x, w, out, eps = eps_, weighted = weighted_]() mutable {
    const int64_t d = x.shape(-1);
    const int64_t rows = d ? static_cast<int64_t>(x.size()) / d : 0;
    std::vector<float> xbuf, wbuf;
    const float* xs = row_major(x, xbuf);
    const float* ws = weighted ? row_major(w, wbuf) : nullptr;
    float* ys = out.data<float>();
    for (int64_t r = 0; r < rows; ++r) norm_row(xs + r * d, ws, eps, d, ys + r * d);
  });
}

mx::array norm_weight(const mx::array& w, int d, mx::Stream stream) {
  if (w.ndim() != 1 || w.shape(0) != d) throw std::invalid_argument("add_norm: weights must be 1-D with x's last dimension");
  return w.dtype() == mx::float32 ? w : mx::astype(w, mx::float32, stream);
}

void add_norm_rows(const float* x, const float* r, const float* w, const float* r_w, float eps, float r_eps,
                   int64_t rows, int64_t d, float* sum, float* y) {
  std::vector<float> normed(r_w ? d : 0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = x + i * d;
    const float* rr = r + i * d;
    if (r_w) {  // Gemma 3: the sublayer's output is normed before it joins the residual
      norm_row(rr, r_w, r_eps, d, normed.data());
      rr = normed.data();
    }
    float* sr = sum + i * d;
    for (int64_t j = 0; j < d; ++j) sr[j] = xr[j] + rr[j];
    norm_row(sr, w, eps, d, y + i * d);
  }
}

std::vector<mx::array> add_norm(const mx::array& x, const mx::array& r, const std::optional<mx::array>& r_w,
                                const mx::array& w, float eps, float r_eps, mx::StreamOrDevice s) {
  require_f32(x, "add_norm");
  require_f32(r, "add_norm");
  if (x.ndim() < 1 || x.shape() != r.shape()) throw std::invalid_argument("add_norm: x and r must have one shape");
  const auto stream = mx::to_stream(s);
  const int d = x.shape(-1);
  std::vector<mx::array> inputs = {x, r, norm_weight(w, d, stream)};
  if (r_w) inputs.push_back(norm_weight(*r_w, d, stream));
  return mx::array::make_arrays({x.shape(), x.shape()}, {mx::float32, mx::float32},
                                std::make_shared<AddNorm>(stream, eps, r_eps, r_w.has_value()), inputs);
}

void AddNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& enc = begin_eval(stream(), inputs, outputs);
  enc.dispatch([inputs, outputs, eps = eps_, r_eps = r_eps_, r_normed = r_normed_]() mutable {
    const mx::array& x = inputs[0];
    const int64_t d = x.shape(-1);
    const int64_t rows = d ? static_cast<int64_t>(x.size()) / d : 0;
    std::vector<float> xbuf, rbuf, wbuf, rwbuf;
    add_norm_rows(row_major(x, xbuf), row_major(inputs[1], rbuf), row_major(inputs[2], wbuf),
                  r_normed ? row_major(inputs[3], rwbuf) : nullptr, eps, r_eps, rows, d, outputs[0].data<float>(),
                  outputs[1].data<float>());
  });
}

mx::array argmax(const mx::array& x, mx::StreamOrDevice s) {
  require_f32(x, "argmax");
  if (x.ndim() < 1 || x.shape(-1) < 1) throw std::invalid_argument("argmax: x must have a non-empty last dimension");
  mx::Shape shape = x.shape();
  shape.pop_back();
  return mx::array(shape, mx::uint32, std::make_shared<ArgMax>(mx::to_stream(s)), {x});
}

namespace {

typedef float f4 __attribute__((vector_size(16)));
typedef int32_t i4 __attribute__((vector_size(16)));

// The first index of the row's largest value, or of its first NaN, as MLX's argmax finds it (a later value
// replaces the best only when greater, and a NaN replaces anything but a NaN).
uint32_t argmax_row(const float* x, int64_t n) {
  int64_t i = 0;
  float best = x[0];
  bool nan = false;
  if (n >= 8) {
    f4 m, u;
    std::memcpy(&m, x, sizeof m);
    i4 unordered = {0, 0, 0, 0};
    for (; i + 4 <= n; i += 4) {
      std::memcpy(&u, x + i, sizeof u);
      m = m > u ? m : u;
      unordered |= u != u;
    }
    nan = (unordered[0] | unordered[1] | unordered[2] | unordered[3]) != 0;
    best = std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
  }
  for (; i < n; ++i) {
    nan = nan || x[i] != x[i];
    best = x[i] > best ? x[i] : best;
  }
  int64_t j = 0;  // where it first is: four at a time, then within the four
  const f4 b4 = {best, best, best, best};
  for (f4 u; j + 4 <= n; j += 4) {
    std::memcpy(&u, x + j, sizeof u);
    const i4 hit = nan ? u != u : u == b4;
    if (hit[0] | hit[1] | hit[2] | hit[3]) break;
  }
  for (; j < n; ++j)
    if (nan ? x[j] != x[j] : x[j] == best) return static_cast<uint32_t>(j);
  return 0;
}

}  // namespace

void ArgMax::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  mx::array& out = outputs[0];
  auto& enc = begin_eval(stream(), inputs, out);
  enc.dispatch([x, out]() mutable {
    std::vector<float> xbuf;
    const float* xs = row_major(x, xbuf);
    const int64_t n = x.shape(-1), rows = static_cast<int64_t>(x.size()) / n;
    uint32_t* ys = out.data<uint32_t>();
    for (int64_t r = 0; r < rows; ++r) ys[r] = argmax_row(xs + r * n, n);
  });
}

void ArgMax::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GKArgMax runs on the CPU device only");
}

mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base, float scale,
               const std::variant<int, mx::array>& offset, const std::optional<mx::array>& freqs,
               mx::StreamOrDevice s) {
  require_f32(x, "rope");
  if (x.ndim() < 3) throw std::invalid_argument("rope: x must be (B, *, T, D)");
  if (dims <= 0 || dims % 2 || dims > x.shape(-1)) throw std::invalid_argument("rope: dims must be even, <= D");
  if (base.has_value() == freqs.has_value()) throw std::invalid_argument("rope: give exactly one of base, freqs");
  const auto stream = mx::to_stream(s);
  const mx::array off = rope_offsets(offset, x.shape(0), stream);
  const mx::array periods = rope_periods(dims, base, freqs, stream);
  return mx::array(x.shape(), mx::float32, std::make_shared<RoPE>(stream, dims, traditional, scale),
                   {x, off, periods});
}

void RoPE::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  // (B, N, T, D) strides taken as they are when x is 3-D or 4-D with unit feature stride; else a copy
  const mx::array& x = inputs[0];
  const mx::array& off = inputs[1];
  const mx::array& periods = inputs[2];
  mx::array& out = outputs[0];
  auto& enc = begin_eval(stream(), inputs, out);
  enc.dispatch([x, off, periods, out, dims = dims_, trad = traditional_, scale = scale_]() mutable {
    const int nd = x.ndim();
    const bool direct = nd <= 4 && x.strides().back() == 1;
    std::vector<float> xbuf, pbuf;
    std::vector<int32_t> obuf;
    const float* xs = direct ? x.data<float>() : row_major(x, xbuf);
    const int64_t B = x.shape(0), T = x.shape(-2), D = x.shape(-1);
    const int64_t N = static_cast<int64_t>(x.size()) / (B * T * D);
    const int64_t sb = direct ? x.strides()[0] : N * T * D, st = direct ? x.strides()[nd - 2] : D;
    const int64_t sn = nd == 3 ? 0 : (direct ? x.strides()[1] : T * D);
    const int32_t* offs = row_major(off, obuf);
    const float* per = row_major(periods, pbuf);
    float* ys = out.data<float>();
    const int half = dims / 2;
    std::vector<float> c(half), sn_(half);
    for (int64_t b = 0; b < B; ++b) {
      const int32_t o = offs[off.size() == 1 ? 0 : b];
      for (int64_t t = 0; t < T; ++t) {
        rope_angles(static_cast<float>(o + t) * scale, per, half, c.data(), sn_.data());
        for (int64_t n = 0; n < N; ++n)
          rope_row(xs + b * sb + n * sn + t * st, c.data(), sn_.data(), dims, trad, D, ys + ((b * N + n) * T + t) * D);
      }
    }
  });
}

void RMSNorm::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GKRMSNorm runs on the CPU device only");
}

void AddNorm::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GKAddNorm runs on the CPU device only");
}

void RoPE::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GKRoPE runs on the CPU device only");
}

bool RMSNorm::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const RMSNorm&>(other);
  return eps_ == o.eps_ && weighted_ == o.weighted_;
}

bool AddNorm::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const AddNorm&>(other);
  return eps_ == o.eps_ && r_eps_ == o.r_eps_ && r_normed_ == o.r_normed_;
}

bool RoPE::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const RoPE&>(other);
  return dims_ == o.dims_ && traditional_ == o.traditional_ && scale_ == o.scale_;
}

}  // namespace gk
