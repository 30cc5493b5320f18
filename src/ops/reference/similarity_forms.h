#pragma once
// Each similarity in whole-tensor ATen form: what the reference ops (src/ops/reference/) and the
// device-generic path (src/ops/generic/) compute with. The fused kernels compute the same maths
// element by element from the policies of ops/kernels/similarity.h; the tests hold the two apart.
// The forms are one specialisation per policy (similarity_forms.cpp), reached through the policies'
// one dispatch (kernels::dispatch_similarity).
// Only ATen ops with C++ kernels on every device, Meta included (src/ops/generic/internal.h).
#include <ATen/core/Tensor.h>

#include <limits>
#include <tuple>

#include "convnn/ops/similarity.h"

namespace convnn::reference {

/// The ranking key of a masked-out or impossible pair.
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// 1 / max(|x|, eps) along the last dim, kept: cosine's row factors. Every path computes cosine as
/// (q.k * (1/|q|)) * (1/|k|), in that order, from the raw rows: an exactly orthogonal pair scores
/// exactly 0, and integer-valued rows give every path the same bits (docs/operator.md, "Ties").
at::Tensor inverse_norms(const at::Tensor& x);

/// The ranking keys of every query against every key, [G,N,D] x [G,M,D] -> [G,N,M]: the
/// similarity, or -distance for the distance similarities, from exact pairwise differences (mirror
/// positions tie exactly). No mask.
at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys, Similarity similarity);

/// The score knn_select reports for each pair, q [..,1,D] against kk [..,K,D] -> [..,K]
/// (exp(-distance) for the distance similarities), differentiable through ATen autograd.
at::Tensor pair_scores(const at::Tensor& q, const at::Tensor& kk, Similarity similarity);

/// Scores as knn_select reports them from selected ranking keys: exp(key) for the distance
/// similarities, -inf (masked) kept.
at::Tensor reported_scores(const at::Tensor& selected_keys, Similarity similarity);

/// d score / d query and d score / d key of each selected pair, q [..,1,D] against kk [..,K,D]
/// (broadcastable results), on raw (not normalised) rows. Chebyshev: the first coordinate of a tie.
std::tuple<at::Tensor, at::Tensor> pair_gradients(const at::Tensor& q, const at::Tensor& kk,
                                                  Similarity similarity);

}  // namespace convnn::reference
