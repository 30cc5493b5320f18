// convert_checkpoint: a run's checkpoint of any format rewritten as plain data (format 4). It is
// the one place that opens TorchScript archives (LegacyFiles::Trust), which is why it needs its
// caller's word that the file is trusted: the command asks for --trust-legacy.
#include <filesystem>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/optim.h"
#include "convnn/train/trainer.h"

namespace convnn::train {

void convert_checkpoint(const std::string& from, const std::string& to) {
  using checkpoint::LegacyFiles;
  TORCH_CHECK(!std::filesystem::exists(to), "convert: '", to, "' exists; name a new file");
  const auto stored = checkpoint::read_checkpoint_header(from, LegacyFiles::Trust);
  // On the CPU, where checkpoints keep their tensors; in the run's precision, so every tensor keeps
  // its dtype. The file is copied as it is: a diverged run converts too.
  auto model = make_model(stored.config, c10::Device(c10::kCPU));
  auto optimizer = make_optimizer(stored.config.optimization, *model.module());
  checkpoint::load_checkpoint(from, *model.module(), optimizer.get(), /*allow_non_finite=*/true, LegacyFiles::Trust);
  checkpoint::save_checkpoint(to, stored.config, stored.position, *model.module(), *optimizer);
}

}  // namespace convnn::train
