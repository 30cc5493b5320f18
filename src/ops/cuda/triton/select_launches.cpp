#include "ops/cuda/triton/select_launches.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/triton/blocks.h"
#include "ops/mask_slices.h"
#include "ops/unit_stride_rows.h"

namespace convnn::ops::cuda::triton {
namespace {

constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();

int64_t cdiv(int64_t total, int64_t block) { return std::max<int64_t>(1, (total + block - 1) / block); }

const char* mask_name(int kind) {
  return kind == kSelectBlocks.no_mask ? "no mask" : kind == kSelectBlocks.bool_mask ? "bool mask" : "additive mask";
}

std::string pair_key(const char* kind, Similarity similarity) {
  return std::string("select backward ") + kind + " " + to_string(similarity);
}

// bounded_select._mask_bits_kernel's key (one kernel: it reads bool masks, whatever the op's dtype).
constexpr const char* kMaskBitsKey = "mask bits";

std::string key_norms_key(at::ScalarType dtype) {
  const auto input = top_k_input_dtype(dtype);
  return std::string("key norms") +
         (input == at::kFloat ? "" : std::string(" ") + kernel_dtype_name(input) + " inputs");
}

// Whether the rows of t [G,rows,D] (or [B,H,rows,D]) are whole chunks of `features` on 16-byte
// boundaries, as the tensor-core kernel's vector loads read them (select._whole_chunks).
bool whole_chunks(const at::Tensor& t, int64_t features) {
  const auto layout = row_layout(t);
  return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0 && t.size(-1) % features == 0 &&
         layout.row % features == 0 && layout.head % features == 0 && layout.batch % features == 0;
}

// Whether the tensor-core kernel's 32-bit offsets reach every element of a block's query rows and of a
// step's key rows (bounded_select._tile_offsets_fit).
bool tile_offsets_fit(const at::Tensor& queries, const at::Tensor& keys) {
  const int64_t widest = std::max((kBoundedSelectBlocks.rows - 1) * row_layout(queries).row,
                                  (kBoundedSelectBlocks.tile_offset_rows - 1) * row_layout(keys).row);
  return widest + queries.size(-1) <= kInt32;
}

// Whether bounded_select.py compiled its tensor-core kernel for this width, mask kind and input dtype
// (compile_options there: K within max_slots, and float32 inputs with an additive mask within
// float32_mask_slots).
bool tensor_cores_compiled(int64_t slots, int mask_kind, at::ScalarType dtype) {
  return slots <= kBoundedSelectBlocks.max_slots &&
         (top_k_input_dtype(dtype) != at::kFloat || mask_kind != kSelectBlocks.additive_mask ||
          slots <= kBoundedSelectBlocks.float32_mask_slots);
}

// Whether bounded_select.py's kernel serves this similarity (its SIMILARITIES).
bool tensor_cores_serve(Similarity similarity) {
  return ((kBoundedSelectBlocks.similarities >> static_cast<int>(similarity)) & 1u) != 0;
}

// Whether the tensor-core kernel starts this similarity's rows, with this mask kind, from seeds
// (bounded_select._seed_thresholds_kernel, launched before it).
bool seeded(Similarity similarity, int mask_kind) {
  return ((kBoundedSelectBlocks.seeded >> (3 * static_cast<int>(similarity) + mask_kind)) & 1u) != 0;
}

// The seeds kernel's key: one kernel for every width.
std::string seeds_key(Similarity similarity, int mask_kind, at::ScalarType dtype) {
  const auto input = top_k_input_dtype(dtype);
  return std::string("bounded seeds ") + to_string(similarity) + " " + mask_name(mask_kind) +
         (input == at::kFloat ? "" : std::string(" ") + kernel_dtype_name(input) + " inputs");
}

int mask_kind_of(const at::Tensor& mask) {
  return !mask.defined()                      ? kSelectBlocks.no_mask
         : mask.scalar_type() == at::kBool ? kSelectBlocks.bool_mask
                                             : kSelectBlocks.additive_mask;
}

// Whether the tensor-core kernel takes a call with these ranking operands (ranking_operands' queries
// and keys) of the op's `dtype`: `scores_by` chose it, it was compiled for the call's width, mask kind
// and input dtype, and its vector loads can read the rows. The IEEE kernel alone takes the others.
bool tensor_cores_take(const at::Tensor& queries, const at::Tensor& keys, int64_t k, int mask_kind,
                       at::ScalarType dtype, SelectScores scores_by) {
  // A bool mask's words of a row within CUDA's grid (its bits kernel takes a word per program column).
  const bool words_fit =
      mask_kind != kSelectBlocks.bool_mask || cdiv(keys.size(-2), kBoundedSelectBlocks.candidates) <= 65535;
  return scores_by == SelectScores::TensorCores && tensor_cores_compiled(top_k_slots(k), mask_kind, dtype) &&
         words_fit && whole_chunks(queries, kBoundedSelectBlocks.features) &&
         whole_chunks(keys, kBoundedSelectBlocks.features) && tile_offsets_fit(queries, keys);
}

// A bool mask (contiguous [G',N,M] or [N,M]: ranking_operands') as bounded_select._mask_bits_kernel's
// int64 words, a word per row and tile of candidates, which every head reads in place of the mask's
// bytes, and each block of rows' leading whole words (the tiles the select's first launch scores as
// without a mask).
struct MaskWords {
  at::Tensor bits;
  at::Tensor wholes;
  int64_t slice_stride;  // of the words: 0 for a shared mask
};

MaskWords mask_words(const at::Tensor& mask, int64_t n, int64_t m, bool per_slice, const LaunchRunner& run) {
  const int64_t words = cdiv(m, kBoundedSelectBlocks.candidates), rows = m == 0 ? 0 : mask.numel() / m;
  // A row's words, then how many of them reach its last true entry (zeros on entry: an atomic max); a
  // block's whole words (`words` on entry: an atomic min).
  auto bits = at::zeros({rows, words + 1}, mask.options().dtype(at::kLong));
  auto wholes = at::full({n == 0 ? 0 : rows / n, cdiv(n, kBoundedSelectBlocks.rows)}, words,
                         mask.options().dtype(at::kInt));
  Launch launch{kMaskBitsKey, {cdiv(rows, kBoundedSelectBlocks.mask_bits_rows), words}, {}};
  launch.arguments.pointer(mask).pointer(bits).pointer(wholes).int32(rows).int32(n).int32(m).int32(words);
  run(launch);
  return {bits, wholes, per_slice ? n * (words + 1) : 0};
}

// The tensor-core select's launches for a mask kind, by their keys' prefixes (bounded_select's PART 1
// and 2: a bool mask's whole tiles, then its others; PART 0, one launch, otherwise).
std::vector<const char*> bounded_select_launches(int mask_kind) {
  if (mask_kind == kSelectBlocks.bool_mask) return {"bounded select whole tiles", "bounded select"};
  return {"bounded select"};
}

// The tensor-core select's keys (its kernel and rerun at each width and mask kind it serves, the keys'
// norms kernel and a bool mask's words kernel).
std::vector<std::string> tensor_core_keys(at::ScalarType dtype) {
  std::vector<std::string> keys;
  for (int value = 0; value < kSimilarityCount; ++value) {  // every similarity, in enum order
    const auto similarity = static_cast<Similarity>(value);
    if (!tensor_cores_serve(similarity)) continue;
    for (const int64_t slots : top_k_slot_widths()) {
      for (const int mask : {kSelectBlocks.no_mask, kSelectBlocks.bool_mask, kSelectBlocks.additive_mask}) {
        if (!tensor_cores_compiled(slots, mask, dtype)) continue;
        for (const char* kernel : bounded_select_launches(mask)) {
          keys.push_back(top_k_key(kernel, similarity, slots, mask, dtype));
        }
        keys.push_back(top_k_key("rerun select", similarity, slots, mask, dtype));
      }
    }
  }
  for (int value = 0; value < kSimilarityCount; ++value) {
    const auto similarity = static_cast<Similarity>(value);
    for (const int mask : {kSelectBlocks.no_mask, kSelectBlocks.bool_mask, kSelectBlocks.additive_mask}) {
      if (tensor_cores_serve(similarity) && seeded(similarity, mask)) {
        keys.push_back(seeds_key(similarity, mask, dtype));
      }
    }
  }
  keys.push_back(key_norms_key(dtype));
  keys.push_back(kMaskBitsKey);
  return keys;
}

// Every key a call can launch: the forward's (the IEEE kernel's, and the tensor-core kernel's with
// its rerun), and the backward's pair-gradient kernels.
std::vector<std::string> every_select_key(at::ScalarType dtype) {
  std::vector<std::string> keys = top_k_keys("select", dtype);
  const auto tensor_cores = tensor_core_keys(dtype);
  keys.insert(keys.end(), tensor_cores.begin(), tensor_cores.end());
  for (int value = 0; value < kSimilarityCount; ++value) {  // every similarity, in enum order
    const auto similarity = static_cast<Similarity>(value);
    if (!is_dot_product(similarity)) {
      for (const char* kind : {"coefficients", "d queries", "d keys"}) keys.push_back(pair_key(kind, similarity));
    }
  }
  return keys;
}

}  // namespace

bool is_dot_product(Similarity similarity) {
  return similarity == Similarity::Dot || similarity == Similarity::ScaledDot;
}

int64_t top_k_slots(int64_t k) {
  int64_t slots = kSelectBlocks.min_slots;
  while (slots < k) slots *= 2;
  return slots;
}

const std::vector<int64_t>& top_k_slot_widths() {
  static const std::vector<int64_t> widths = [] {
    std::vector<int64_t> all;
    for (int64_t slots = kSelectBlocks.min_slots; slots <= kSelectBlocks.max_slots; slots *= 2) all.push_back(slots);
    return all;
  }();
  return widths;
}

int64_t top_k_rows(int64_t k) {
  return top_k_slots(k) <= kSelectBlocks.thread_slots ? kSelectBlocks.thread_rows : kSelectBlocks.rows;
}

at::ScalarType top_k_input_dtype(at::ScalarType dtype) {
  const bool compiled = dtype == at::kFloat || (dtype == at::kBFloat16 && kSelectBlocks.reads_bfloat16) ||
                        (dtype == at::kHalf && kSelectBlocks.reads_float16);
  return compiled ? dtype : at::kFloat;
}

std::string input_key_suffix(at::ScalarType dtype) {
  const auto input = top_k_input_dtype(dtype);  // the float32 kernels' keys name no dtype
  return input == at::kFloat ? "" : std::string(" ") + kernel_dtype_name(input) + " inputs";
}

std::string top_k_key(const char* kernel, Similarity similarity, int64_t k, int mask_kind, at::ScalarType dtype) {
  return std::string(kernel) + " " + to_string(similarity) + " K<=" + std::to_string(top_k_slots(k)) + " " +
         mask_name(mask_kind) + input_key_suffix(dtype);
}

std::vector<std::string> top_k_keys(const char* kernel, at::ScalarType dtype) {
  std::vector<std::string> keys;
  for (int value = 0; value < kSimilarityCount; ++value) {  // every similarity, in enum order
    for (const int64_t slots : top_k_slot_widths()) {
      for (const int mask : {kSelectBlocks.no_mask, kSelectBlocks.bool_mask, kSelectBlocks.additive_mask}) {
        keys.push_back(top_k_key(kernel, static_cast<Similarity>(value), slots, mask, dtype));
      }
    }
  }
  return keys;
}

int dtype_code(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return kAttentionCodes.float32;
    case at::kBFloat16: return kAttentionCodes.bfloat16;
    case at::kHalf: return kAttentionCodes.float16;
    default: TORCH_INTERNAL_ASSERT(false, "the Triton kernels take float32, bfloat16 or float16, not ", dtype);
  }
}

