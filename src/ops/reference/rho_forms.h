#pragma once
// rho in whole-tensor ATen form (docs/operator.md), for the reference ops, the device-generic path
// and the layers' unfused path; the fused kernels apply the policies of ops/kernels/rho.h row by
// row. Only ATen ops with C++ kernels on every device, Meta included; differentiable by autograd.
#include <ATen/core/Tensor.h>

#include "convnn/ops/rho.h"

namespace convnn::reference {

/// rho on scores [..,K]: masked (-inf) slots weigh exactly 0, a row with no valid slot weighs 0.
at::Tensor rho_weights(const at::Tensor& scores, Rho rho, double temperature);

}  // namespace convnn::reference
