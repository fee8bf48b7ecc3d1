// RMSNorm and RoPE as single CPU primitives. On MLX's CPU backend mx.fast.rms_norm and mx.fast.rope expand
// into 10-20 graph ops each, and a decode step pays ~20 us of dispatch per op: these replace them there.
#pragma once

#include <optional>
#include <vector>
#include <variant>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace gk {

namespace mx = mlx::core;

// x * rsqrt(mean(x^2, -1) + eps) * w, for float32 x (..., d) and w (d,) or none.
mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& w, float eps, mx::StreamOrDevice s = {});

// A decoder layer's residual add and the norm after it: (x + r, rms_norm(x + r) * w), r first normed by r_w
// (with r_eps) when given, as Gemma 3's sandwich norms do; float32 x and r of one shape, w and r_w (d,).
std::vector<mx::array> add_norm(const mx::array& x, const mx::array& r, const std::optional<mx::array>& r_w,
                                const mx::array& w, float eps, float r_eps, mx::StreamOrDevice s = {});

// add_norm's rows, for GKAddNorm and a matmul's epilogue (GGUFMatmul): sum = x + r (r first normed by r_w
// with r_eps when r_w is given), y = rms_norm(sum) * w; `rows` rows of d floats each. sum may be r itself.
void add_norm_rows(const float* x, const float* r, const float* w, const float* r_w, float eps, float r_eps,
                   int64_t rows, int64_t d, float* sum, float* y);
// A norm weight as float32 (d,); invalid_argument when it is not 1-D of d.
mx::array norm_weight(const mx::array& w, int d, mx::Stream stream);

// mx.argmax(x, axis=-1) for float32 x (..., n): the first index of each row's largest value, or of its first NaN
// (as MLX's own), as uint32. Two vector passes (the maximum, then where it first is) instead of a scalar loop.
mx::array argmax(const mx::array& x, mx::StreamOrDevice s = {});

// mx.fast.rope's contract for float32 x (B, *, T, D): offset an int or an int32 array of () or (B,);
// inverse frequencies base^(-2i/dims), or 1/freqs when freqs is given.
mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base, float scale,
               const std::variant<int, mx::array>& offset, const std::optional<mx::array>& freqs,
               mx::StreamOrDevice s = {});

// rope's offset as int32 () or (batch,), and its periods base^(2i/dims) (or freqs) as float32 (dims/2,)
mx::array rope_offsets(const std::variant<int, mx::array>& offset, int batch, mx::Stream stream);
mx::array rope_periods(int dims, std::optional<float> base, const std::optional<mx::array>& freqs, mx::Stream stream);

// An attention layer's q, k and v heads out of its projections' outputs in one primitive: the work of three
// slices, reshapes and transposes, the q/k norms, two RoPEs and the KV cache's cast. `src` holds q's, k's and
// v's source (B, L, W) float32 arrays (one fused output may be all three) and `cols` where each part starts in
// its source. Returns q (B, H, L, D) float32 and k, v (B, Hk, L, D) in kv_dtype (float32 or float16). The KV
// append is a SliceUpdate per buffer (kv_append.py): a multi-output primitive's inputs are never donated.
struct HeadsSpec {
  int heads, kv_heads, head_dim;
  float eps;  // the q/k norms' (when given)
  int dims;  // RoPE's rotated width
  bool traditional;
  float scale;
};
std::vector<mx::array> heads(const std::vector<mx::array>& src, const std::vector<int>& cols, const HeadsSpec& spec,
                             const std::optional<mx::array>& q_norm, const std::optional<mx::array>& k_norm,
                             std::optional<float> base, const std::variant<int, mx::array>& offset,
                             const std::optional<mx::array>& freqs, bool half_kv, mx::StreamOrDevice s = {});

// heads() of one projection's output, computed in the same op (a fused q/k/v projection and its heads one node):
// x (B, L, k) float32 @ W^T (+ bias) for W (n, row_bytes) GGUF blocks of `type`, as gguf_matmul computes it.
struct HeadsProjection {
  int type = -1;  // -1: the op reads three sources
  int k = 0;
  bool biased = false;
};
std::vector<mx::array> heads_of(const mx::array& x, const mx::array& w, int type, int k,
                                const std::optional<mx::array>& bias, const std::vector<int>& cols,
                                const HeadsSpec& spec, const std::optional<mx::array>& q_norm,
                                const std::optional<mx::array>& k_norm, std::optional<float> base,
                                const std::variant<int, mx::array>& offset, const std::optional<mx::array>& freqs,
                                bool half_kv, mx::StreamOrDevice s = {});

