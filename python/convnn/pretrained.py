"""Fine-tuning a ConvNN ViT from the weights of a multi-head self-attention (MHSA) ViT.

timm's attention layer stores its query, key and value projections fused, `attn.qkv` ([3C, C]),
and its output projection as `attn.proj`; ConvNNAttention has `query_projection`,
`key_projection`, `value_projection` and `output_projection` (the C++ layer's names), plus its
aggregation kernel, which MHSA has no counterpart for. `mhsa_to_convnn_state_dict` maps the one
onto the other; everything else (patch embedding, norms, MLPs, head, position embedding) keeps its
key.

    import timm, convnn
    from convnn.nn import ConvNNAttention
    mhsa = timm.create_model("vit_tiny_patch16_224", pretrained=True)
    convnn_vit = timm.create_model("vit_tiny_patch16_224", attn_layer=ConvNNAttention.with_options(k=9))
    convnn_vit.load_state_dict(convnn.pretrained.mhsa_to_convnn_state_dict(mhsa.state_dict(), convnn_vit))

With K = the token count, similarity "scaled_dot", rho "softmax" and the kernel of ones (the layer's
defaults), the converted model computes what the MHSA model does (ConvNN recovers attention);
with a smaller K it starts from the pretrained projections.
"""
import typing

import torch
from torch import nn

from .nn.modules import ConvNNAttention

_PROJECTIONS = ("query_projection", "key_projection", "value_projection")


def mhsa_to_convnn_state_dict(state_dict: typing.Mapping[str, torch.Tensor],
                              model: nn.Module) -> typing.Dict[str, torch.Tensor]:
    """The state_dict of `model` (a ViT whose attention layers are ConvNNAttention, e.g. timm's
    VisionTransformer with attn_layer=ConvNNAttention.with_options(...), or convnn's registry ViT)
    from `state_dict`, the same ViT's weights with MHSA attention (timm's `qkv`/`proj` keys).

    Each ConvNNAttention of `model` takes its projections from the `qkv` and `proj` tensors under
    its own path and keeps its own aggregation kernel and bias (MHSA has none); every other key is
    copied. Raises ValueError naming the layer if the MHSA weights lack a layer's qkv or proj, or
    if their shapes do not fit."""
    converted = {}
    attention_paths = [path for path, module in model.named_modules() if isinstance(module, ConvNNAttention)]
    if not attention_paths:
        raise ValueError("mhsa_to_convnn_state_dict: model has no ConvNNAttention layer to convert to")
    consumed = set()
    own = model.state_dict()
    for path in attention_paths:
        prefix = f"{path}." if path else ""
        layer = model.get_submodule(path)
        for leaf in ("weight", "bias"):
            qkv_key, proj_key = f"{prefix}qkv.{leaf}", f"{prefix}proj.{leaf}"
            wants_leaf = f"{prefix}query_projection.{leaf}" in own
            if not wants_leaf:
                if qkv_key in state_dict:
                    raise ValueError(f"mhsa_to_convnn_state_dict: {qkv_key} is given but {path} has no "
                                     f"{leaf} in its projections (build it with qkv_bias=True)")
            elif qkv_key not in state_dict:
                raise ValueError(f"mhsa_to_convnn_state_dict: the MHSA weights have no {qkv_key} for {path}")
            else:
                fused = state_dict[qkv_key]
                if fused.shape[0] != 3 * layer.options["embed_dim"]:
                    raise ValueError(f"mhsa_to_convnn_state_dict: {qkv_key} has shape {tuple(fused.shape)}, "
                                     f"but {path} has embed_dim {layer.options['embed_dim']} (wants "
                                     f"{3 * layer.options['embed_dim']} rows)")
                for name, part in zip(_PROJECTIONS, fused.chunk(3, dim=0)):
                    converted[f"{prefix}{name}.{leaf}"] = part.clone()
                consumed.add(qkv_key)
            if f"{prefix}output_projection.{leaf}" in own:
                if proj_key not in state_dict:
                    raise ValueError(f"mhsa_to_convnn_state_dict: the MHSA weights have no {proj_key} for {path}")
                converted[f"{prefix}output_projection.{leaf}"] = state_dict[proj_key]
                consumed.add(proj_key)
        # The aggregation kernel (and bias) have no MHSA counterpart: the layer keeps its own.
        for name, tensor in list(layer.named_parameters(recurse=False)) + list(layer.named_buffers(recurse=False)):
            converted[f"{prefix}{name}"] = tensor.detach().clone()
    for key, tensor in state_dict.items():
        if key not in consumed:
            converted[key] = tensor
    return converted
