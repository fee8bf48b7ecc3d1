// The prologue every CPU primitive's eval_cpu shares.
#pragma once

#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

namespace gk {

// Allocates `out` and registers it and `inputs` with the stream's encoder; the caller dispatches its task.
inline mlx::core::cpu::CommandEncoder& begin_eval(mlx::core::Stream stream, const std::vector<mlx::core::array>& inputs,
                                                  mlx::core::array& out) {
  out.set_data(mlx::core::allocator::malloc(out.nbytes()));
  auto& enc = mlx::core::cpu::get_command_encoder(stream);
  for (const auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  return enc;
}

// The same for a primitive with several outputs.
inline mlx::core::cpu::CommandEncoder& begin_eval(mlx::core::Stream stream, const std::vector<mlx::core::array>& inputs,
                                                  std::vector<mlx::core::array>& outputs) {
  auto& enc = mlx::core::cpu::get_command_encoder(stream);
  for (const auto& a : inputs) enc.set_input_array(a);
  for (auto& out : outputs) {
    out.set_data(mlx::core::allocator::malloc(out.nbytes()));
    enc.set_output_array(out);
  }
  return enc;
}

}  // namespace gk
