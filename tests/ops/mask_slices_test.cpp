// A mask of G' slices, G' dividing the G query slices, serves G/G' consecutive slices each (a mask
// per sample for the sample's heads; docs/operator.md, "Masks"): on every path its results are
// those of the mask repeated to one slice per query slice, bit for bit (the same bytes reach the
// same arithmetic), and a G' that does not divide G is refused with the rule.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "convnn/ops/knn_ops.h"
#include "ops/generic/generic.h"
#include "ops/reference/reference.h"
#include "support/error_message.h"

namespace mask_slices_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)
namespace {

namespace generic = convnn::ops::generic;
using convnn::testing::error_of;

// 96 slices of 5 rows: the CPU attention kernel's tasks take 6 slices each, so that a task starts
// inside a mask slice's run where G/G' does not divide 6 (the kernel's mask_slice_phase).
constexpr int64_t kSlices = 96, kRows = 5, kKeys = 11, kFeatures = 4, kK = 3;

// Integer-valued features: exact scores, many ties, the same on every CPU.
at::Tensor integers(c10::IntArrayRef shape, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(-3, 4, shape, generator, at::kFloat);
}

// [G', N, M] bool, about 60 % true, with a row of a single valid key (fewer than K) and an empty row.
at::Tensor compact_mask(int64_t mask_slices, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto mask = at::rand({mask_slices, kRows, kKeys}, generator) < 0.6;
  mask[0][1].fill_(false);
  mask[0][1][7] = true;
  mask[mask_slices - 1][3].fill_(false);
  return mask;
}

at::Tensor additive(const at::Tensor& allowed) {
  return at::zeros(allowed.sizes(), at::kFloat).masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
}

// [G', N, M] -> [G, N, M]: each mask slice repeated for the query slices it serves.
at::Tensor every_slice(const at::Tensor& mask) {
  return mask.repeat_interleave(kSlices / mask.size(0), 0);
}

using Select = std::function<std::tuple<at::Tensor, at::Tensor>(const at::Tensor& mask)>;
using Attention = std::function<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(const at::Tensor& mask)>;

void expect_same(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& expected, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], expected[i])) << what << ", output " << i;
}

TEST(MaskSlices, AMaskSliceServesItsConsecutiveQuerySlicesOnEveryPath) {
  const auto queries = integers({kSlices, kRows, kFeatures}, 1), keys = integers({kSlices, kKeys, kFeatures}, 2);
  const auto values = integers({kSlices, kKeys, 6}, 3), kernel = integers({6, kK}, 4);
  const std::vector<std::pair<std::string, Select>> selects{
      {"knn_select (CPU)", [&](const at::Tensor& m) { return convnn::ops::knn_select(queries, keys, kK, "dot", m, false); }},
      {"generic knn_select",
       [&](const at::Tensor& m) { return generic::knn_select(queries, keys, kK, "dot", m, false); }},
      {"reference knn_select", [&](const at::Tensor& m) {
         return convnn::reference::knn_select(queries, keys, kK, convnn::Similarity::Dot, m, false);
       }}};
  const std::vector<std::pair<std::string, Attention>> attentions{
      {"knn_attention (CPU)",
       [&](const at::Tensor& m) {
         return convnn::ops::knn_attention(queries, keys, values, kernel, c10::nullopt, kK, "dot", m, true, "softmax", 1.0);
       }},
      {"generic knn_attention", [&](const at::Tensor& m) {
         return generic::knn_attention(queries, keys, values, kernel, c10::nullopt, kK, "dot", m, true, "softmax", 1.0);
       }}};
  for (const int64_t mask_slices : {1, 3, 24, 32, 96}) {
    const auto allowed = compact_mask(mask_slices, 10 + mask_slices);
    for (const auto& mask : {allowed, additive(allowed)}) {
      const auto what = "G' = " + std::to_string(mask_slices) + (mask.scalar_type() == at::kBool ? ", bool" : ", additive");
      for (const auto& [name, select] : selects) {
        const auto [scores, indices] = select(mask);
        const auto [expected_scores, expected_indices] = select(every_slice(mask));
        expect_same({scores, indices}, {expected_scores, expected_indices}, name + ", " + what);
      }
      for (const auto& [name, attention] : attentions) {
        const auto [output, scores, indices, weights] = attention(mask);
        const auto [e_output, e_scores, e_indices, e_weights] = attention(every_slice(mask));
        expect_same({output, scores, indices, weights}, {e_output, e_scores, e_indices, e_weights}, name + ", " + what);
      }
    }
  }
}

TEST(MaskSlices, AMaskWhoseSlicesDoNotDivideTheQuerySlicesIsRefused) {
  const auto queries = integers({6, kRows, kFeatures}, 5), keys = integers({6, kKeys, kFeatures}, 6);
  const auto message = error_of([&] {
    convnn::ops::knn_select(queries, keys, kK, "dot", at::ones({4, kRows, kKeys}, at::kBool), false);
  });
  EXPECT_NE(message.find("mask shape [4, 5, 11] does not match [N,M] = [5, 11] or [G',N,M] = [G', 5, 11] with G' "
                         "dividing G = 6"),
            std::string::npos)
      << message;
  EXPECT_NE(error_of([&] {
              convnn::ops::knn_select(queries, keys, kK, "dot", at::ones({0, kRows, kKeys}, at::kBool), false);
            }).find("with G' dividing G = 6"),
            std::string::npos);
}

}  // namespace
}  // namespace mask_slices_test