RankingOperands ranking_operands(const at::Tensor& queries_in, const at::Tensor& keys_in, const at::Tensor& mask_given,
                                 Similarity similarity) {
  RankingOperands operands;
  // The kernels read a mask slice for G/G' consecutive query slices in place (a per-sample mask,
  // [B,N,M] or with head dims [B,1,N,M], for its sample's heads: select.mask_slice_start).
  const auto mask_in = mask_given.defined() && mask_given.dim() == 4 ? mask_given.flatten(0, 1) : mask_given;
  const auto input = top_k_input_dtype(queries_in.scalar_type());
  // Read in place wherever their rows are unit-stride (the kernels take their RowLayouts).
  operands.queries = unit_stride_rows(queries_in.to(input));
  operands.keys = unit_stride_rows(keys_in.to(input));
  operands.mask_kind = mask_kind_of(mask_in);
  // An additive mask in float32, the type the keys rank in (as the other paths convert it).
  operands.mask = !mask_in.defined() ? operands.queries
                  : operands.mask_kind == kSelectBlocks.additive_mask ? mask_in.to(at::kFloat).contiguous()
                                                                      : mask_in.contiguous();
  // A mask of slices ([G',N,M], or [B,H,N,M] / [B,1,N,M] with head dims) is read as contiguous [G',N,M].
  operands.mask_slice_stride = mask_in.defined() && mask_in.dim() >= 3 ? queries_in.size(-2) * keys_in.size(-2) : 0;
  operands.slices_per_mask_slice = ops::slices_per_mask_slice(mask_in, slices_of(queries_in));
  // sqrt(D) rounded to float32, as the CPU's std::sqrt(float(D)); cosine's epsilon as the CPU's
  // float32 kernels round it.
  operands.similarity_constant = similarity == Similarity::ScaledDot ? std::sqrt(static_cast<float>(queries_in.size(-1)))
                                 : similarity == Similarity::Cosine  ? static_cast<float>(kCosineEps)
                                                                     : 1.0f;
  return operands;
}

