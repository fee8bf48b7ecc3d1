#include "primitive.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "encode.h"
#include "fast_ops.h"
#include "kernels.h"
#include "strided.h"

namespace gk {

namespace {

void check_rows(const mx::array& w, int type, int k, const char* op) {
  const int64_t rb = row_bytes(type, k);
  if (rb <= 0) throw std::invalid_argument(std::string(op) + ": no kernel for ggml type " + std::to_string(type) +
                                           " with rows of " + std::to_string(k));
  if (w.dtype() != mx::uint8 || w.ndim() < 1 || w.shape(-1) != rb)
    throw std::invalid_argument(std::string(op) + ": weights must be uint8 rows of " + std::to_string(rb) + " bytes");
}

void check_gate(const mx::array& x, int k, int gate, const std::optional<mx::array>& up) {
  if (gate < -1 || gate > 1) throw std::invalid_argument("gguf_matmul: gate -1 (none), 0 (silu) or 1 (gelu, tanh form)");
  if (gate < 0) {
    if (up) throw std::invalid_argument("gguf_matmul: up is read only with a gate");
    return;
  }
  if (x.dtype() != mx::float32 || (up && up->dtype() != mx::float32))
    throw std::invalid_argument("gguf_matmul: a gate takes float32 x and up");
  if (x.ndim() < 1 || x.shape(-1) != (up ? k : 2 * k) || (up && up->shape() != x.shape()))
    throw std::invalid_argument("gguf_matmul: a gate takes x (..., k) and up of x's shape, or x (..., 2k) alone");
}

}  // namespace

std::vector<mx::array> matmul_inputs(const mx::array& x, const mx::array& w, int type, int k,
                                     const std::optional<mx::array>& bias, int gate, const std::optional<mx::array>& up,
                                     mx::Stream stream, mx::Shape& shape) {
  check_rows(w, type, k, "gguf_matmul");
  if (w.ndim() != 2) throw std::invalid_argument("gguf_matmul: weights must be 2-D (n, row_bytes)");
  check_gate(x, k, gate, up);
  if (gate < 0 && (x.ndim() < 1 || x.shape(-1) != k))
    throw std::invalid_argument("gguf_matmul: x's last dimension must be k");
  if (!mx::issubdtype(x.dtype(), mx::floating)) throw std::invalid_argument("gguf_matmul: x must be floating");
  if (bias && (x.dtype() != mx::float32 || bias->dtype() != mx::float32 || bias->ndim() != 1 ||
               bias->shape(0) != w.shape(0)))
    throw std::invalid_argument("gguf_matmul: a bias must be float32 (n,), for float32 x");
  shape = x.shape();
  shape.back() = w.shape(0);
  std::vector<mx::array> inputs = {x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, stream), w};
  if (bias) inputs.push_back(*bias);
  if (up) inputs.push_back(*up);
  return inputs;
}

mx::array gguf_matmul(const mx::array& x, const mx::array& w, int type, int k, const std::optional<mx::array>& bias,
                      int gate, const std::optional<mx::array>& up, mx::StreamOrDevice s) {
  const auto stream = mx::to_stream(s);
  mx::Shape shape;
  auto inputs = matmul_inputs(x, w, type, k, bias, gate, up, stream, shape);
  const auto prim = std::make_shared<GGUFMatmul>(stream, type, k, bias.has_value(), gate, up.has_value());
  mx::array out(shape, mx::float32, prim, inputs);
  return x.dtype() == mx::float32 ? out : mx::astype(out, x.dtype(), stream);
}

std::vector<mx::array> gguf_matmul_add_norm(const mx::array& x, const mx::array& w, int type, int k,
                                            const mx::array& residual, const mx::array& weight, float eps,
                                            const std::optional<mx::array>& r_weight, float r_eps,
                                            const std::optional<mx::array>& bias, int gate,
                                            const std::optional<mx::array>& up, mx::StreamOrDevice s) {
  const auto stream = mx::to_stream(s);
  if (x.dtype() != mx::float32 || residual.dtype() != mx::float32)
    throw std::invalid_argument("gguf_matmul_add_norm: float32 x and residual only");
  mx::Shape shape;
  auto inputs = matmul_inputs(x, w, type, k, bias, gate, up, stream, shape);
  if (residual.shape() != shape)
    throw std::invalid_argument("gguf_matmul_add_norm: the residual must have the product's shape");
  const int n = shape.back();
  inputs.push_back(residual);
  inputs.push_back(norm_weight(weight, n, stream));
  if (r_weight) inputs.push_back(norm_weight(*r_weight, n, stream));
  const auto prim = std::make_shared<GGUFMatmul>(stream, type, k, bias.has_value(), gate, up.has_value(),
                                                 r_weight ? 1 : 0, eps, r_eps);
  return mx::array::make_arrays({shape, shape}, {mx::float32, mx::float32}, prim, inputs);
}

