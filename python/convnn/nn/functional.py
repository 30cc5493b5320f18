"""The ConvNN operator as functions (C++: convnn::nn::functional), through the dispatcher ops
torch.ops.convnn.conv_nn / conv_nn1d / conv_nn2d. Options are the C++ ConvNNFuncOptions: k
(required), similarity, heads, alpha, coordinates, padding, num_candidates, include_self,
slot_order, rho, temperature, kernel_per_head, fused; their defaults are C++'s
(convnn.nn.functional.option_defaults())."""
import torch

from .._options import functional_fields

_ops = torch.ops.convnn


def option_defaults():
    return dict(functional_fields().defaults)


def _texts(where, options):
    return functional_fields().texts(functional_fields().bind(where, (), options))


def conv_nn(queries, keys, values, kernel, bias=None, *, mask=None, coordinates=None, generator=None, **options):
    """ConvNN over tokens: queries [B,N,H*dq], keys [B,M,H*dq], values [B,M,H*dv] -> [B,N,H*dv']."""
    return _ops.conv_nn(queries, keys, values, kernel, bias, _texts("conv_nn", options), mask, coordinates,
                        generator)


def conv_nn1d(input, kernel, bias=None, *, generator=None, **options):
    """ConvNN on [B,C,L] with identity projections -> [B,C',L]."""
    return _ops.conv_nn1d(input, kernel, bias, _texts("conv_nn1d", options), generator)


def conv_nn2d(input, kernel, bias=None, *, generator=None, **options):
    """ConvNN on [B,C,H,W] with identity projections -> [B,C',H,W]."""
    return _ops.conv_nn2d(input, kernel, bias, _texts("conv_nn2d", options), generator)
