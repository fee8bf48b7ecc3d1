// MLX primitives over GGUF blocks: a matmul (x @ W^T) and a row dequantization, CPU device only.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace gk {

namespace mx = mlx::core;

// x (..., k) float @ W^T for W (n, row_bytes) uint8 GGUF blocks of `type` -> (..., n) in x's dtype; plus
// `bias` (n,) float32 when given, for float32 x (a projection's bias add without an op of its own).
// gate >= 0 (float32 x): the rows multiplied are act(x) * up (gated's kinds), or, without up, act(x's first
// half) * its second half (x (..., 2k), a fused gate/up output): an MLP's down projection and its gate as one op.
mx::array gguf_matmul(const mx::array& x, const mx::array& w, int type, int k,
                      const std::optional<mx::array>& bias = std::nullopt, int gate = -1,
                      const std::optional<mx::array>& up = std::nullopt, mx::StreamOrDevice s = {});
// gguf_matmul's product r (float32 x) joined to a residual as add_norm joins a sublayer's output, in the same
// op: (residual + r, rms_norm(residual + r) * weight), r first normed by r_weight (r_eps) when given.
std::vector<mx::array> gguf_matmul_add_norm(const mx::array& x, const mx::array& w, int type, int k,
                                            const mx::array& residual, const mx::array& weight, float eps,
                                            const std::optional<mx::array>& r_weight = std::nullopt, float r_eps = 0.0f,
                                            const std::optional<mx::array>& bias = std::nullopt, int gate = -1,
                                            const std::optional<mx::array>& up = std::nullopt,
                                            mx::StreamOrDevice s = {});
// gguf_matmul's checked inputs (x as float32, w, then the bias and up as given); shape: the product's
std::vector<mx::array> matmul_inputs(const mx::array& x, const mx::array& w, int type, int k,
                                     const std::optional<mx::array>& bias, int gate, const std::optional<mx::array>& up,
                                     mx::Stream stream, mx::Shape& shape);
// rows (m, k) float32 @ W^T (+ bias) into y (m, n): GGUFMatmul's product, and GKHeads' of a projection
void gguf_product(const float* rows, int64_t m, const mx::array& w, int type, int k, const mx::array* bias, float* y);
// W (..., row_bytes) uint8 GGUF blocks -> (..., k) float32
mx::array gguf_dequantize(const mx::array& w, int type, int k, mx::StreamOrDevice s = {});

class GGUFMatmul : public mx::Primitive {
 public:
  // norm: -1 none, 0 an add_norm epilogue, 1 one whose product is normed by r_weight first (eps, r_eps its norms')
  GGUFMatmul(mx::Stream stream, int type, int k, bool biased, int gate, bool with_up, int norm = -1, float eps = 0.0f,
             float r_eps = 0.0f)
      : mx::Primitive(stream), type_(type), k_(k), biased_(biased), gate_(gate), with_up_(with_up), norm_(norm),
        eps_(eps), r_eps_(r_eps) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GGUFMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int type_, k_;
  bool biased_;  // inputs: x, w, then the bias, up, and the epilogue's residual, weight and r_weight, as present
  int gate_;     // -1, or the kind x (and up) are gated with first
  bool with_up_;
  int norm_;  // outputs: the product, or with an epilogue (residual + product, its norm)
  float eps_, r_eps_;
};

class GGUFDequantize : public mx::Primitive {
 public:
  GGUFDequantize(mx::Stream stream, int type, int k) : mx::Primitive(stream), type_(type), k_(k) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GGUFDequantize"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int type_, k_;
};

}  // namespace gk