bool select_fits(const at::Tensor& queries, const at::Tensor& keys, int64_t k) {
  const int64_t g = slices_of(queries), n = queries.size(-2), m = keys.size(-2);
  return k >= 1 && k <= kSelectBlocks.max_slots && queries.numel() <= kInt32 && keys.numel() <= kInt32 &&
         g * n * k <= kInt32 && g * m <= kInt32 && n * m <= kInt32 && m < kInt32 - 2 && g <= 65535 &&
         row_layout_fits(queries) && row_layout_fits(keys);
}

SelectScores select_scores(Similarity similarity, int64_t m, int64_t d) {
  const char* setting = std::getenv("CONVNN_SELECT_SCORES");
  const std::string value = setting == nullptr ? "auto" : setting;
  TORCH_CHECK(value == "auto" || value == "ieee" || value == "tensor_cores",
              "CONVNN_SELECT_SCORES must be 'auto', 'ieee' or 'tensor_cores', got '", value, "'");
  // The top's empty slots take indices M + 1 .. M + max_slots (bounded_select.py).
  const bool served = tensor_cores_serve(similarity) && d <= kBoundedSelectBlocks.max_features &&
                      m < kInt32 - 2 * kSelectBlocks.max_slots - 2;
  // "auto" is the IEEE kernel until a GPU measures the tensor-core one faster (bounded_select.py).
  return served && value == "tensor_cores" ? SelectScores::TensorCores : SelectScores::Ieee;
}

