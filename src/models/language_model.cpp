#include "convnn/models/language_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/nn/init.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "convnn/nn/modules/convnn.h"

namespace convnn::models {
namespace {

constexpr const char* kName = "LanguageModel";

std::string shape_of(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream text;
  text << c10::toString(t.scalar_type()) << " " << t.sizes();
  return text.str();
}

// Restores a module's training mode when it goes out of scope.
class ModeGuard {
 public:
  explicit ModeGuard(torch::nn::Module& module) : module_(module), training_(module.is_training()) {}
  ~ModeGuard() { module_.train(training_); }
  ModeGuard(const ModeGuard&) = delete;
  ModeGuard& operator=(const ModeGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool training_;
};

}  // namespace

void check_tokens(const at::Tensor& tokens, int64_t vocab_size, int64_t context, int64_t first_position,
                  const std::string& argument) {
  TORCH_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.scalar_type() == at::kLong && tokens.size(1) >= 1,
              kName, ": ", argument, " must be int64 [B, T] with T >= 1, got ", shape_of(tokens));
  const int64_t t = tokens.size(1);
  TORCH_CHECK(first_position >= 0 && first_position + t <= context, kName, ": ", argument, " at positions ",
              first_position, " to ", first_position + t - 1, " are past the context of ", context, " tokens");
  if (tokens.numel() == 0) return;
  // Traced tokens (torch.compile's fake tensors, export) have no values to read: the range goes in
  // the graph as an assertion, checked when it runs.
  if (tokens.is_meta() || tokens.key_set().has(c10::DispatchKey::Python)) {
    at::_assert_async(tokens.ge(0).logical_and(tokens.lt(vocab_size)).all(),
                      c10::str(kName, ": ", argument, " must be token ids in [0, vocab_size = ", vocab_size, ")"));
    return;
  }
  const auto low = tokens.min().item<int64_t>(), high = tokens.max().item<int64_t>();
  TORCH_CHECK(low >= 0 && high < vocab_size, kName, ": ", argument, " must be token ids in [0, vocab_size = ",
              vocab_size, "), got values in [", low, ", ", high, "]");
}

LanguageModelImpl::LanguageModelImpl(LanguageModelOptions options_) : options(std::move(options_)) { reset(); }

void LanguageModelImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.embed_dim() >= 1 && o.depth() >= 1 && o.context() >= 1 && o.vocab_size() >= 1, kName,
              ": embed_dim, depth, context and vocab_size must be at least 1, got ", o.embed_dim(), ", ", o.depth(),
              ", ", o.context(), " and ", o.vocab_size());
  TORCH_CHECK(o.num_heads() >= 1 && o.embed_dim() % o.num_heads() == 0, kName, ": num_heads = ", o.num_heads(),
              " must be at least 1 and divide embed_dim = ", o.embed_dim());
  TORCH_CHECK(o.num_kv_heads() >= 0 && (o.num_kv_heads() == 0 || o.num_heads() % o.num_kv_heads() == 0), kName,
              ": num_kv_heads = ", o.num_kv_heads(), " must divide num_heads = ", o.num_heads(),
              " (or be 0: num_heads)");
  TORCH_CHECK(o.mlp_dim() >= 0, kName, ": mlp_dim must be non-negative (0 = 4 * embed_dim), got ", o.mlp_dim());
  if (o.attention() != ViTAttention::MHSA) {
    TORCH_CHECK(o.convnn().k() >= 1 && o.convnn().k() <= o.context(), kName, ": k = ", o.convnn().k(),
                " must be in [1, context = ", o.context(), "]");
  }
  const int64_t dim = o.embed_dim();
  token_embed = register_module("token_embed", torch::nn::Embedding(o.vocab_size(), dim));
  if (o.position_embedding() == PositionEmbedding::Learned) {
    pos_embed = register_parameter("pos_embed", at::zeros({1, o.context(), dim}));
  } else {
    pos_embed = register_buffer("pos_embed", sinusoidal_position_encoding(o.context(), dim).unsqueeze(0));
  }
  pos_drop = register_module("pos_drop", torch::nn::Dropout(o.dropout()));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth(); ++i) {
    blocks->push_back(
        TransformerBlock(transformer_block_options(o, i).num_kv_heads(o.num_kv_heads()).causal(true)));
  }
  norm = register_module("norm", layer_norm(dim));
  head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(dim, o.vocab_size()).bias(false)));

  // GPT-2's initialisation: every Linear and the embeddings N(0, 0.02), zero biases; LayerNorm
  // starts as the identity.
  normal_init_linear_layers(*this);
  torch::NoGradGuard no_grad;
  token_embed->weight.normal_(0.0, 0.02);
  if (o.position_embedding() == PositionEmbedding::Learned) pos_embed.normal_(0.0, 0.02);
}

at::Tensor LanguageModelImpl::logits(const at::Tensor& tokens, int64_t first_position,
                                     std::vector<nn::KVCache>* caches) {
  const int64_t t = tokens.size(1);
  auto x = pos_drop(token_embed(tokens) + pos_embed.narrow(1, first_position, t));
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto& block = blocks->at<TransformerBlockImpl>(i);
    x = caches == nullptr ? block.forward(x) : block.forward_step(x, (*caches)[i]);
  }
  return head(norm(x));
}

at::Tensor LanguageModelImpl::forward(const at::Tensor& tokens) {
  check_tokens(tokens, options.vocab_size(), options.context(), 0, "tokens");
  return logits(tokens, 0, nullptr);
}

