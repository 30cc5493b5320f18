#include "convnn/nn/modules/convnn.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/functional/spatial.h"
#include "nn/modules/layer_forward.h"
#include "nn/modules/sequence_forward.h"
#include "ops/checks.h"

namespace convnn::nn {
namespace {

// Conv1d's default initialisation (Kaiming-uniform with a = sqrt(5) is U(-1/sqrt(fan_in), ..)),
// computed from the fan-in explicitly so that a leading head dimension does not count.
void init_uniform_fan_in(at::Tensor& t, int64_t fan_in) {
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  torch::NoGradGuard no_grad;
  t.uniform_(-bound, bound);
}

std::vector<int64_t> kernel_shape(Aggregation aggregation, int64_t heads, bool per_head,
                                  int64_t in_per_head, int64_t out_per_head, int64_t k) {
  std::vector<int64_t> shape;
  if (per_head) shape.push_back(heads);
  if (aggregation == Aggregation::Standard) shape.push_back(out_per_head);
  shape.push_back(in_per_head);
  shape.push_back(k);
  return shape;
}

// Registers the aggregation kernel (parameter, or a buffer of ones when fixed) and the bias.
template <typename Module>
void register_kernel_and_bias(Module& module, at::Tensor& kernel, at::Tensor& bias,
                              const std::vector<int64_t>& shape, bool learnable, bool with_bias,
                              bool per_head, int64_t heads, int64_t out_per_head) {
  if (learnable) {
    kernel = module.register_parameter("kernel", torch::empty(shape));
  } else {
    kernel = module.register_buffer("kernel", torch::ones(shape));
  }
  if (with_bias) {
    bias = module.register_parameter(
        "bias", per_head ? torch::empty({heads, out_per_head}) : torch::empty({out_per_head}));
  }
}

void init_kernel_and_bias(at::Tensor& kernel, at::Tensor& bias, KernelInit init, bool learnable,
                          Aggregation aggregation, int64_t in_per_head, int64_t k) {
  const int64_t fan_in = (aggregation == Aggregation::Standard ? in_per_head : 1) * k;
  if (learnable) {
    torch::NoGradGuard no_grad;
    if (init == KernelInit::Ones) {
      kernel.fill_(1.0);
    } else {
      init_uniform_fan_in(kernel, fan_in);
    }
  }
  if (bias.defined()) init_uniform_fan_in(bias, fan_in);
}

const char* yes_no(bool b) { return b ? "true" : "false"; }

}  // namespace

CandidateDraw::CandidateDraw(c10::optional<uint64_t> seed, EvalCandidates eval, uint64_t eval_seed)
    : eval_(eval), eval_seed_(eval_seed) {
  if (seed.has_value()) train_generator_ = at::make_generator<at::CPUGeneratorImpl>(*seed);
}

CandidateDraw CandidateDraw::with_generator(c10::optional<at::Generator> train_generator, EvalCandidates eval,
                                           uint64_t eval_seed) {
  CandidateDraw draw(c10::nullopt, eval, eval_seed);
  draw.train_generator_ = std::move(train_generator);
  return draw;
}

c10::optional<at::Generator> CandidateDraw::generator(bool training) const {
  if (training || eval_ == EvalCandidates::Fresh) return train_generator_;
  return at::make_generator<at::CPUGeneratorImpl>(eval_seed_);
}

// ----------------------------------------------------------------------------- ConvNN1d / 2d / 3d

template <size_t D, typename Derived>
ConvNNNdImpl<D, Derived>::ConvNNNdImpl(ConvNNOptions<D> options_) : options(std::move(options_)) {
  reset();
}

template <size_t D, typename Derived>
void ConvNNNdImpl<D, Derived>::reset() {
  const auto& o = options;
  const auto name = functional::detail::spatial_layer_name(D);
  TORCH_CHECK(o.in_channels() >= 1, name, ": in_channels must be at least 1, got ", o.in_channels());
  TORCH_CHECK(o.out_channels() >= 1, name, ": out_channels must be at least 1, got ", o.out_channels());
  TORCH_CHECK(o.k() >= 1, name, ": k must be at least 1, got ", o.k());
  TORCH_CHECK(o.heads() >= 1 && o.in_channels() % o.heads() == 0 &&
                  o.out_channels() % o.heads() == 0,
              name, ": heads = ", o.heads(), " must be at least 1 and divide in_channels (",
              o.in_channels(), ") and out_channels (", o.out_channels(), ")");
  TORCH_CHECK(o.aggregation() == Aggregation::Standard || o.in_channels() == o.out_channels(), name,
              ": depthwise aggregation keeps the channel count, so out_channels (", o.out_channels(),
              ") must equal in_channels (", o.in_channels(), ")");
  TORCH_CHECK(o.padding() >= 0, name, ": padding must be non-negative, got ", o.padding());
  for (int64_t axis = 0; axis < static_cast<int64_t>(D); ++axis) {
    TORCH_CHECK((*o.stride())[axis] >= 1, name, ": stride must be at least 1 on every axis, got ", o.stride());
    TORCH_CHECK((*o.dilation())[axis] >= 1, name, ": dilation must be at least 1 on every axis, got ", o.dilation());
  }
  TORCH_CHECK(o.alpha() >= 0.0 && o.alpha() <= 1.0, name, ": alpha must be in [0, 1], got ", o.alpha());
  TORCH_CHECK(o.alpha() == 1.0 || o.coordinates(), name, ": alpha = ", o.alpha(),
              " blends in positional similarity, which needs coordinates(true)");
  TORCH_CHECK(o.num_candidates() >= 0, name, ": num_candidates must be non-negative (0 = all), got ",
              o.num_candidates());
  checks::check_temperature(o.temperature(), name);
  const int64_t qk = o.qk_channels() == 0 ? o.in_channels() : o.qk_channels();
  TORCH_CHECK(qk >= 1 && qk % o.heads() == 0, name, ": qk_channels = ", o.qk_channels(),
              " must be divisible by heads = ", o.heads());
  TORCH_CHECK(o.projection() == Projection::Linear || o.qk_channels() == 0, name,
              ": qk_channels needs projection = linear");

  if (o.projection() == Projection::Linear) {
    auto linear = [&](int64_t out) {
      return torch::nn::Linear(torch::nn::LinearOptions(o.in_channels(), out).bias(o.projection_bias()));
    };
    query_projection = this->register_module("query_projection", linear(qk));
    key_projection = this->register_module("key_projection", linear(qk));
    value_projection = this->register_module("value_projection", linear(o.in_channels()));
  }
  const int64_t in_per_head = o.in_channels() / o.heads(), out_per_head = o.out_channels() / o.heads();
  register_kernel_and_bias(*this, kernel, bias,
                           kernel_shape(o.aggregation(), o.heads(), o.kernel_per_head(),
                                        in_per_head, out_per_head, o.k()),
                           o.learnable_kernel(), o.bias(), o.kernel_per_head(), o.heads(),
                           out_per_head);
  draw_ = CandidateDraw(o.seed(), o.eval_candidates(), o.eval_seed());
  reset_parameters();
}

template <size_t D, typename Derived>
void ConvNNNdImpl<D, Derived>::reset_parameters() {
  init_kernel_and_bias(kernel, bias, options.kernel_init(), options.learnable_kernel(),
                       options.aggregation(), options.in_channels() / options.heads(), options.k());
}

template <size_t D, typename Derived>
detail::ConvNNTensors ConvNNNdImpl<D, Derived>::tensors() const {
  detail::ConvNNTensors t{kernel, bias, {}, {}, {}};
  if (options.projection() == Projection::Linear) {
    t.query = {query_projection->weight, query_projection->bias};
    t.key = {key_projection->weight, key_projection->bias};
    t.value = {value_projection->weight, value_projection->bias};
  }
  return t;
}

template <size_t D, typename Derived>
c10::optional<at::Generator> ConvNNNdImpl<D, Derived>::candidate_generator() const {
  return draw_.generator(this->is_training());
}

template <size_t D, typename Derived>
at::Tensor ConvNNNdImpl<D, Derived>::run(const at::Tensor& input, Neighbours* neighbours) {
  return detail::convnn_forward(options, input, tensors(), candidate_generator(), neighbours);
}

template <size_t D, typename Derived>
at::Tensor ConvNNNdImpl<D, Derived>::forward(const at::Tensor& input) {
  return run(input, this->neighbours_sink());
}

template <size_t D, typename Derived>
std::tuple<at::Tensor, Neighbours> ConvNNNdImpl<D, Derived>::forward_with_neighbours(const at::Tensor& input) {
  return with_neighbours([&](Neighbours* neighbours) { return run(input, neighbours); });
}

template <size_t D, typename Derived>
void ConvNNNdImpl<D, Derived>::check_input_size(c10::IntArrayRef sizes, const std::string& layer) const {
  TORCH_CHECK(sizes.size() == D, layer, ": ConvNN", D, "d takes ", D, " spatial sizes, got ", sizes);
  functional::detail::check_spatial_candidates(sizes, detail::func_options(options), layer);
}

template <size_t D, typename Derived>
void ConvNNNdImpl<D, Derived>::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << "convnn::ConvNN" << D << "d(" << o.in_channels() << ", " << o.out_channels()
         << ", k=" << o.k() << ", similarity=" << to_string(o.similarity())
         << ", padding=" << o.padding();
  const auto not_ones = [](const torch::ExpandingArray<D>& values) {
    return std::any_of(values->begin(), values->end(), [](int64_t v) { return v != 1; });
  };
  if (not_ones(o.stride())) stream << ", stride=" << o.stride();
  if (not_ones(o.dilation())) stream << ", dilation=" << o.dilation();
  stream << ", rho=" << to_string(o.rho())
         << ", aggregation=" << to_string(o.aggregation())
         << ", slot_order=" << to_string(o.slot_order());
  if (o.heads() != 1) stream << ", heads=" << o.heads();
  if (o.coordinates()) stream << ", coordinates=true, alpha=" << o.alpha();
  if (o.num_candidates() > 0) {
    stream << ", num_candidates=" << o.num_candidates()
           << ", include_self=" << yes_no(o.include_self())
           << ", eval_candidates=" << to_string(o.eval_candidates());
  }
  if (o.rho() == Rho::Softmax && o.temperature() != 1.0) stream << ", temperature=" << o.temperature();
  if (!o.learnable_kernel()) stream << ", learnable_kernel=false";
  if (o.kernel_per_head()) stream << ", kernel_per_head=true";
  if (!o.fused()) stream << ", fused=false";
  if (o.projection() == Projection::Linear) stream << ", projection=linear";
  stream << ", bias=" << yes_no(o.bias()) << ")";
}

