"""The ConvNN layers as torch.nn.Modules.

Each module owns its parameters and buffers; everything else is the C++ library's. Building a
layer calls the C++ module's own construction (torch.ops.convnn.layer_parameters), so the
state_dict keys, shapes and initialisation are the C++ ones and draw from the same global random
generator; forward calls the C++ forward on these tensors (torch.ops.convnn.layer_forward), a
composite op that autograd, torch.compile and torch.export see through.
"""
import inspect

import torch
from torch import nn

from .._options import layer_fields

_ops = torch.ops.convnn


class _Tensors(nn.Module):
    """A sub-layer's parameters under the C++ module's names (e.g. query_projection.weight)."""


class _ConvNNLayer(nn.Module):
    _layer = ""  # the C++ layer's name

    def __init__(self, *args, device=None, dtype=None, **kwargs):
        super().__init__()
        name = type(self).__name__
        self.options = layer_fields(self._layer).bind(name, args, kwargs)
        self._texts = layer_fields(self._layer).texts(self.options)
        names, tensors, trainable = _ops.layer_parameters(self._layer, self._texts)
        for full_name, tensor, is_parameter in zip(names, tensors, trainable):
            owner, leaf = self._owner_of(full_name)
            tensor = tensor.to(device=device, dtype=dtype)
            if is_parameter:
                owner.register_parameter(leaf, nn.Parameter(tensor))
            else:
                owner.register_buffer(leaf, tensor)
        # The layer's own generator for random candidates when a seed is given (as in C++);
        # otherwise the default one.
        seed = self.options.get("seed")
        self._generator = None if seed is None else torch.Generator().manual_seed(seed)

    def _owner_of(self, full_name):
        *path, leaf = full_name.split(".")
        owner = self
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, _Tensors())
            owner = getattr(owner, part)
        return owner, leaf

    def _call(self, input, mask=None):
        state = list(self.named_parameters()) + list(self.named_buffers())
        return _ops.layer_forward(self._layer, self._texts, input, [n for n, _ in state], [t for _, t in state],
                                  self.training, self._generator, mask)

    def extra_repr(self):
        shown = [repr(self.options[name]) for name in layer_fields(self._layer).required]
        fields = layer_fields(self._layer)
        shown += [f"{name}={value!r}" for name, value in self.options.items()
                  if name not in fields.required and value != fields.defaults[name]]
        return ", ".join(shown)


def _with_signature(cls):
    """Gives the class the C++ options as its constructor signature (help(), IDEs)."""
    fields = layer_fields(cls._layer)
    device = inspect.Parameter("device", inspect.Parameter.KEYWORD_ONLY, default=None)
    dtype = inspect.Parameter("dtype", inspect.Parameter.KEYWORD_ONLY, default=None)
    cls.__signature__ = fields.signature(trailing=(device, dtype))
    return cls


@_with_signature
class ConvNN1d(_ConvNNLayer):
    """ConvNN on [B, C, L] -> [B, C', L]: ConvNN1d(in_channels, out_channels, k, **options)."""
    _layer = "ConvNN1d"

    def forward(self, input):
        return self._call(input)


@_with_signature
class ConvNN2d(_ConvNNLayer):
    """ConvNN on [B, C, H, W] -> [B, C', H, W]: ConvNN2d(in_channels, out_channels, k, **options)."""
    _layer = "ConvNN2d"

    def forward(self, input):
        return self._call(input)


@_with_signature
class ConvNNAttention(_ConvNNLayer):
    """Multi-head ConvNN attention on [B, N, C] -> [B, N, C]: ConvNNAttention(embed_dim, num_heads,
    k, **options). `mask` is an optional fixed [N, N] mask (bool: True may be selected, or
    additive), combined with causal=True when both are given."""
    _layer = "ConvNNAttention"

    def forward(self, input, mask=None):
        return self._call(input, mask)


@_with_signature
class BranchingConv2d(_ConvNNLayer):
    """The hybrid branching layer on [B, C, H, W] -> [B, C', H, W]: a ConvNN branch with
    round(lambda * out_channels) channels and a convolution branch, mixed by a 1x1 convolution.
    BranchingConv2d(in_channels, out_channels, lambda_=0.5, k=9, **options of the ConvNN branch)
    (C++'s `lambda`, a Python keyword, is `lambda_`)."""
    _layer = "BranchingConv2d"

    def forward(self, input):
        return self._call(input)
