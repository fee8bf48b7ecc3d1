// Python bindings (nanobind, in MLX's binding domain so mx.array converts both ways).
#include <algorithm>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "draw.h"
#include "fast_ops.h"
#include "kernels.h"
#include "primitive.h"
#include "repack.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Positions = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Values = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// gk::categorical_at over numpy arrays: the kept positions (ascending, in [0, n)) and their values
int64_t categorical_at(uint32_t k0, uint32_t k1, int64_t n, Positions idx, Values vals) {
  const int64_t m = static_cast<int64_t>(idx.shape(0));
  if (m == 0 || vals.shape(0) != idx.shape(0)) throw nb::value_error("categorical_at: one value per position, some");
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = idx.data()[j];
    if (i < 0 || i >= n || (j && i <= idx.data()[j - 1]))
      throw nb::index_error("categorical_at: positions must ascend within [0, n)");
  }
  return gk::categorical_at(k0, k1, n, idx.data(), vals.data(), m);
}

using Blocks = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
// K-quant rows (n, row_bytes) as a new uint8 array in their repacked layout (repack.h), made on the kernel
// threads into memory the array then owns (no second copy of the weights at load)
gk::mx::array repack(Blocks in, int64_t block, void (*fn)(const uint8_t*, uint8_t*, int64_t), const char* what) {
  const size_t rows = in.shape(0), cols = in.shape(1);
  if (cols == 0 || cols % block != 0) throw nb::value_error(what);
  auto* out = new uint8_t[rows * cols];
  {
    nb::gil_scoped_release unlocked;
    const int64_t blocks = static_cast<int64_t>(rows * cols) / block, per = 4096;
    gk::parallel_for((blocks + per - 1) / per, [&](int64_t t) {
      const int64_t b0 = t * per;
      fn(in.data() + b0 * block, out + b0 * block, std::min(per, blocks - b0));
    });
  }
  return gk::mx::array(out, {static_cast<int>(rows), static_cast<int>(cols)}, gk::mx::uint8,
                       [](void* p) { delete[] static_cast<uint8_t*>(p); });
}

gk::mx::array repack_q4k(Blocks in) {
  return repack(in, 144, gk::repack_q4k, "repack_q4k: rows must be whole 144-byte Q4_K blocks");
}

gk::mx::array repack_q5k(Blocks in) {
  return repack(in, 176, gk::repack_q5k, "repack_q5k: rows must be whole 176-byte Q5_K blocks");
}

gk::mx::array repack_q6k(Blocks in) {
  return repack(in, 210, gk::repack_q6k, "repack_q6k: rows must be whole 210-byte Q6_K blocks");
}

}  // namespace

#ifndef GK_MLX_VERSION
#define GK_MLX_VERSION "unknown"
#endif

