// convnn from another project: the layers, a ResNet-18 with branching layers from the model
// registry, a checkpoint written by `convnn train`, and the neighbours its layers select.
//   convnn_example CHECKPOINT
#include <convnn/convnn.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace {

// Sum of the outputs' squares, backward, and a check that every parameter got a finite gradient.
void forward_backward(torch::nn::Module& module, const torch::Tensor& output, const char* what) {
  output.square().sum().backward();
  for (const auto& parameter : module.named_parameters()) {
    const auto& grad = parameter.value().grad();
    TORCH_CHECK(grad.defined() && grad.isfinite().all().item<bool>(), what, ": parameter ",
                parameter.key(), " has no finite gradient");
  }
  std::printf("%-40s output %-18s forward and backward ok\n", what, c10::str(output.sizes()).c_str());
}

int64_t count_branching_layers(torch::nn::Module& model) {
  int64_t count = 0;
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (module->as<convnn::nn::BranchingConv2dImpl>() != nullptr) ++count;
  }
  return count;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CHECKPOINT (a checkpoint-*.pt written by `convnn train`)\n", argv[0]);
    return 2;
  }
  try {
    // The headers this program was compiled with and the library it runs with must agree.
    TORCH_CHECK(std::strcmp(convnn::version(), CONVNN_VERSION_STRING) == 0, "compiled against convnn ",
                CONVNN_VERSION_STRING, " but running with libconvnn ", convnn::version());
    std::printf("convnn %s\n", convnn::version());
    torch::manual_seed(0);

    // A drop-in for a 3x3 convolution: cosine similarity, K = 9, padding 1.
    convnn::nn::ConvNN2d conv(convnn::nn::ConvNN2dOptions(3, 8, /*k=*/9).padding(1));
    forward_backward(*conv, conv(torch::randn({2, 3, 8, 8})), "ConvNN2d(3, 8, k=9)");

    // Multi-head ConvNN attention on 16 tokens of width 32, K = 8 of 16.
    convnn::nn::ConvNNAttention attention(convnn::nn::ConvNNAttentionOptions(/*embed_dim=*/32, /*num_heads=*/4, /*k=*/8));
    forward_backward(*attention, attention(torch::randn({2, 16, 32})), "ConvNNAttention(32, heads=4, k=8)");

    // A ResNet-18 of the registry whose stride-1 3x3 convolutions are branching layers.
    convnn::models::ModelConfig config;
    config.num_classes = 10;
    config.in_channels = 1;
    config.image_size = 28;
    config.resnet.layer = convnn::models::ResNetLayer::Branching;
    config.resnet.small_stem = true;
    config.resnet.width = 8;
    auto resnet = convnn::models::build_model("resnet18", config);
    const int64_t branching = count_branching_layers(*resnet.module());
    TORCH_CHECK(branching > 0, "resnet18 with layer branching has no BranchingConv2d");
    forward_backward(*resnet.module(), resnet(torch::randn({2, 1, 28, 28})),
                     ("resnet18, " + std::to_string(branching) + " branching layers").c_str());

    // A checkpoint of `convnn train`: its config names the model, which is built and loaded.
    const std::string path = argv[1];
    const auto header = convnn::checkpoint::read_checkpoint_header(path);
    auto trained = convnn::models::build_model(header.config.model, header.config.model_config);
    const auto first = trained.module()->named_parameters().begin()->value();
    const auto initial = first.detach().clone();
    convnn::checkpoint::load_checkpoint(path, *trained.module(), /*optimizer=*/nullptr);
    TORCH_CHECK(!first.equal(initial), "loading ", path, " left the freshly initialised weights as they were");
    trained.module()->eval();
    torch::NoGradGuard no_grad;
    const auto& model_config = header.config.model_config;
    const auto logits = trained(torch::randn({4, model_config.in_channels, model_config.image_size,
                                              model_config.image_size}));
    // The built model's config holds its head's size (unset in a config: the model's own).
    TORCH_CHECK(logits.sizes() == torch::IntArrayRef({4, trained.config().num_classes.value()}) &&
                    logits.isfinite().all().item<bool>(),
                "the loaded model's logits are ", logits.sizes(), " or not finite");
    std::printf("checkpoint %s: %s (%lld branching layers, %lld parameters) after epoch %lld, logits %s\n",
                path.c_str(), header.config.model.c_str(),
                static_cast<long long>(count_branching_layers(*trained.module())),
                static_cast<long long>(trained.parameter_count()),
                static_cast<long long>(header.position.epoch), c10::str(logits.sizes()).c_str());

    // What each ConvNN layer selected in one forward: per query its K neighbours (the first layer's
    // first query, in the layer's input, padding included).
    const auto images = torch::randn({1, model_config.in_channels, model_config.image_size, model_config.image_size});
    const auto selected = convnn::nn::record_neighbours(*trained.module(), [&] { trained(images); });
    TORCH_CHECK(!selected.empty(), "record_neighbours found no ConvNN layer in ", header.config.model);
    const auto& [layer, neighbours] = selected.front();
    const auto first_query = neighbours.positions[0][0][0];  // [K, 2]: (y, x) per neighbour
    std::string cells;
    for (int64_t slot = 0; slot < first_query.size(0); ++slot) {
      cells += c10::str(slot ? " " : "", "(", first_query[slot][0].item<int64_t>(), ",",
                        first_query[slot][1].item<int64_t>(), ")");
    }
    std::printf("%zu layers recorded; %s selected %s, the first query's neighbours at %s\n", selected.size(),
                layer.c_str(), c10::str(neighbours.indices.sizes()).c_str(), cells.c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "convnn_example: %s\n", error.what());
    return 1;
  }
}
