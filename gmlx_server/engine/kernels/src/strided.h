// Reading an evaluated MLX array in row-major order whatever its strides.
#pragma once

#include <cstdint>
#include <vector>

#include "mlx/array.h"

namespace gk {

// A's elements in row-major order: its own buffer when already contiguous, else gathered into `scratch`.
template <typename T>
const T* row_major(const mlx::core::array& a, std::vector<T>& scratch) {
  if (a.flags().row_contiguous) return a.data<T>();
  scratch.resize(a.size());
  const T* src = a.data<T>();
  const int nd = a.ndim();
  std::vector<int64_t> idx(nd, 0);
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t at = 0;
    for (int d = 0; d < nd; ++d) at += idx[d] * a.strides()[d];
    scratch[i] = src[at];
    for (int d = nd - 1; d >= 0 && ++idx[d] == a.shape(d); --d) idx[d] = 0;
  }
  return scratch.data();
}

}  // namespace gk
