#pragma once
// The ops alone (library convnn::ops, which needs LibTorch and OpenMP only): knn_select,
// knn_aggregate, the fused knn_attention and their backward ops, the similarity and rho names,
// their operation counts, and the device rule.
#include "convnn/ops/cost.h"
#include "convnn/ops/knn_ops.h"
#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"
#include "convnn/util/device.h"
#include "convnn/version.h"
