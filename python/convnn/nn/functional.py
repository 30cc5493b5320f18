"""The ConvNN operator as functions (C++: convnn::nn::functional), through the dispatcher ops
torch.ops.convnn.conv_nn / conv_nn1d / conv_nn2d / conv_nn3d. Options are the C++ ConvNNFuncOptions: k
(required), similarity, heads, kv_heads, alpha, coordinates, padding, num_candidates, include_self,
slot_order, rho, temperature, kernel_per_head, fused; their defaults are C++'s
(convnn.nn.functional.option_defaults())."""
import typing

import torch

from .._options import functional_fields

_ops = torch.ops.convnn

# The fields are read from C++ (a dispatcher op returning strings) here, at import, and never while
# a caller is traced: torch.export's non-strict tracer cannot carry an op's string outputs.
_FIELDS = functional_fields()


def option_defaults():
    return dict(_FIELDS.defaults)


# The "name=value" texts of a call's options, with C++'s defaults filled in; C++ parses and validates
# them when the op runs. Marked a constant result so that torch.compile and strict torch.export run
# it once at trace time, on the (constant) option values, and put the texts into the graph as
# constants: tracing through it would meet inspect's signature binding, which Dynamo cannot trace
# ("Unexpected type in sourceless builder"). This rather than a cache keyed by the options: Dynamo
# would still trace the cache's lookup, and a miss would run the binding inside the traced code.
# Eagerly and under non-strict export it is plain Python on plain values.
def _assume_constant_result(fn):
    """torch.compiler.assume_constant_result's mark (Dynamo reads the attribute when it meets the
    function) without importing Dynamo at convnn's import, which costs about half a second;
    test_compile.py checks that torch's decorator sets exactly this."""
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result
def _option_texts(where, options):
    return _FIELDS.texts(_FIELDS.bind(where, (), options))


def _texts(where, options):
    if torch.compiler.is_compiling():
        from torch.fx.experimental.symbolic_shapes import guard_scalar  # loaded by the compiler already

        # An option passed into the compiled function (k=k) becomes a SymInt once Dynamo has seen
        # two values of it, and a constant-result function takes constants only: guard_scalar
        # makes it one again (a new value compiles a new graph, as any Python constant does).
        def constant(value):
            if isinstance(value, (tuple, list)):  # per-axis values (stride, dilation)
                return tuple(constant(item) for item in value)
            return value if value is None or isinstance(value, str) else guard_scalar(value)

        options = {name: constant(value) for name, value in options.items()}
    return _option_texts(where, options)


def conv_nn(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kernel: torch.Tensor, bias: typing.Optional[torch.Tensor] = None, *, mask: typing.Optional[torch.Tensor] = None,
            coordinates: typing.Optional[torch.Tensor] = None, generator: typing.Optional[torch.Generator] = None, **options: typing.Any) -> torch.Tensor:
    """ConvNN over tokens: queries [B,N,H*dq], keys [B,M,Hkv*dq], values [B,M,Hkv*dv] -> [B,N,H*dv'],
    with H = heads and Hkv = kv_heads (0: heads; fewer is grouped-query attention)."""
    return _ops.conv_nn(queries, keys, values, kernel, bias, _texts("conv_nn", options), mask, coordinates,
                        generator)


def conv_nn1d(input: torch.Tensor, kernel: torch.Tensor, bias: typing.Optional[torch.Tensor] = None, *, generator: typing.Optional[torch.Generator] = None,
              **options: typing.Any) -> torch.Tensor:
    """ConvNN on [B,C,L] with identity projections -> [B,C',L]."""
    return _ops.conv_nn1d(input, kernel, bias, _texts("conv_nn1d", options), generator)


def conv_nn2d(input: torch.Tensor, kernel: torch.Tensor, bias: typing.Optional[torch.Tensor] = None, *, generator: typing.Optional[torch.Generator] = None,
              **options: typing.Any) -> torch.Tensor:
    """ConvNN on [B,C,H,W] with identity projections -> [B,C',H,W]."""
    return _ops.conv_nn2d(input, kernel, bias, _texts("conv_nn2d", options), generator)


def conv_nn3d(input: torch.Tensor, kernel: torch.Tensor, bias: typing.Optional[torch.Tensor] = None, *, generator: typing.Optional[torch.Generator] = None,
              **options: typing.Any) -> torch.Tensor:
    """ConvNN on [B,C,D,H,W] with identity projections -> [B,C',D,H,W]."""
    return _ops.conv_nn3d(input, kernel, bias, _texts("conv_nn3d", options), generator)