template class ConvNNNdImpl<1, ConvNN1dImpl>;
template class ConvNNNdImpl<2, ConvNN2dImpl>;
template class ConvNNNdImpl<3, ConvNN3dImpl>;

// ----------------------------------------------------------------------------- ConvNNAttention

ConvNNAttentionImpl::ConvNNAttentionImpl(ConvNNAttentionOptions options_)
    : options(std::move(options_)) {
  reset();
}

void ConvNNAttentionImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.embed_dim() >= 1, "ConvNNAttention: embed_dim must be at least 1, got ", o.embed_dim());
  TORCH_CHECK(o.num_heads() >= 1 && o.embed_dim() % o.num_heads() == 0,
              "ConvNNAttention: num_heads = ", o.num_heads(), " must be at least 1 and divide embed_dim = ",
              o.embed_dim());
  TORCH_CHECK(o.k() >= 1, "ConvNNAttention: k must be at least 1, got ", o.k());
  TORCH_CHECK(o.dropout() >= 0.0 && o.dropout() < 1.0, "ConvNNAttention: dropout must be in [0, 1), got ",
              o.dropout());
  checks::check_temperature(o.temperature(), "ConvNNAttention");
  TORCH_CHECK(o.num_candidates() >= 0, "ConvNNAttention: num_candidates must be non-negative (0 = all), got ",
              o.num_candidates());
  TORCH_CHECK(o.num_kv_heads() >= 0 && (o.num_kv_heads() == 0 || o.num_heads() % o.num_kv_heads() == 0),
              "ConvNNAttention: num_kv_heads = ", o.num_kv_heads(), " must divide num_heads = ", o.num_heads(),
              " (0 = num_heads)");
  const int64_t d = o.embed_dim() / o.num_heads();
  const int64_t kv_channels = key_value_heads(o) * d;
  auto linear = [&](int64_t out_features, bool with_bias) {
    return torch::nn::Linear(torch::nn::LinearOptions(o.embed_dim(), out_features).bias(with_bias));
  };
  query_projection = register_module("query_projection", linear(o.embed_dim(), o.qkv_bias()));
  key_projection = register_module("key_projection", linear(kv_channels, o.qkv_bias()));
  value_projection = register_module("value_projection", linear(kv_channels, o.qkv_bias()));
  output_projection = register_module("output_projection", linear(o.embed_dim(), o.out_bias()));
  dropout = register_module("dropout", torch::nn::Dropout(o.dropout()));
  register_kernel_and_bias(*this, kernel, bias,
                           kernel_shape(o.aggregation(), o.num_heads(), o.kernel_per_head(), d, d, o.k()),
                           o.learnable_kernel(), o.bias(), o.kernel_per_head(), o.num_heads(), d);
  draw_ = CandidateDraw(o.seed(), o.eval_candidates(), o.eval_seed());
  reset_parameters();
}