mx::array gguf_dequantize(const mx::array& w, int type, int k, mx::StreamOrDevice s) {
  check_rows(w, type, k, "gguf_dequantize");
  mx::Shape shape = w.shape();
  shape.back() = k;
  return mx::array(shape, mx::float32, std::make_shared<GGUFDequantize>(mx::to_stream(s), type, k), {w});
}

void gguf_product(const float* rows, int64_t m, const mx::array& w, int type, int k, const mx::array* bias, float* y) {
  std::vector<uint8_t> ws;
  std::vector<float> bs;
  const int64_t n = w.shape(0);
  matmul(type, row_major(w, ws), n, k, rows, m, y);
  if (!bias) return;
  const float* b = row_major(*bias, bs);
  for (int64_t i = 0; i < m; ++i)  // as MLX's add would: one float32 sum per element
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += b[j];
}

void GGUFMatmul::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& enc = begin_eval(stream(), inputs, outputs);
  enc.dispatch([inputs, outputs, type = type_, k = k_, biased = biased_, gate = gate_, with_up = with_up_,
                norm = norm_, eps = eps_, r_eps = r_eps_]() mutable {
    size_t next = 2;  // the optional inputs, in order
    const mx::array* bias = biased ? &inputs[next++] : nullptr;
    const mx::array* up = with_up ? &inputs[next++] : nullptr;
    const mx::array &x = inputs[0], &w = inputs[1];
    std::vector<float> xs;
    const int64_t m = static_cast<int64_t>(x.size()) / (gate >= 0 && !up ? 2 * k : k), n = w.shape(0);
    // the product; with an epilogue, into the sum's own output, which add_norm_rows then overwrites element by
    // element (each sum reads its product first): no buffer of its own on the decode path
    float* y = outputs[0].data<float>();
    const float* rows = nullptr;
    if (gate >= 0) {  // the gated rows, as GKGated computes them, in a buffer of this op's own
      xs.resize(static_cast<size_t>(m * k));
      gate_rows(x, up, gate, !up, k, xs.data());
      rows = xs.data();
    } else {
      rows = row_major(x, xs);
    }
    gguf_product(rows, m, w, type, k, bias, y);
    if (norm < 0) return;
    std::vector<float> rb, wb, rwb;  // then GKAddNorm's rows, the residual its x and the product its r
    add_norm_rows(row_major(inputs[next], rb), y, row_major(inputs[next + 1], wb),
                  norm == 1 ? row_major(inputs[next + 2], rwb) : nullptr, eps, r_eps, m, n, y, outputs[1].data<float>());
  });
}

void GGUFDequantize::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const mx::array& w = inputs[0];
  mx::array& out = outputs[0];
  auto& enc = begin_eval(stream(), inputs, out);
  enc.dispatch([w, out, type = type_, k = k_]() mutable {
    std::vector<uint8_t> ws;
    const int64_t rows = static_cast<int64_t>(out.size()) / k;
    dequantize(type, row_major(w, ws), rows, k, out.data<float>());
  });
}

void GGUFMatmul::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GGUFMatmul runs on the CPU device only");
}

void GGUFDequantize::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GGUFDequantize runs on the CPU device only");
}

bool GGUFMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const GGUFMatmul&>(other);
  return type_ == o.type_ && k_ == o.k_ && biased_ == o.biased_ && gate_ == o.gate_ && with_up_ == o.with_up_ &&
         norm_ == o.norm_ && eps_ == o.eps_ && r_eps_ == o.r_eps_;
}

bool GGUFDequantize::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const GGUFDequantize&>(other);
  return type_ == o.type_ && k_ == o.k_;
}

std::vector<mx::Shape> GGUFMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[1].shape(0);
  if (norm_ >= 0) return {shape, shape};
  return {shape};
}

std::vector<mx::Shape> GGUFDequantize::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = k_;
  return {shape};
}

}  // namespace gk