bool select_on_tensor_cores(const at::Tensor& queries, const at::Tensor& keys, int64_t k, Similarity similarity,
                            const at::Tensor& mask) {
  if (select_scores(similarity, keys.size(-2), queries.size(-1)) != SelectScores::TensorCores) return false;
  // The operands as ranking_operands makes them (a copy only where a dtype or a row's stride needs one).
  const auto input = top_k_input_dtype(queries.scalar_type());
  return tensor_cores_take(unit_stride_rows(queries.to(input)), unit_stride_rows(keys.to(input)), k,
                           mask_kind_of(mask), queries.scalar_type(), SelectScores::TensorCores);
}

const std::vector<std::string>& select_kernel_keys(at::ScalarType dtype) {
  return keys_per_dtype(dtype, [](at::ScalarType type) { return every_select_key(type); });
}

const std::vector<std::string>& select_backward_kernel_keys(at::ScalarType dtype) {
  return keys_per_dtype(dtype, [](at::ScalarType type) {
    auto keys = select_kernel_keys(type);
    const auto& aggregation = aggregate_kernel_keys(type);
    keys.insert(keys.end(), aggregation.begin(), aggregation.end());
    return keys;
  });
}

std::tuple<at::Tensor, at::Tensor> select_forward(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                                                  Similarity similarity, const at::Tensor& mask, bool index_order,
                                                  const LaunchRunner& run) {
  return select_forward(queries, keys, k, similarity, mask, index_order, run,
                        select_scores(similarity, keys.size(1), queries.size(2)));
}