void ConvNNAttentionImpl::reset_parameters() {
  init_kernel_and_bias(kernel, bias, options.kernel_init(), options.learnable_kernel(),
                       options.aggregation(), options.embed_dim() / options.num_heads(), options.k());
}

at::Tensor ConvNNAttentionImpl::forward(const at::Tensor& input, const at::Tensor& attn_mask,
                                       const at::Tensor& key_padding_mask) {
  return run(input, attn_mask, key_padding_mask, neighbours_sink());
}

std::tuple<at::Tensor, Neighbours> ConvNNAttentionImpl::forward_with_neighbours(const at::Tensor& input,
                                                                                const at::Tensor& attn_mask,
                                                                                const at::Tensor& key_padding_mask) {
  return with_neighbours([&](Neighbours* neighbours) { return run(input, attn_mask, key_padding_mask, neighbours); });
}

detail::AttentionTensors ConvNNAttentionImpl::tensors(const at::Tensor& attn_mask,
                                                      const at::Tensor& key_padding_mask) const {
  return {kernel,
          bias,
          {query_projection->weight, query_projection->bias},
          {key_projection->weight, key_projection->bias},
          {value_projection->weight, value_projection->bias},
          {output_projection->weight, output_projection->bias},
          {options.mask(), attn_mask, key_padding_mask}};
}

