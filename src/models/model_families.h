#pragma once
// What the registry asks of the family rows (model_families.cpp) beyond registry.h.
#include <string>

#include "convnn/models/registry.h"

namespace convnn::models {

/// The rules that follow from `name`'s family row: the ModelConfig parts other families read keep
/// their defaults, the family's layer without ConvNN refuses ConvNN's options, and the family's own
/// rules (c10::Error naming the option, its value and the rule).
void check_family_options(const std::string& name, const ModelConfig& config);

}  // namespace convnn::models