class Heads : public mx::Primitive {
 public:
  // inputs: the three sources (or x, w and the bias of a projection), offsets, periods, then the q and k norm
  // weights when normed
  Heads(mx::Stream stream, const HeadsSpec& spec, std::vector<int> cols, bool normed, HeadsProjection proj = {})
      : mx::Primitive(stream), spec_(spec), cols_(std::move(cols)), normed_(normed), proj_(proj) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GKHeads"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  HeadsSpec spec_;
  std::vector<int> cols_;
  bool normed_;
  HeadsProjection proj_;
};

// softmax(scale * q k^T + mask) v: q (B, H, L, D) float32, k (B, Hk, S, D) and v (B, Hk, S, Dv) both float32
// or both float16 (a float16 KV cache, read as it is stored); the output float32; mask (bool, or additive
// float) broadcastable to (B, H, L, S); causal: the L queries are the last L of the S positions. Query heads
// share KV heads in groups of H / Hk. flat: the output is (B, L, H * Dv), the heads side by side per position (what
// the output projection reads), not (B, H, L, Dv). keys >= 0: S is the first `keys` rows of k and v (a KV
// cache's buffers read in place, no slice op).
mx::array sdpa(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
               const std::optional<mx::array>& mask, bool causal, bool flat = false, int keys = -1,
               mx::StreamOrDevice s = {});

// act(gate) * up, or act(gate) without up: kind 0 SiLU, 1 GELU's tanh form; float32, one shape. halves: gate
// holds each row's gate then its up (a fused gate/up projection's output), and the result is half as wide.
mx::array gated(const mx::array& gate, const std::optional<mx::array>& up, int kind, bool halves = false,
                mx::StreamOrDevice s = {});
// act(gate) * up row by row into y (rows of `cols` floats), gate and up read in place where their layout allows;
// halves: gate's rows hold their gate, then their up (up absent). Gated's evaluation, and a gated matmul's input.
void gate_rows(const mx::array& gate, const mx::array* up, int kind, bool halves, int64_t cols, float* y);

class Gated : public mx::Primitive {
 public:
  Gated(mx::Stream stream, int kind, bool with_up, bool halves)
      : mx::Primitive(stream), kind_(kind), with_up_(with_up), halves_(halves) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GKGated"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    if (halves_) shape.back() /= 2;
    return {shape};
  }

 private:
  int kind_;
  bool with_up_, halves_;
};

class SDPA : public mx::Primitive {
 public:
  SDPA(mx::Stream stream, float scale, bool causal, int kind, bool flat, int keys)
      : mx::Primitive(stream), scale_(scale), causal_(causal), kind_(kind), flat_(flat), keys_(keys) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GKSDPA"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto &q = inputs[0], &v = inputs[2];
    if (flat_) return {{q.shape(0), q.shape(2), q.shape(1) * v.shape(3)}};
    return {{q.shape(0), q.shape(1), q.shape(2), v.shape(3)}};
  }

 private:
  float scale_;
  bool causal_;
  int kind_;  // 0 no mask, 1 bool, 2 additive float
  bool flat_;
  int keys_;  // the keys read: the first keys_ rows of k and v (a KV cache's buffers), or all of them (-1)
};

class RMSNorm : public mx::Primitive {
 public:
  RMSNorm(mx::Stream stream, float eps, bool weighted) : mx::Primitive(stream), eps_(eps), weighted_(weighted) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GKRMSNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  float eps_;
  bool weighted_;
};

class AddNorm : public mx::Primitive {
 public:
  // inputs: x, r, w, then r_w when r is normed first
  AddNorm(mx::Stream stream, float eps, float r_eps, bool r_normed)
      : mx::Primitive(stream), eps_(eps), r_eps_(r_eps), r_normed_(r_normed) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GKAddNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape(), inputs[0].shape()};
  }

 private:
  float eps_, r_eps_;
  bool r_normed_;
};

class ArgMax : public mx::Primitive {
 public:
  explicit ArgMax(mx::Stream stream) : mx::Primitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GKArgMax"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.pop_back();
    return {shape};
  }
};

class RoPE : public mx::Primitive {
 public:
  RoPE(mx::Stream stream, int dims, bool traditional, float scale)
      : mx::Primitive(stream), dims_(dims), traditional_(traditional), scale_(scale) {}
  // inputs: x, offsets (int32, () or (B,)), inverse frequencies (float32, dims / 2)
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GKRoPE"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  int dims_;
  bool traditional_;
  float scale_;
};

}  // namespace gk
