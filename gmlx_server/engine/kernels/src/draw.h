// MLX's CPU categorical draw (mx.random.categorical of one row: an inverse CDF over exp(x - max), one uniform
// from threefry bits) computed over the tokens a sampler's filters kept, on the host: a filtered row draws
// among a few hundred tokens without a pass over the vocabulary.
#pragma once

#include <array>
#include <cstdint>

namespace gk {

// mx.random.split(key): (next key, subkey) as two uint32 pairs, from RandomBits((2, 2), key).
std::array<uint32_t, 4> split_key(uint32_t k0, uint32_t k1);

// mx.random.categorical(x, key=(k0, k1)) for x (1, n) float32 that is -inf but at the m ascending positions
// idx, where it is vals (finite): the token, to the bit of MLX's own draw.
int64_t categorical_at(uint32_t k0, uint32_t k1, int64_t n, const int64_t* idx, const float* vals, int64_t m);

}  // namespace gk
