#pragma once
// The layers (library convnn::nn, on convnn::ops): ConvNN1d, ConvNN2d, ConvNN3d, ConvNNAttention,
// BranchingConv2d, BranchingConv3d with their options and functional forms, what they select
// (neighbours.h). The paper's identities are a library of their own (convnn/verify/identities.h).
#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/nn/neighbours.h"
#include "convnn/nn/options/convnn.h"
#include "convnn/ops.h"