std::vector<nn::KVCache> LanguageModelImpl::make_caches(int64_t batch, int64_t max_length) const {
  TORCH_CHECK(batch >= 1, kName, ": batch must be at least 1, got ", batch);
  TORCH_CHECK(max_length >= 1 && max_length <= options.context(), kName, ": max_length must be in [1, context = ",
              options.context(), "], got ", max_length);
  std::vector<nn::KVCache> caches;
  for (size_t i = 0; i < blocks->size(); ++i) caches.push_back(blocks->at<TransformerBlockImpl>(i).make_cache(batch, max_length));
  return caches;
}

at::Tensor LanguageModelImpl::forward_step(const at::Tensor& tokens, std::vector<nn::KVCache>& caches) {
  TORCH_CHECK(caches.size() == blocks->size(), kName, ": forward_step needs one cache per block (", blocks->size(),
              "), got ", caches.size(), " (make_caches makes them)");
  const auto& lengths = caches.front().lengths();
  for (const auto length : lengths) {
    TORCH_CHECK(length == lengths.front(), kName,
                ": forward_step needs every sample's cache to hold as many tokens; they hold ", lengths.front(),
                " and ", length);
  }
  check_tokens(tokens, options.vocab_size(), options.context(), lengths.front(), "tokens");
  TORCH_CHECK(static_cast<int64_t>(lengths.size()) == tokens.size(0), kName, ": tokens hold ", tokens.size(0),
              " samples and the caches ", lengths.size());
  return logits(tokens, lengths.front(), &caches);
}

CostReport LanguageModelImpl::cost(int64_t tokens) const {
  TORCH_CHECK(tokens >= 1 && tokens <= options.context(), kName, ": cost is for 1 to context = ", options.context(),
              " tokens, got ", tokens);
  const int64_t dim = options.embed_dim();
  CostReport report;
  report.add("embed", "pos_embed", "add", addition_cost(tokens * dim));
  for (size_t i = 0; i < blocks->size(); ++i) {
    blocks->at<TransformerBlockImpl>(i).add_cost(report, "blocks." + std::to_string(i), tokens);
  }
  report.add("head", "norm", "layernorm", layer_norm_cost(tokens * dim));
  report.add("head", "head", "linear", linear_cost(tokens, dim, options.vocab_size(), false));
  report.count_parameters(*this, transformer_stage);
  return report;
}

void LanguageModelImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << "convnn::models::LanguageModel(vocab_size=" << o.vocab_size() << ", context=" << o.context()
         << ", embed_dim=" << o.embed_dim() << ", depth=" << o.depth() << ", num_heads=" << o.num_heads()
         << ", attention=" << to_string(o.attention()) << ")";
}

at::Tensor sample_tokens(const at::Tensor& logits, const SamplingOptions& options,
                         std::optional<at::Generator> generator) {
  TORCH_CHECK(logits.defined() && logits.dim() == 2 && logits.size(0) >= 1 && logits.size(1) >= 1 &&
                  logits.is_floating_point(),
              "sample_tokens: logits must be floating point [B, V] with B, V >= 1, got ", shape_of(logits));
  TORCH_CHECK(std::isfinite(options.temperature) && options.temperature >= 0.0,
              "sample_tokens: temperature must be >= 0 (0: the most likely token), got ", options.temperature);
  TORCH_CHECK(options.top_k >= 0, "sample_tokens: top_k must be >= 0 (0: every token), got ", options.top_k);
  if (options.temperature == 0.0) return logits.argmax(1);
  auto scaled = logits.to(at::kFloat) / options.temperature;
  if (options.top_k > 0 && options.top_k < logits.size(1)) {
    // Everything below the k-th largest logit is out (ties with it stay in).
    const auto kth = std::get<0>(scaled.topk(options.top_k, 1)).narrow(1, options.top_k - 1, 1);
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<float>::infinity());
  }
  // Drawn on the CPU, from a CPU generator whatever the model's device.
  const auto probabilities = at::softmax(scaled, 1).to(at::kCPU);
  return at::multinomial(probabilities, 1, /*replacement=*/false, generator).squeeze(1).to(logits.device());
}

int64_t generation_restart_tokens(int64_t context) {
  TORCH_CHECK(context >= 1, "generation_restart_tokens: context must be at least 1, got ", context);
  return std::max<int64_t>(1, context / 2);
}

at::Tensor generate(LanguageModelImpl& model, const at::Tensor& prompts, int64_t max_new_tokens,
                    const SamplingOptions& options, uint64_t seed) {
  const int64_t context = model.options.context();
  check_tokens(prompts, model.options.vocab_size(), context, 0, "prompts");
  TORCH_CHECK(max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  ModeGuard mode(model);
  model.eval();
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto device = model.head->weight.device();
  auto caches = model.make_caches(prompts.size(0), context);
  // Written in place: no copy of the whole text per token.
  const int64_t prompt_length = prompts.size(1);
  auto tokens = at::empty({prompts.size(0), prompt_length + max_new_tokens}, prompts.options().device(device));
  tokens.narrow(1, 0, prompt_length).copy_(prompts);
  auto logits = model.forward_step(tokens.narrow(1, 0, prompt_length), caches);
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t length = prompt_length + i + 1;  // the text so far, the new token included
    const auto next = tokens.narrow(1, length - 1, 1);
    next.copy_(sample_tokens(logits.select(1, logits.size(1) - 1), options, generator).unsqueeze(1));
    if (i + 1 == max_new_tokens) break;
    if (caches.front().lengths().front() < context) {
      logits = model.forward_step(next, caches);
      continue;
    }
    // The caches are full: the positions restart, with the last half context read again.
    for (auto& cache : caches) cache.reset();
    const int64_t kept = generation_restart_tokens(context);
    logits = model.forward_step(tokens.narrow(1, length - kept, kept), caches);
  }
  return tokens;
}

}  // namespace convnn::models
