#pragma once
// The layers (library convnn::nn, on convnn::ops): ConvNN1d, ConvNN2d, ConvNNAttention,
// BranchingConv2d with their options and functional forms, and the paper's identities.
#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/nn/options/convnn.h"
#include "convnn/ops.h"
#include "convnn/verify/identities.h"