std::tuple<at::Tensor, at::Tensor> select_forward(const at::Tensor& queries_in, const at::Tensor& keys_in, int64_t k,
                                                  Similarity similarity, const at::Tensor& mask_in, bool index_order,
                                                  const LaunchRunner& run, SelectScores scores_by) {
  const int64_t g = queries_in.size(0), n = queries_in.size(1), d = queries_in.size(2), m = keys_in.size(1);
  auto scores = at::empty({g, n, k}, queries_in.options());
  auto indices = at::empty({g, n, k}, queries_in.options().dtype(at::kLong));
  if (scores.numel() == 0) return {scores, indices};
  const auto in = ranking_operands(queries_in, keys_in, mask_in, similarity);
  const auto dtype = queries_in.scalar_type();
  TORCH_INTERNAL_ASSERT(scores_by == SelectScores::Ieee || tensor_cores_serve(similarity),
                        "no tensor-core select kernel for ", to_string(similarity));
  const bool tensor_cores = tensor_cores_take(in.queries, in.keys, k, in.mask_kind, dtype, scores_by);
  at::Tensor redo;  // the rows the tensor-core kernel leaves to its rerun: int32 [G * N]
  if (tensor_cores) {
    redo = at::empty({g * n}, queries_in.options().dtype(at::kInt));
    // The keys' norms once ([G, norm_sections, M + 1]: a slice's M norms and its flag, zero unless one is
    // not finite or too large, then their M sums of squares, then their inverse norms as cosine's, then
    // each tile's largest norm), then a persistent grid, each program with its queue of candidates (scratch).
    auto norms = at::zeros({g, kBoundedSelectBlocks.norm_sections, m + 1}, queries_in.options().dtype(at::kFloat));
    Launch key_norms{key_norms_key(dtype), {cdiv(m, kBoundedSelectBlocks.key_norm_rows), g}, {}};
    key_norms.arguments.pointer(in.keys).pointer(norms).int32(m).int32(d).float32(static_cast<float>(kCosineEps))
        .int32(heads_of(in.keys))
        .rows(row_layout(in.keys));
    run(key_norms);
    // A bool mask as its words (wholes: unread without one, any int32 pointer).
    const auto words = in.mask_kind == kSelectBlocks.bool_mask
                           ? mask_words(in.mask, n, m, in.mask_slice_stride != 0, run)
                           : MaskWords{in.mask, redo, in.mask_slice_stride};
    const auto& mask = words.bits;
    const int64_t mask_slice_stride = words.slice_stride;
    // The rows' first thresholds, where the kernel starts from them (else unread: any float32 pointer).
    auto seeds = norms;
    if (seeded(similarity, in.mask_kind)) {
      seeds = at::empty({g * n}, queries_in.options().dtype(at::kFloat));
      Launch seeding{seeds_key(similarity, in.mask_kind, dtype), {cdiv(n, kBoundedSelectBlocks.rows), g}, {}};
      seeding.arguments.pointer(in.queries).pointer(in.keys).pointer(mask).pointer(words.wholes).pointer(norms)
          .pointer(seeds).int32(n).int32(m).int32(d).int32(k).int32(mask_slice_stride).int32(in.slices_per_mask_slice)
          .float32(in.similarity_constant).float32(1.0f).int32(heads_of(in.queries)).rows(row_layout(in.queries))
          .rows(row_layout(in.keys));
      run(seeding);
    }
    const int64_t programs = std::min(cdiv(n, kBoundedSelectBlocks.rows) * g, kBoundedSelectBlocks.programs);
    auto queue = at::empty({programs * kBoundedSelectBlocks.rows, kBoundedSelectBlocks.queue},
                           queries_in.options().dtype(at::kInt));
    for (const char* kernel : bounded_select_launches(in.mask_kind)) {
      Launch bounded{top_k_key(kernel, similarity, k, in.mask_kind, dtype), {programs, 1}, {}};
      bounded.arguments.pointer(in.queries).pointer(in.keys).pointer(mask).pointer(words.wholes).pointer(scores)
          .pointer(indices).pointer(redo).pointer(redo).pointer(norms).pointer(seeds).pointer(queue).int32(g).int32(n)
          .int32(m).int32(d).int32(k).int32(mask_slice_stride).int32(in.slices_per_mask_slice)
          .float32(in.similarity_constant).float32(1.0f)
          .int32(dtype_code(scores.scalar_type())).int32(heads_of(in.queries)).rows(row_layout(in.queries))
          .rows(row_layout(in.keys));
      run(bounded);
    }
  }
  Launch launch{top_k_key(redo.defined() ? "rerun select" : "select", similarity, k, in.mask_kind, dtype),
                {cdiv(n, top_k_rows(k)), g}, {}};
  launch.arguments.pointer(in.queries).pointer(in.keys).pointer(in.mask).pointer(scores).pointer(indices);
  if (redo.defined()) launch.arguments.pointer(redo);  // the rerun: the select kernel on the flagged rows
  launch.arguments.int32(n).int32(m).int32(d).int32(k).int32(in.mask_slice_stride).int32(in.slices_per_mask_slice)
      .float32(in.similarity_constant)
      .int32(dtype_code(scores.scalar_type())).int32(heads_of(in.queries)).rows(row_layout(in.queries))
      .rows(row_layout(in.keys));
  run(launch);
  if (index_order) {  // the same K slots by ascending index (a row's K indices are distinct)
    auto [sorted_indices, order] = indices.sort(/*dim=*/-1);
    scores = scores.gather(-1, order);
    indices = sorted_indices;
  }
  return {scores, indices};
}