at::Tensor ConvNNAttentionImpl::run(const at::Tensor& input, const at::Tensor& attn_mask,
                                    const at::Tensor& key_padding_mask, Neighbours* neighbours) {
  return detail::attention_forward(options, input, tensors(attn_mask, key_padding_mask),
                                   draw_.generator(is_training()), is_training(), neighbours);
}

at::Tensor ConvNNAttentionImpl::forward_packed(const at::Tensor& input, const at::Tensor& cu_seqlens) {
  return detail::attention_forward_packed(options, input, tensors({}, {}), cu_seqlens, is_training());
}

KVCache ConvNNAttentionImpl::make_cache(int64_t batch, int64_t max_length) const {
  const auto geometry = detail::cache_geometry(options);
  return KVCache(batch, max_length, geometry[0], geometry[1], geometry[2], key_projection->weight.options());
}

at::Tensor ConvNNAttentionImpl::forward_step(const at::Tensor& input, KVCache& cache,
                                             const std::vector<int64_t>& counts) {
  return detail::attention_forward_step(options, input, tensors({}, {}), cache, counts, is_training());
}

void ConvNNAttentionImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << "convnn::ConvNNAttention(embed_dim=" << o.embed_dim() << ", num_heads=" << o.num_heads();
  if (o.num_kv_heads() != 0 && o.num_kv_heads() != o.num_heads()) stream << ", num_kv_heads=" << o.num_kv_heads();
  stream << ", k=" << o.k() << ", similarity=" << to_string(o.similarity())
         << ", rho=" << to_string(o.rho()) << ", aggregation=" << to_string(o.aggregation())
         << ", learnable_kernel=" << yes_no(o.learnable_kernel())
         << ", kernel_per_head=" << yes_no(o.kernel_per_head()) << ", dropout=" << o.dropout();
  if (o.causal()) stream << ", causal=true";
  if (!o.fused()) stream << ", fused=false";
  if (o.num_candidates() > 0) stream << ", num_candidates=" << o.num_candidates();
  stream << ")";
}

