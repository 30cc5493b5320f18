// Compiles every similarity and rho policy (src/ops/kernels/) in device code, for each
// architecture of CMAKE_CUDA_ARCHITECTURES. No fused CUDA kernel exists yet (CUDA tensors take the
// device-generic path) and this file registers nothing: it is the proof that the headers a CUDA
// kernel will share with the CPU kernels stay device-callable, and it fails the build when they
// do not. Built when CONVNN_WITH_CUDA is on.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "ops/kernels/knn_attention_params.h"
#include "ops/kernels/rho.h"
#include "ops/kernels/similarity.h"

namespace convnn::cuda {
namespace {

// One pair through everything a select kernel asks of a similarity: accumulate, ranking key,
// reported score, pair gradient.
template <typename Policy, typename acc_t>
__global__ void similarity_policy_kernel(const acc_t* q, const acc_t* k, int64_t d, acc_t* out) {
  acc_t raw = 0;
  for (int64_t j = 0; j < d; ++j) raw = Policy::accumulate(raw, q[j], k[j]);
  Policy::to_ranking_keys(&raw, 1, d);
  out[0] = Policy::reported_score(raw);
  Policy::add_pair_gradient(q, k, d, acc_t(1), /*wrt_query=*/true, out + 1);
}

// One row of K scores through a rho policy and the softmax backward.
template <typename Policy, typename scalar_t, typename acc_t>
__global__ void rho_policy_kernel(const scalar_t* scores, int64_t k, acc_t temperature,
                                  scalar_t* weights, scalar_t* grad_scores) {
  Policy::template weights<acc_t>(scores, k, temperature, weights);
  kernels::softmax_rho_backward_row<acc_t>(weights, scores, k, temperature, grad_scores);
}

// The views and parameter structs are device-readable too.
template <typename scalar_t>
__global__ void views_kernel(kernels::AggregateForwardParams<scalar_t> p, scalar_t* out) {
  out[0] = p.weights.at(0, 0, 0) + p.values.row(0, 0)[0];
}

template <typename acc_t>
void instantiate_similarities() {
  kernels::for_each_similarity([](auto policy) {
    (void)&similarity_policy_kernel<decltype(policy), acc_t>;
  });
}

template <typename scalar_t, typename acc_t>
void instantiate_rhos() {
  for (int value = 0; value < kRhoCount; ++value) {
    kernels::dispatch_rho(static_cast<Rho>(value), [](auto policy) {
      (void)&rho_policy_kernel<decltype(policy), scalar_t, acc_t>;
    });
  }
}

}  // namespace

// Referenced by nothing; it exists so that every instantiation above is compiled.
void instantiate_device_policies() {
  instantiate_similarities<float>();
  instantiate_similarities<double>();
  instantiate_rhos<float, float>();
  instantiate_rhos<double, double>();
  instantiate_rhos<c10::Half, float>();
  instantiate_rhos<c10::BFloat16, float>();
  (void)&views_kernel<float>;
  (void)&views_kernel<c10::Half>;
}

}  // namespace convnn::cuda
