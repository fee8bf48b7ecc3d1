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
// W (..., row_bytes) uint8 GGUF blocks -> (..., k) float32
mx::array gguf_dequantize(const mx::array& w, int type, int k, mx::StreamOrDevice s = {});

class GGUFMatmul : public mx::Primitive {
 public:
  GGUFMatmul(mx::Stream stream, int type, int k, bool biased, int gate, bool with_up)
      : mx::Primitive(stream), type_(type), k_(k), biased_(biased), gate_(gate), with_up_(with_up) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GGUFMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int type_, k_;
  bool biased_;  // inputs: x, w, then the bias
  int gate_;     // -1, or the kind x (and up, the last input) are gated with first
  bool with_up_;
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
