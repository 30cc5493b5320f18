#include "support/gradcheck.h"

#include <torch/torch.h>

#include <sstream>

namespace convnn::testing {

::testing::AssertionResult GradCheck(const TensorFunction& f, const std::vector<at::Tensor>& inputs,
                                     const GradCheckOptions& options) {
  for (const auto& x : inputs) {
    if (x.defined() && x.requires_grad() && x.scalar_type() != at::kDouble) {
      return ::testing::AssertionFailure() << "GradCheck needs float64 inputs, got " << x.scalar_type();
    }
  }
  const auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const auto direction = [&] {
    torch::NoGradGuard no_grad;
    const auto out = f(inputs);
    return at::randn(out.sizes(), generator, out.options().requires_grad(false));
  }();
  const auto objective = [&](const std::vector<at::Tensor>& xs) { return (f(xs) * direction).sum(); };

  std::vector<at::Tensor> checked;
  for (const auto& x : inputs) {
    if (x.defined() && x.requires_grad()) checked.push_back(x);
  }
  if (checked.empty()) return ::testing::AssertionFailure() << "no input requires grad";
  const auto analytical = torch::autograd::grad({objective(inputs)}, checked, {}, false, false, true);

  torch::NoGradGuard no_grad;
  size_t checked_index = 0;
  for (size_t input_index = 0; input_index < inputs.size(); ++input_index) {
    const auto& x = inputs[input_index];
    if (!x.defined() || !x.requires_grad()) continue;
    const auto grad = analytical[checked_index].defined() ? analytical[checked_index]
                                                         : at::zeros_like(x);
    ++checked_index;
    // Perturb a contiguous copy so that non-contiguous inputs are handled too.
    auto perturbed_inputs = inputs;
    auto base = x.detach().clone(at::MemoryFormat::Contiguous);
    auto flat = base.view({-1});
    const auto grad_flat = grad.contiguous().view({-1});
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double original = flat[e].item<double>();
      flat[e] = original + options.eps;
      perturbed_inputs[input_index] = base;
      const double plus = objective(perturbed_inputs).item<double>();
      flat[e] = original - options.eps;
      const double minus = objective(perturbed_inputs).item<double>();
      flat[e] = original;
      const double numerical = (plus - minus) / (2.0 * options.eps);
      const double analytic = grad_flat[e].item<double>();
      if (std::abs(numerical - analytic) > options.atol + options.rtol * std::abs(numerical)) {
        std::ostringstream msg;
        msg << "input " << input_index << " element " << e << ": autograd " << analytic
            << " vs finite difference " << numerical;
        return ::testing::AssertionFailure() << msg.str();
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace convnn::testing