// ----------------------------------------------------------------------------- BranchingConv2d / 3d

template <size_t D, typename Derived>
BranchingConvNdImpl<D, Derived>::BranchingConvNdImpl(BranchingConvOptions<D> options_)
    : options(std::move(options_)) {
  reset();
}

template <size_t D, typename Derived>
int64_t BranchingConvNdImpl<D, Derived>::convnn_channels() const {
  return detail::convnn_branch_channels(options);
}

template <size_t D, typename Derived>
void BranchingConvNdImpl<D, Derived>::reset() {
  const auto& o = options;
  const auto name = detail::branching_layer_name(D);
  TORCH_CHECK(o.in_channels() >= 1 && o.out_channels() >= 1,
              name, ": in_channels and out_channels must be at least 1, got ", o.in_channels(),
              " and ", o.out_channels());
  TORCH_CHECK(o.lambda() >= 0.0 && o.lambda() <= 1.0, name, ": lambda must be in [0, 1], got ", o.lambda());
  TORCH_CHECK(o.kernel_size() >= 1 && o.kernel_size() % 2 == 1,
              name, ": kernel_size must be odd and positive (same padding), got ", o.kernel_size());
  const int64_t convnn_out = convnn_channels(), conv_out = o.out_channels() - convnn_out;
  if (convnn_out > 0) {
    convnn_branch = this->register_module("convnn_branch", ConvNNBranch(detail::convnn_branch_options(o)));
  }
  if (conv_out > 0) {
    // The ConvNN branch's stride and dilation, with same padding (branching_forward runs it so).
    torch::ExpandingArray<D> padding(0);
    for (size_t axis = 0; axis < D; ++axis) (*padding)[axis] = (*o.convnn().dilation())[axis] * (o.kernel_size() / 2);
    conv_branch = this->register_module(
        "conv_branch", Conv(torch::nn::ConvOptions<D>(o.in_channels(), conv_out, o.kernel_size())
                                .stride(o.convnn().stride())
                                .dilation(o.convnn().dilation())
                                .padding(padding)
                                .bias(true)));
  }
  mix = this->register_module("mix", Conv(torch::nn::ConvOptions<D>(o.out_channels(), o.out_channels(), 1).bias(true)));
}

template <size_t D, typename Derived>
at::Tensor BranchingConvNdImpl<D, Derived>::forward(const at::Tensor& input) {
  return run(input, this->neighbours_sink());
}

template <size_t D, typename Derived>
std::tuple<at::Tensor, Neighbours> BranchingConvNdImpl<D, Derived>::forward_with_neighbours(const at::Tensor& input) {
  return with_neighbours([&](Neighbours* neighbours) { return run(input, neighbours); });
}

template <size_t D, typename Derived>
at::Tensor BranchingConvNdImpl<D, Derived>::run(const at::Tensor& input, Neighbours* neighbours) {
  detail::BranchingTensors t;
  c10::optional<at::Generator> generator;
  if (convnn_branch) {
    t.convnn = convnn_branch->tensors();
    generator = convnn_branch->candidate_generator();
  }
  if (conv_branch) t.conv = {conv_branch->weight, conv_branch->bias};
  t.mix = {mix->weight, mix->bias};
  return detail::branching_forward(options, input, t, generator, neighbours);
}

template <size_t D, typename Derived>
void BranchingConvNdImpl<D, Derived>::check_input_size(c10::IntArrayRef sizes, const std::string& layer) const {
  if (convnn_branch) convnn_branch->check_input_size(sizes, layer + ".convnn_branch");
}

template <size_t D, typename Derived>
void BranchingConvNdImpl<D, Derived>::pretty_print(std::ostream& stream) const {
  stream << "convnn::" << detail::branching_layer_name(D) << "(" << options.in_channels() << ", " << options.out_channels()
         << ", lambda=" << options.lambda() << ", convnn_channels=" << convnn_channels()
         << ", kernel_size=" << options.kernel_size() << ")";
}

template class BranchingConvNdImpl<2, BranchingConv2dImpl>;
template class BranchingConvNdImpl<3, BranchingConv3dImpl>;

}  // namespace convnn::nn
