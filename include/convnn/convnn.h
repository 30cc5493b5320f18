#pragma once
// convnn's whole public API, as <torch/torch.h> is LibTorch's: the ops, the layers, the models,
// the data pipeline, data parallelism, training and checkpoints. Link convnn::train, which brings
// every library below it. Lighter: <convnn/ops.h> (convnn::ops) and <convnn/nn.h> (convnn::nn).
// Not included: convnn/bench/ (library convnn::bench, the measurements of `convnn bench`) and
// convnn/verify/ (library convnn::verify, the paper's identities behind `convnn verify`).
#include "convnn/nn.h"

#include "convnn/models/batch_norm.h"
#include "convnn/models/cost.h"
#include "convnn/models/geometry.h"
#include "convnn/models/registry.h"
#include "convnn/models/resnet.h"
#include "convnn/models/vit.h"
#include "convnn/data/config.h"
#include "convnn/data/config_loader.h"
#include "convnn/data/datasets.h"
#include "convnn/data/image.h"
#include "convnn/data/image_codec.h"
#include "convnn/data/image_folder.h"
#include "convnn/data/image_folder_source.h"
#include "convnn/data/loader.h"
#include "convnn/data/rng.h"
#include "convnn/data/sample_source.h"
#include "convnn/data/subset.h"
#include "convnn/data/transforms.h"
#include "convnn/dist/process_group.h"
#include "convnn/checkpoint/atomic_file.h"
#include "convnn/checkpoint/checkpoint.h"
#include "convnn/config/train_config.h"
#include "convnn/train/data_setup.h"
#include "convnn/train/loss.h"
#include "convnn/train/metrics.h"
#include "convnn/train/optim.h"
#include "convnn/train/schedule.h"
#include "convnn/train/sinks.h"
#include "convnn/train/trainer.h"
