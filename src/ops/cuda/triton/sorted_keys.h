#pragma once
// The stable sorts of the Triton route's backward launchers (the inverse index, the rows busiest
// first): int32 keys known to fit in their low `key_bits` bits, positions back in 32 bits. ATen's
// sort passes over all 32 bits of an int32 key and returns int64 positions: a radix sort of 8-bit
// digits reads and writes every key and position four times. On a CUDA tensor these run CUB's radix
// sort through ATen over the key's bits alone (ceil(key_bits / 8) passes: 3 for the inverse index of
// 12 heads of 16384 keys) with int32 positions, as ATen's own embedding backward sorts its indices;
// elsewhere (the interpreter's CPU tensors) ATen's stable sort, whose order is the same permutation.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace convnn::ops::cuda::triton {

struct SortedKeys {
  at::Tensor keys;       // int32, sorted
  at::Tensor positions;  // int32: where each sorted key was, equal keys in their input order
};

/// The bits that hold every value from 0 to `largest` (at least 1).
int64_t bits_for(int64_t largest);

/// `keys` (int32, 1-D, every entry in [0, 2^key_bits)) sorted stably, ascending or descending.
SortedKeys sorted_keys(const at::Tensor& keys, int64_t key_bits, bool descending);

}  // namespace convnn::ops::cuda::triton
