// act(gate) * up (or act(x) alone) in one threaded, vectorized pass: SiLU (SwiGLU's gate) or GELU's tanh form
// (Gemma's). MLX's CPU backend runs these elementwise graphs on one thread with a scalar exp, ~15 ns an
// element: on a 512-token prefill that was a sixth of SmolLM2's time. The span kernel is vec_kernels.h's
// gate_span, from the chosen Isa table.
#include <stdexcept>
#include <vector>

#include "encode.h"
#include "fast_ops.h"
#include "kernels.h"
#include "strided.h"

namespace gk {

namespace {

constexpr int64_t kChunk = 16384;  // elements per pool task

// A's rows (its last dimension) `stride` floats apart in place when its layout allows, else a row-major copy.
const float* rows_of(const mx::array& a, std::vector<float>& scratch, int64_t& stride) {
  const int nd = a.ndim();
  bool uniform = nd >= 2 && a.strides()[nd - 1] == 1;
  for (int d = 0; uniform && d + 2 < nd; ++d)
    uniform = a.shape(d) == 1 || static_cast<int64_t>(a.strides()[d]) == a.strides()[d + 1] * a.shape(d + 1);
  if (uniform) {
    stride = a.strides()[nd - 2];
    return a.data<float>();
  }
  stride = nd ? a.shape(-1) : 1;
  return row_major(a, scratch);
}

}  // namespace

mx::array gated(const mx::array& gate, const std::optional<mx::array>& up, int kind, bool halves, mx::StreamOrDevice s) {
  if (gate.dtype() != mx::float32 || (up && up->dtype() != mx::float32))
    throw std::invalid_argument("gated: float32 inputs only");
  if (up && up->shape() != gate.shape()) throw std::invalid_argument("gated: gate and up must have one shape");
  if (kind != 0 && kind != 1) throw std::invalid_argument("gated: kind 0 (silu) or 1 (gelu, tanh form)");
  if (halves && (up || gate.ndim() < 1 || gate.shape(-1) % 2))
    throw std::invalid_argument("gated: halves takes one input with an even last dimension");
  const auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {gate};
  if (up) inputs.push_back(*up);
  mx::Shape shape = gate.shape();
  if (halves) shape.back() /= 2;
  return mx::array(shape, mx::float32, std::make_shared<Gated>(stream, kind, up.has_value(), halves), inputs);
}

void gate_rows(const mx::array& gate, const mx::array* up, int kind, bool halves, int64_t cols, float* y) {
  // rows of the last dimension: a fused projection's gate and up are column slices of one output
  const int64_t rows = cols ? static_cast<int64_t>(gate.size()) / (halves ? 2 * cols : cols) : 0;
  std::vector<float> gbuf, ubuf;
  int64_t gs = cols, us = cols;
  const float* g = rows_of(gate, gbuf, gs);
  const float* u = up != nullptr ? rows_of(*up, ubuf, us) : nullptr;
  if (halves) u = g + cols, us = gs;  // a fused gate/up output: each row's gate, then its up
  const int64_t per = cols >= kChunk ? 1 : kChunk / cols;
  const auto gate_span = active_isa().gate_span;
  parallel_for((rows + per - 1) / per, [&](int64_t t) {
    for (int64_t r = t * per; r < rows && r < (t + 1) * per; ++r)
      gate_span(kind, g + r * gs, u != nullptr ? u + r * us : nullptr, y + r * cols, cols);
  });
}

void Gated::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  mx::array& out = outputs[0];
  auto& enc = begin_eval(stream(), inputs, out);
  enc.dispatch([inputs, out, kind = kind_, with_up = with_up_, halves = halves_]() mutable {
    const int64_t cols = out.ndim() ? out.shape(-1) : 1;
    gate_rows(inputs[0], with_up ? &inputs[1] : nullptr, kind, halves, cols, out.data<float>());
  });
}

void Gated::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("GKGated runs on the CPU device only");
}

bool Gated::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Gated&>(other);
  return kind_ == o.kind_ && with_up_ == o.with_up_ && halves_ == o.halves_;
}

}  // namespace gk
