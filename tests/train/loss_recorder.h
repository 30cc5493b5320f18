#pragma once
// A training sink that records the loss of every trained batch, in order: what the resume tests
// compare between an uninterrupted run and a stopped-then-resumed one.
#include <cstdint>
#include <vector>

#include "convnn/train/sinks.h"

namespace convnn::train::testing_support {

class LossRecorder final : public TrainingSink {
 public:
  explicit LossRecorder(std::vector<double>& losses) : losses_(losses) {}
  void batch_loss(int64_t, double loss) override { losses_.push_back(loss); }

 private:
  std::vector<double>& losses_;
};

}  // namespace convnn::train::testing_support
