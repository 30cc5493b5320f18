// The ops alone, through <convnn/ops.h> and convnn::ops: select each query's k nearest keys by
// cosine similarity, aggregate their values with a kernel, and take the gradients.
#include <convnn/ops.h>
#include <torch/torch.h>

#include <cstdio>
#include <exception>

int main() {
  try {
    torch::manual_seed(0);
    const int64_t groups = 2, tokens = 16, dim = 8, k = 4;
    auto points = torch::randn({groups, tokens, dim}, torch::requires_grad());
    // Keys are the queries: with cosine similarity every token is its own best match (score 1).
    auto [scores, indices] = convnn::ops::knn_select(points, points, k, "cosine", c10::nullopt, false);
    TORCH_CHECK(indices.select(-1, 0).equal(torch::arange(tokens).expand({groups, tokens})),
                "knn_select: a token's first neighbour under cosine similarity is not itself");
    auto kernel = torch::randn({dim, dim, k}, torch::requires_grad());  // standard aggregation
    auto output = convnn::ops::knn_aggregate(points, torch::softmax(scores, -1), indices, kernel, c10::nullopt);
    TORCH_CHECK(output.sizes() == torch::IntArrayRef({groups, tokens, dim}), "knn_aggregate's output is ",
                output.sizes());
    output.square().sum().backward();
    TORCH_CHECK(points.grad().defined() && points.grad().isfinite().all().item<bool>() &&
                    kernel.grad().abs().sum().item<double>() > 0,
                "the gradients of the ops are missing or not finite");
    std::printf("convnn %s ops: knn_select + knn_aggregate on [%lld, %lld, %lld], k = %lld: forward and backward ok\n",
                convnn::version(), static_cast<long long>(groups), static_cast<long long>(tokens),
                static_cast<long long>(dim), static_cast<long long>(k));
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "convnn_ops_example: %s\n", error.what());
    return 1;
  }
}
