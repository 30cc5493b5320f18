#pragma once
// rho in whole-tensor ATen form (docs/operator.md), for the reference ops, the device-generic path
// and the layers' unfused path; the fused kernels apply the policies of ops/kernels/rho.h row by
// row. Only ATen ops with C++ kernels on every device, Meta included; differentiable by autograd.
#include <ATen/core/Tensor.h>

#include "convnn/ops/rho.h"

namespace convnn::reference {

/// rho on scores [..,K]: masked (-inf) slots weigh exactly 0, a row with no valid slot weighs 0.
at::Tensor rho_weights(const at::Tensor& scores, Rho rho, double temperature);

/// Whether rho_weights gives a row of NaN scores (an unrankable row) NaN weights by itself: softmax
/// does (the row's largest score is NaN); uniform and mean weigh the slots without their values.
bool nan_scores_give_nan_weights(Rho rho);

}  // namespace convnn::reference
