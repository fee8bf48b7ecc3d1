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

mx::array gguf_matmul(const mx::array& x, const mx::array& w, int type, int k, const std::optional<mx::array>& bias,
                      int gate, const std::optional<mx::array>& up, mx::StreamOrDevice s) {
  check_rows(w, type, k, "gguf_matmul");
  if (w.ndim() != 2) throw std::invalid_argument("gguf_matmul: weights must be 2-D (n, row_bytes)");
  check_gate(x, k, gate, up);
  if (gate < 0 && (x.ndim() < 1 || x.shape(-1) != k))
    throw std::invalid_argument("gguf_matmul: x's last dimension must be k");
  if (!mx::issubdtype(x.dtype(), mx::floating)) throw std::invalid_argument("gguf_matmul: x must be floating");
  if (bias && (x.dtype() != mx::float32 || bias->dtype() != mx::float32 || bias->ndim() != 1 ||
               bias->shape(0) != w.shape(0)))
    throw std::invalid_argument("gguf_matmul: a bias must be float32 (n,), for float32 x");
  const auto stream = mx::to_stream(s);
  const mx::array xf = x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, stream);
  mx::Shape shape = x.shape();
  shape.back() = w.shape(0);
  std::vector<mx::array> inputs = {xf, w};
  if (bias) inputs.push_back(*bias);
  if (up) inputs.push_back(*up);
  const auto prim = std::make_shared<GGUFMatmul>(stream, type, k, bias.has_value(), gate, up.has_value());
  mx::array out(shape, mx::float32, prim, inputs);
  return x.dtype() == mx::float32 ? out : mx::astype(out, x.dtype(), stream);
}

mx::array gguf_dequantize(const mx::array& w, int type, int k, mx::StreamOrDevice s) {
  check_rows(w, type, k, "gguf_dequantize");
  mx::Shape shape = w.shape();
  shape.back() = k;
  return mx::array(shape, mx::float32, std::make_shared<GGUFDequantize>(mx::to_stream(s), type, k), {w});
}

void GGUFMatmul::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  const mx::array& w = inputs[1];
  mx::array& out = outputs[0];
  auto& enc = begin_eval(stream(), inputs, out);
  const std::optional<mx::array> bias = biased_ ? std::optional<mx::array>(inputs[2]) : std::nullopt;
  const std::optional<mx::array> up = with_up_ ? std::optional<mx::array>(inputs.back()) : std::nullopt;
  enc.dispatch([x, w, bias, up, out, type = type_, k = k_, gate = gate_]() mutable {
    std::vector<float> xs, bs;
    std::vector<uint8_t> ws;
    const int64_t m = static_cast<int64_t>(x.size()) / (gate >= 0 && !up ? 2 * k : k), n = w.shape(0);
    float* y = out.data<float>();
    const float* rows = nullptr;
    if (gate >= 0) {  // the gated rows, as GKGated computes them, in a buffer of this op's own
      xs.resize(static_cast<size_t>(m * k));
      gate_rows(x, up ? &*up : nullptr, gate, !up, k, xs.data());
      rows = xs.data();
    } else {
      rows = row_major(x, xs);
    }
    matmul(type, row_major(w, ws), n, k, rows, m, y);
    if (!bias) return;
    const float* b = row_major(*bias, bs);
    for (int64_t i = 0; i < m; ++i)  // as MLX's add would: one float32 sum per element
      for (int64_t j = 0; j < n; ++j) y[i * n + j] += b[j];
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
  return type_ == o.type_ && k_ == o.k_ && biased_ == o.biased_ && gate_ == o.gate_ && with_up_ == o.with_up_;
}

bool GGUFDequantize::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const GGUFDequantize&>(other);
  return type_ == o.type_ && k_ == o.k_;
}

std::vector<mx::Shape> GGUFMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[1].shape(0);
  return {shape};
}

std::vector<mx::Shape> GGUFDequantize::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = k_;
  return {shape};
}

}  // namespace gk
