// libFuzzer target: any bytes handed to convnn as a checkpoint. Every path a command takes is
// driven: the restricted torch.save reader, the header (read_checkpoint_header: config, position),
// and load_checkpoint into a small model with an AdamW optimiser (weights, optimiser state, RNG).
// A c10::Error is the reader's refusal, the expected outcome for most inputs; anything else (a
// crash, a sanitizer report, another exception, an allocation past libFuzzer's RSS limit, a hang
// past its timeout) is a finding.
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/optim.h"
#include "fuzz_input_file.h"
#include "checkpoint/torch_file.h"

namespace {

struct Target {
  torch::nn::Linear linear{4, 3};
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      convnn::train::make_optimizer(convnn::train::OptimizationConfig{}, *linear.ptr());
};

template <typename F>
void refused_or_read(F&& f) {
  try {
    f();
  } catch (const c10::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Target target;
  const auto& path = convnn::fuzz::write_input(data, size, ".pt");
  refused_or_read([&] { convnn::checkpoint::read_torch_file(path); });
  refused_or_read([&] { convnn::checkpoint::read_checkpoint_header(path); });
  refused_or_read([&] { convnn::checkpoint::load_checkpoint(path, *target.linear.ptr(), nullptr); });
  refused_or_read([&] { convnn::checkpoint::load_checkpoint(path, *target.linear.ptr(), target.optimizer.get()); });
  return 0;
}