namespace {

std::tuple<at::Tensor, at::Tensor> dot_product_backward(const at::Tensor& live, const at::Tensor& queries,
                                                        const at::Tensor& keys, const at::Tensor& indices,
                                                        Similarity similarity, const LaunchRunner& run) {
  // d(q.k)/dq = k and d(q.k)/dk = q: the query gradient is the aggregation of the keys with the
  // incoming gradient as weights and a kernel of ones, the key gradient its values' gradient.
  auto weights = live;
  if (similarity == Similarity::ScaledDot) {  // sqrt(D) in the accumulation type, as the policies
    weights = (live.to(at::kFloat) / std::sqrt(static_cast<float>(queries.size(2)))).to(live.scalar_type());
  }
  const auto ones = at::ones({queries.size(2), indices.size(2)}, queries.options());
  auto grad_queries = aggregate_forward(keys, weights, indices, ones, at::Tensor(), run);
  auto grad_keys = std::get<0>(aggregate_backward(queries, keys, weights, indices, ones,
                                                  {true, false, false, false}, run));
  return {grad_queries, grad_keys};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> select_backward(const at::Tensor& grad_scores, const at::Tensor& queries_in,
                                                   const at::Tensor& keys_in, const at::Tensor& indices,
                                                   const at::Tensor& scores, Similarity similarity,
                                                   const LaunchRunner& run) {
  // Masked slots (score -inf) pass no gradient.
  const auto live = grad_scores.masked_fill(at::isneginf(scores), 0);
  if (is_dot_product(similarity)) return dot_product_backward(live, queries_in, keys_in, indices, similarity, run);
  const int64_t g = queries_in.size(0), n = queries_in.size(1), d = queries_in.size(2);
  const int64_t m = keys_in.size(1), k = indices.size(2);
  const auto dtype = queries_in.scalar_type();
  const auto queries = queries_in.to(at::kFloat).contiguous(), keys = keys_in.to(at::kFloat).contiguous();
  auto grad_queries = at::zeros_like(queries), grad_keys = at::zeros_like(keys);
  if (g * n * k == 0 || d == 0) return {grad_queries.to(dtype), grad_keys.to(dtype)};
  const auto live32 = live.to(at::kFloat).contiguous();
  const auto coefficients = at::empty({g * n * k, kPairGradientBlocks.coefficients}, queries.options());
  const auto arg = at::empty({g * n * k}, queries.options().dtype(at::kInt));
  const int64_t rows_total = g * n, rows = kPairGradientBlocks.rows, features = kPairGradientBlocks.features;
  Launch pairs{pair_key("coefficients", similarity), {cdiv(rows_total, rows), k}, {}};
  pairs.arguments.pointer(queries).pointer(keys).pointer(indices).pointer(live32).pointer(coefficients).pointer(arg)
      .int32(rows_total).int32(n).int32(m).int32(d).int32(k).float32(static_cast<float>(kCosineEps));
  run(pairs);
  Launch by_rows{pair_key("d queries", similarity), {cdiv(rows_total, rows), cdiv(d, features)}, {}};
  by_rows.arguments.pointer(queries).pointer(keys).pointer(indices).pointer(coefficients).pointer(arg)
      .pointer(grad_queries).int32(rows_total).int32(n).int32(m).int32(d).int32(k);
  run(by_rows);
  const auto [order, run_start] = inverse_index(indices, m);
  Launch by_keys{pair_key("d keys", similarity), {g * m, cdiv(d, features)}, {}};
  by_keys.arguments.pointer(queries).pointer(keys).pointer(coefficients).pointer(arg).pointer(order)
      .pointer(run_start).pointer(grad_keys).int32(d).int32(k);
  run(by_keys);
  return {grad_queries.to(dtype), grad_keys.to(dtype)};
}

}  // namespace convnn::ops::cuda::triton