NB_MODULE(_gguf_kernels, m) {
  m.doc() = "GGUF-native quantized matmul kernels for MLX's CPU device";
  m.attr("mlx_version") = GK_MLX_VERSION;  // the MLX this was compiled against
  m.attr("sdpa_float16") = true;           // sdpa reads float16 keys and values (a float16 KV cache)
  m.def("matmul", &gk::gguf_matmul, "x"_a, "w"_a, "type"_a, "k"_a, nb::kw_only(), "bias"_a = nb::none(),
        "gate"_a = -1, "up"_a = nb::none(), "stream"_a = nb::none(),
        "x (..., k) @ W^T (+ bias, float32 (n,) for float32 x) for W (n, row_bytes) uint8 GGUF blocks of ggml `type`; "
        "gate 0 (silu) or 1 (gelu, tanh form): the rows are act(x) * up, or act(x[..., :k]) * x[..., k:] without up");
  m.def("matmul_add_norm", &gk::gguf_matmul_add_norm, "x"_a, "w"_a, "type"_a, "k"_a, "residual"_a, "weight"_a,
        "eps"_a, nb::kw_only(), "r_weight"_a = nb::none(), "r_eps"_a = 0.0f, "bias"_a = nb::none(), "gate"_a = -1,
        "up"_a = nb::none(), "stream"_a = nb::none(),
        "matmul's product r joined to the residual as add_norm joins a sublayer's output, in one op (float32): "
        "(residual + r, rms_norm(residual + r) * weight), r first normed by r_weight when given");
  m.def("dequantize", &gk::gguf_dequantize, "w"_a, "type"_a, "k"_a, nb::kw_only(), "stream"_a = nb::none(),
        "uint8 GGUF block rows (..., row_bytes) -> (..., k) float32");
  m.def("rms_norm", &gk::rms_norm, "x"_a, "weight"_a.none(), "eps"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.rms_norm as one CPU primitive (float32)");
  m.def("add_norm", &gk::add_norm, "x"_a, "r"_a, "r_weight"_a.none(), "weight"_a, "eps"_a, "r_eps"_a = 0.0f,
        nb::kw_only(), "stream"_a = nb::none(),
        "(x + r, rms_norm(x + r) * weight) as one CPU primitive (float32); r_weight: r is rms-normed first");
  m.def("argmax", &gk::argmax, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.argmax(x, axis=-1) for float32 x as one CPU primitive (uint32)");
  m.def("rope", &gk::rope, "a"_a, "dims"_a, nb::kw_only(), "traditional"_a, "base"_a.none(), "scale"_a, "offset"_a,
        "freqs"_a = nb::none(), "stream"_a = nb::none(), "mx.fast.rope as one CPU primitive (float32)");
  m.def(
      "heads",
      [](const std::vector<gk::mx::array>& src, const std::vector<int>& cols, int heads, int kv_heads, int head_dim,
         int dims, bool traditional, std::optional<float> base, float scale,
         const std::variant<int, gk::mx::array>& offset, const std::optional<gk::mx::array>& freqs,
         const std::optional<gk::mx::array>& q_norm, const std::optional<gk::mx::array>& k_norm, float eps,
         bool half_kv, gk::mx::StreamOrDevice s) {
        return gk::heads(src, cols, {heads, kv_heads, head_dim, eps, dims, traditional, scale}, q_norm, k_norm, base,
                         offset, freqs, half_kv, s);
      },
      "src"_a, "cols"_a, "heads"_a, "kv_heads"_a, "head_dim"_a, nb::kw_only(), "dims"_a, "traditional"_a,
      "base"_a.none(), "scale"_a, "offset"_a, "freqs"_a = nb::none(), "q_norm"_a = nb::none(),
      "k_norm"_a = nb::none(), "eps"_a = 0.0f, "half_kv"_a = false, "stream"_a = nb::none(),
      "an attention layer's (q, k, v) heads from its projections' outputs: split, q/k norms, RoPE and the KV "
      "cast as one CPU primitive");
  m.def(
      "heads_of",
      [](const gk::mx::array& x, const gk::mx::array& w, int type, int k, const std::optional<gk::mx::array>& bias,
         const std::vector<int>& cols, int heads, int kv_heads, int head_dim, int dims, bool traditional,
         std::optional<float> base, float scale, const std::variant<int, gk::mx::array>& offset,
         const std::optional<gk::mx::array>& freqs, const std::optional<gk::mx::array>& q_norm,
         const std::optional<gk::mx::array>& k_norm, float eps, bool half_kv, gk::mx::StreamOrDevice s) {
        return gk::heads_of(x, w, type, k, bias, cols, {heads, kv_heads, head_dim, eps, dims, traditional, scale},
                            q_norm, k_norm, base, offset, freqs, half_kv, s);
      },
      "x"_a, "w"_a, "type"_a, "k"_a, "bias"_a.none(), "cols"_a, "heads"_a, "kv_heads"_a, "head_dim"_a, nb::kw_only(),
      "dims"_a, "traditional"_a, "base"_a.none(), "scale"_a, "offset"_a, "freqs"_a = nb::none(),
      "q_norm"_a = nb::none(), "k_norm"_a = nb::none(), "eps"_a = 0.0f, "half_kv"_a = false, "stream"_a = nb::none(),
      "heads() of one projection's output computed in the same op: x (B, L, k) float32 @ W^T (+ bias) for W GGUF "
      "blocks of `type`, q, k and v its columns from cols");
  m.def("sdpa", &gk::sdpa, "q"_a, "k"_a, "v"_a, "scale"_a, "mask"_a.none(), "causal"_a, nb::kw_only(),
        "flat"_a = false, "keys"_a = -1, "stream"_a = nb::none(),
        "attention as one CPU primitive (float32 queries; float32 or float16 keys and values; keys >= 0 reads "
        "the first `keys` rows of k and v)");
  m.def("gated", &gk::gated, "gate"_a, "up"_a.none(), "kind"_a, nb::kw_only(), "halves"_a = false,
        "stream"_a = nb::none(),
        "silu(gate) * up (kind 0) or gelu_tanh(gate) * up (kind 1), up optional (halves: gate's two halves are "
        "gate and up), as one CPU primitive (float32)");
  m.def("split_key", &gk::split_key, "k0"_a, "k1"_a, "mx.random.split of the key (k0, k1): (next k0, k1, sub k0, k1)");
  m.def("categorical_at", &categorical_at, "k0"_a, "k1"_a, "n"_a, "idx"_a, "vals"_a,
        "mx.random.categorical(x, key=(k0, k1)) for x (1, n) -inf but vals at idx: the same token, from those alone");
  m.attr("Q4_K_R") = gk::kQ4KR;
  m.attr("Q5_K_R") = gk::kQ5KR;
  m.attr("Q6_K_R") = gk::kQ6KR;
  m.def("repack_q4k", &repack_q4k, "blocks"_a,
        "Q4_K rows (n, row_bytes) repacked for the int16 kernels: the same size, read as type Q4_K_R");
  m.def("repack_q5k", &repack_q5k, "blocks"_a,
        "Q5_K rows (n, row_bytes) repacked for the int16 kernels: the same size, read as type Q5_K_R");
  m.def("repack_q6k", &repack_q6k, "blocks"_a,
        "Q6_K rows (n, row_bytes) repacked for the int16 kernels: the same size, read as type Q6_K_R");
  m.def("row_bytes", &gk::row_bytes, "type"_a, "k"_a, "bytes of one row, or -1 when no kernel reads `type`");
  m.def("isa", &gk::isa_name);
  m.def("isas", &gk::isa_names);
  m.def("set_isa", &gk::set_isa, "name"_a);
  m.def("threads", &gk::threads);
  m.def("set_threads", &gk::set_threads, "n"_a);
  m.def("sgemm_available", &gk::sgemm_available);
  m.def("int16_gemm", [] { return gk::active_isa().gemm_q16 != nullptr; },
        "whether the active ISA multiplies many rows (GEMM_ROWS on) by repacked K-quants and 32-element blocks in "
        "int16 (activations to GEMM_FULL)");
  m.attr("GEMM_FULL") = gk::kGemmFull;
  m.attr("GEMM_ROWS") = gk::kGemmRows;
  m.def("set_sgemm", &gk::set_sgemm, "on"_a);
  m.def("set_activations", &gk::set_activations, "mode"_a);
  m.def("activations", &gk::activations);
}
