"""The ConvNN layers as torch.nn.Modules.

Each module owns its parameters and buffers; everything else is the C++ library's. Building a
layer calls the C++ module's own construction (torch.ops.convnn.layer_parameters), so the
state_dict keys, shapes and initialisation are the C++ ones and draw from the same global random
generator; the C++ sub-layers of LibTorch's Linear and ConvNd kinds are built as their torch.nn
counterparts holding those tensors (torch.ops.convnn.layer_submodules gives their kinds and
geometry). forward calls the C++ forward on these tensors (torch.ops.convnn.layer_forward), a
composite op that autograd, torch.compile and torch.export see through. record_neighbours, at the
end, collects what the layers of a whole model select (the Neighbours of neighbours.py).
"""
import contextlib
import inspect
import typing
import warnings

import torch
from torch import nn

from .._options import layer_fields
from .kv_cache import KVCache, StaticKVCache
from .neighbours import Neighbours

_ops = torch.ops.convnn


# TorchScript cannot carry the layers' option texts (a str[] argument of their dispatcher op) and is
# deprecated in PyTorch; torch.compile and torch.export trace the layers, dynamic shapes included.
_NO_TORCHSCRIPT = ("{name}: convnn layers do not support TorchScript ({how}); use torch.compile or "
                   "torch.export, which trace them (README, \"Using it from Python\")")


class _Tensors(nn.Module):
    """A sub-layer's parameters under the C++ module's names (e.g. query_projection.weight)."""

    def extra_repr(self):
        return ", ".join(f"{name}: {tuple(t.shape)}" for name, t in
                         list(self.named_parameters(recurse=False)) + list(self.named_buffers(recurse=False)))


# The torch.nn class of each sub-layer kind that convnn.layer_submodules lists, and its spatial axes.
_SUBMODULE_KINDS = {"linear": (nn.Linear, 0), "conv1d": (nn.Conv1d, 1), "conv2d": (nn.Conv2d, 2),
                    "conv3d": (nn.Conv3d, 3)}


def _as_module(holder, kind, geometry):
    """The nn.Linear or nn.ConvNd of the C++ sub-layer `kind` holding a _Tensors holder's weight and bias
    (the same Parameters); geometry: its stride, padding and dilation (a convolution's, per axis)."""
    cls, axes = _submodule_class(kind)
    weight, bias = holder.weight, holder._parameters.get("bias")
    if axes == 0:
        module = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    else:
        stride, padding, dilation = (tuple(geometry[i * axes:(i + 1) * axes]) for i in range(3))
        module = cls(weight.shape[1], weight.shape[0], tuple(weight.shape[2:]), stride=stride, padding=padding,
                     dilation=dilation, bias=bias is not None, device="meta")
    module.weight = weight
    if bias is not None:
        module.bias = bias
    return module


def _submodule_class(kind):
    """(torch.nn class, spatial axes) of a sub-layer kind."""
    if kind not in _SUBMODULE_KINDS:
        raise RuntimeError(f"convnn: the C++ layer has a sub-layer of kind '{kind}', which this package does not "
                           "build (a package older than its library?)")
    return _SUBMODULE_KINDS[kind]


def _plain_linear(module):
    """Whether `module` computes exactly F.linear(x, weight, bias): an nn.Linear itself (not a
    subclass, a wrapper or a LoRA layer), with no hook or parametrization of its own and no global
    module hook, so that a caller may use its weight and bias instead of calling it."""
    from torch.nn.utils import parametrize

    return type(module) is nn.Linear and not _has_hooks(module) and not parametrize.is_parametrized(module)


def _has_hooks(module):
    """Whether a module has a hook of its own, or a global module hook is set."""
    from torch.nn.modules import module as module_globals

    return any((module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks,
                module_globals._global_forward_hooks, module_globals._global_forward_pre_hooks,
                module_globals._global_backward_hooks, module_globals._global_backward_pre_hooks))


class _ConvNNLayer(nn.Module):
    _layer = ""  # the C++ layer's name
    _submodules = {}  # state_dict prefix -> kind of the sub-layers built as torch.nn modules (layer_submodules)
    # Called with the forward's Neighbours while they are recorded (record_neighbours,
    # forward_with_neighbours); None: forward keeps nothing.
    _neighbour_sink = None

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
        # The C++ sub-layers of LibTorch's Linear and ConvNd kinds become their torch.nn counterparts,
        # holding the same Parameters under the same state_dict keys.
        sub_names, kinds, geometry = _ops.layer_submodules(self._layer, self._texts)
        self._submodules = {}
        for name, kind in zip(sub_names, kinds):
            axes = _submodule_class(kind)[1]
            owner, leaf = self._owner_of(name)
            setattr(owner, leaf, _as_module(getattr(owner, leaf), kind, geometry[:3 * axes]))
            geometry = geometry[3 * axes:]
            self._submodules[name] = kind
        # The layer's own generator for random candidates when a seed is given (as in C++);
        # otherwise the default one.
        seed = self.options.get("seed")
        self._generator = None if seed is None else torch.Generator().manual_seed(seed)

    @classmethod
    def _from_option_texts(cls, texts):
        """The layer of these C++ option texts; its tensors are built without touching the global
        random generator (the caller loads the C++ model's)."""
        with torch.random.fork_rng(devices=[]):
            return cls(**layer_fields(cls._layer).from_texts(texts))

    def _owner_of(self, full_name):
        *path, leaf = full_name.split(".")
        owner = self
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, _Tensors())
            owner = getattr(owner, part)
        return owner, leaf

    def __prepare_scriptable__(self):
        raise RuntimeError(_NO_TORCHSCRIPT.format(name=type(self).__name__, how="torch.jit.script"))

    def _state(self):
        """(names, tensors) the C++ forward reads: the layer's parameters and buffers by their C++ names,
        and each sub-layer's weight and bias as its module would use them (_sub_layer_tensors)."""
        names, tensors = [], []
        for prefix, module in self.named_modules():
            if prefix in self._submodules:
                state = self._sub_layer_tensors(prefix, module)
            elif module is self or isinstance(module, _Tensors):
                state = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
            else:
                continue
            for leaf, tensor in state:
                names.append(f"{prefix}.{leaf}" if prefix else leaf)
                tensors.append(tensor)
        return names, tensors

    def _sub_layer_tensors(self, name, module):
        """[(leaf, tensor)]: the weight and bias that a sub-layer which the C++ forward runs would use if it
        were called: a parametrization's computed tensor, a pruning mask applied (torch.nn.utils.prune
        applies it in a forward pre-hook, which the C++ forward does not run). A replaced or wrapped
        sub-layer would be silently skipped, so it is refused; other hooks of its own are not called,
        which a warning says."""
        from torch.nn.utils import parametrize, prune

        cls, kind = _submodule_class(self._submodules[name])[0], parametrize.type_before_parametrizations(module)
        if kind is not cls:
            raise ValueError(
                f"{type(self).__name__}: its sub-layer {name} is a {kind.__name__}; the layer's C++ forward runs "
                f"{name} from its weight and bias, so it must be a plain {cls.__name__} module (a parametrization "
                "or pruning of its weight is honoured; wrapping or replacing it is not possible in this layer)")
        pruned = {hook._tensor_name: hook for hook in module._forward_pre_hooks.values()
                  if isinstance(hook, prune.BasePruningMethod)}
        if len(pruned) != len(module._forward_pre_hooks) or module._forward_hooks:
            warnings.warn(f"{type(self).__name__}: the forward hooks of its sub-layer {name} are not called: the "
                          f"layer's C++ forward runs {name} from its weight and bias", stacklevel=4)
        state = []
        for leaf in ("weight", "bias"):
            tensor = pruned[leaf].apply_mask(module) if leaf in pruned else getattr(module, leaf)
            if tensor is not None:
                state.append((leaf, tensor))
        return state

    def _call(self, input, mask=None, texts=None):
        names, tensors = self._state()
        arguments = (self._layer, texts or self._texts, input, names, tensors, self.training, self._generator, mask)
        if self._neighbour_sink is None or not self._selects_neighbours():
            return self._run(lambda: _ops.layer_forward(*arguments))
        return self._keep_neighbours(self._run(lambda: _ops.layer_forward_with_neighbours(*arguments)))

    def _selects_neighbours(self):
        """A branching layer without a ConvNN branch (lambda_=0) selects nothing."""
        return not self._layer.startswith("Branching") or "convnn_branch" in self._modules

    def _keep_neighbours(self, fields):
        output, *neighbours = fields
        self._neighbour_sink(Neighbours._from_op(neighbours))
        return output

    def forward_with_neighbours(self, *args, **kwargs) -> typing.Tuple[torch.Tensor, Neighbours]:
        """forward(*args, **kwargs), and what it selected: (output, Neighbours)."""
        if not self._selects_neighbours():
            raise ValueError(f"{type(self).__name__}: with lambda_=0 there is no ConvNN branch, so it selects "
                             "no neighbours")
        kept = []
        outer = self.__dict__.get("_neighbour_sink")  # a record_neighbours block around this call

        def sink(neighbours):
            kept.append(neighbours)
            if outer is not None:
                outer(neighbours)
        self._neighbour_sink = sink
        try:
            output = self(*args, **kwargs)
        finally:
            if outer is None:
                self.__dict__.pop("_neighbour_sink", None)
            else:
                self._neighbour_sink = outer
        return output, kept[-1]

    def _refuse_tracing(self):
        if torch.jit.is_tracing():
            raise RuntimeError(_NO_TORCHSCRIPT.format(name=type(self).__name__, how="torch.jit.trace"))

    def _run(self, forward):
        """forward() with the layer's random candidates drawn as activation checkpointing needs."""
        self._refuse_tracing()
        if self._generator is None:  # the default generator: torch.utils.checkpoint restores it
            return forward()
        with self._generator_replayed():
            return forward()

    @contextlib.contextmanager
    def _generator_replayed(self):
        """The layer's own generator as activation checkpointing needs it. torch.utils.checkpoint
        recomputes a forward during backward and restores only the default generators' states
        first, so a private generator would draw other random candidates in the recompute (other
        gradients, silently). So each forward outside backward keeps the generator's state, and a
        forward run during backward (the recompute) draws from that state and then leaves the
        generator where it was. Exact when the layer runs once per forward pass, the usual case;
        a layer called several times per pass replays its last call's draw."""
        generator = self._generator
        if torch._C._current_graph_task_id() == -1:  # not inside a backward pass
            self._forward_generator_state = generator.get_state()
            yield
            return
        stored = getattr(self, "_forward_generator_state", None)
        if stored is None:
            yield
            return
        after = generator.get_state()
        generator.set_state(stored)
        try:
            yield
        finally:
            generator.set_state(after)

    def extra_repr(self):
        shown = [repr(self.options[name]) for name in layer_fields(self._layer).required]
        fields = layer_fields(self._layer)
        shown += [f"{name}={value!r}" for name, value in self.options.items()
                  if name not in fields.required and value != fields.defaults[name]]
        return ", ".join(shown)


def _new_layer(cls):
    """An empty layer of `cls` that unpickling fills with its state."""
    return cls.__new__(cls)


# What each option does, for help(): prose only. The names, types, defaults and the similarity and
# rho values are read from the C++ library when the docstring is built.
_OPTION_DOCS = {
    "in_channels": "channels C of the input",
    "out_channels": "channels of the output",
    "embed_dim": "width C of the tokens [B, N, C]",
    "num_heads": "attention heads; embed_dim is split among them",
    "num_kv_heads": "key/value heads (0: num_heads); fewer, dividing num_heads, shares each among a group of "
                    "query heads (grouped-query attention; 1: multi-query)",
    "heads": "heads: the channels are split into this many groups, each selecting its own neighbours",
    "k": "K, the number of neighbours each position aggregates",
    "similarity": "how candidates are ranked against a query (one of: {similarities})",
    "coordinates": "append each position's coordinates to the features used for selection",
    "alpha": "weight of the coordinates against the features in the similarity",
    "padding": "zero padding of the spatial input on each side, as in nn.Conv2d",
    "stride": "queries on every stride-th position (an integer or one per axis): the output is downsampled as nn.Conv2d's",
    "dilation": "candidates on each query's dilated grid (an integer or one per axis), as nn.Conv2d's dilation",
    "num_candidates": "candidates drawn at random per forward (0: every position is a candidate)",
    "include_self": "a query is always among its own candidates",
    "eval_candidates": "in eval mode, the random candidates are fixed (drawn from eval_seed) or drawn anew",
    "eval_seed": "seed of the fixed candidates in eval mode",
    "seed": "seed of the layer's own generator for random candidates (None: the default generator)",
    "slot_order": "order of the K selected neighbours: by score, or by index (convolution's window order)",
    "rho": "rho, the weighting of the K selected neighbours' values by their scores (one of: {rhos})",
    "temperature": "scale of the scores before rho (e.g. softmax(score / temperature))",
    "aggregation": "standard (a C x C' kernel per slot, as a convolution) or depthwise (one weight per channel)",
    "learnable_kernel": "the aggregation kernel is a Parameter (else a fixed buffer)",
    "kernel_init": "initialisation of the aggregation kernel",
    "kernel_per_head": "one kernel per head instead of one shared by all heads",
    "fused": "use the fused kernels (False: the plain-ATen composition, for checking)",
    "bias": "add a learnable bias to the aggregated output",
    "projection": "features used for selection: the input itself (identity) or linear projections",
    "qk_channels": "channels of the query/key projections (0: in_channels)",
    "projection_bias": "the projections have a bias",
    "qkv_bias": "the query, key and value projections have a bias",
    "out_bias": "the output projection has a bias",
    "dropout": "dropout on the aggregated values, before the output projection",
    "causal": "a token may select only itself and earlier tokens",
    "lambda_": "share of the output channels given to the ConvNN branch (C++'s lambda)",
    "kernel_size": "kernel size of the convolution branch",
}


def _options_doc(cls):
    """The Options section of a layer's docstring, from the C++ field list."""
    fields = layer_fields(cls._layer)
    values = {"similarities": ", ".join(_ops.similarity_names()), "rhos": ", ".join(_ops.rho_names())}
    lines = ["", "    Options (the C++ layer's; required ones first, the others by keyword):"]
    for name in fields.names:
        default = "required" if name in fields.required else f"default {fields.defaults[name]!r}"
        what = _OPTION_DOCS.get(name, "").format(**values)
        lines.append(f"        {name} ({fields.types[name]}, {default}){': ' + what if what else ''}")
    return "\n".join(lines) + "\n"


def _with_signature(cls):
    """Gives the class the C++ options as its constructor signature and its docstring's Options
    section (help(), IDEs)."""
    fields = layer_fields(cls._layer)
    device = inspect.Parameter("device", inspect.Parameter.KEYWORD_ONLY, default=None)
    dtype = inspect.Parameter("dtype", inspect.Parameter.KEYWORD_ONLY, default=None)
    cls.__signature__ = fields.signature(trailing=(device, dtype))
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + _options_doc(cls)
    return cls


@_with_signature
class ConvNN1d(_ConvNNLayer):
    """ConvNN on [B, C, L] -> [B, C', L]: ConvNN1d(in_channels, out_channels, k, **options)."""
    _layer = "ConvNN1d"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """[B, C, L] (or [C, L]) -> [B, out_channels, L], in the input's dtype and memory format."""
        return self._call(input)


@_with_signature
class ConvNN2d(_ConvNNLayer):
    """ConvNN on [B, C, H, W] -> [B, C', H, W]: ConvNN2d(in_channels, out_channels, k, **options)."""
    _layer = "ConvNN2d"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] (or [C, H, W]) -> [B, out_channels, H, W], in the input's dtype and memory format."""
        return self._call(input)


@_with_signature
class ConvNN3d(_ConvNNLayer):
    """ConvNN on [B, C, D, H, W] -> [B, C', D, H, W]: ConvNN3d(in_channels, out_channels, k, **options).
    The tokens are the volume's voxels; coordinates have the same step on all three axes."""
    _layer = "ConvNN3d"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """[B, C, D, H, W] (or [C, D, H, W]) -> [B, out_channels, D, H, W], in the input's dtype and memory
        format."""
        return self._call(input)


@_with_signature
class ConvNNAttention(_ConvNNLayer):
    """Multi-head ConvNN attention on [B, N, C] -> [B, N, C]: ConvNNAttention(embed_dim, num_heads,
    k, **options).

    It is also timm's attention layer: timm's Block builds it as attn_layer(dim, num_heads=,
    qkv_bias=, qk_norm=, scale_norm=, proj_bias=, attn_drop=, proj_drop=, norm_layer=, device=,
    dtype=) and calls attn(x, attn_mask=, is_causal=). Give k (and any other option) with
    ConvNNAttention.with_options(k=9, ...), a subclass that timm can build:
    VisionTransformer(attn_layer=ConvNNAttention.with_options(k=9)). Of timm's arguments, qkv_bias
    is the option of that name, proj_bias sets out_bias, proj_drop is a dropout after the output
    projection (as in timm); qk_norm, scale_norm and attn_drop have no ConvNN counterpart and are
    refused unless off; norm_layer is used by timm only with those, and ignored.

    The projections query_projection, key_projection, value_projection and output_projection are
    nn.Linear modules, so timm's weight init, LoRA/PEFT, quantisation and type-based weight-decay
    rules see them. While the query, key and value projections are plain nn.Linear modules (no
    hook, no parametrization), forward runs them as one [3C, C] matrix product, as timm's fused
    qkv (the C++ layer's rule); a replaced, wrapped or hooked projection is called instead, so it
    takes effect. `proj` is the output projection under timm's name (timm's fix_init rescales
    attn.proj).
    """
    _layer = "ConvNNAttention"
    _bound = {}  # options fixed by with_options

    def __init__(self, *args, qk_norm=False, scale_norm=False, proj_bias=None, attn_drop=0.0, proj_drop=0.0,
                 norm_layer=None, device=None, dtype=None, **kwargs):
        for name, value in (("qk_norm", qk_norm), ("scale_norm", scale_norm)):
            if value:
                raise ValueError(f"ConvNNAttention: {name}=True is not supported (ConvNN attention has no "
                                 f"query/key normalisation); build the timm model with {name}=False")
        if attn_drop:
            raise ValueError(f"ConvNNAttention: attn_drop={attn_drop} is not supported (there are no attention "
                             "probabilities to drop); use the option dropout=p, applied to the aggregated output")
        options = {**self._bound, **kwargs}
        if proj_bias is not None:
            if "out_bias" in kwargs and kwargs["out_bias"] != proj_bias:
                raise ValueError(f"ConvNNAttention: proj_bias={proj_bias} contradicts out_bias={kwargs['out_bias']}")
            options["out_bias"] = proj_bias
        super().__init__(*args, device=device, dtype=dtype, **options)
        self.proj_drop = torch.nn.Dropout(proj_drop) if proj_drop else torch.nn.Identity()
        # The same layer with causal=true, for calls with is_causal=True (C++ combines the masks).
        self._causal_texts = layer_fields(self._layer).texts({**self.options, "causal": True})

    @classmethod
    def with_options(cls, **options):
        """A subclass whose constructor has these options fixed (e.g. k), for timm's attn_layer
        (timm wants a class). Its layers pickle as ConvNNAttention (see __reduce_ex__)."""
        return type(cls.__name__, (cls,), {"_bound": {**cls._bound, **options}, "__module__": cls.__module__})

    def __reduce_ex__(self, protocol):
        # A with_options subclass exists only in the process that made it, so pickle (torch.save of
        # a whole model) could not find it by name; its layers pickle as the named class they
        # derive from: the options are in the layer's state already.
        reduced = super().__reduce_ex__(protocol)
        if type(self) is ConvNNAttention:
            return reduced
        return (_new_layer, (ConvNNAttention,), *reduced[2:])

    def forward(self, x: torch.Tensor, attn_mask: typing.Optional[torch.Tensor] = None,
                is_causal: bool = False, key_padding_mask: typing.Optional[torch.Tensor] = None,
                cu_seqlens: typing.Optional[torch.Tensor] = None) -> torch.Tensor:
        """[B, N, embed_dim] (or [N, embed_dim]) -> the same shape (docs/sequences.md).

        attn_mask: [N, N], [B, N, N] or [B, num_heads, N, N] (B and num_heads may be 1), as
        scaled_dot_product_attention's: bool True = may be selected, or float added to the scores.
        is_causal adds the causal mask. key_padding_mask: [B, N] ([N] for one sample), as
        torch.nn.MultiheadAttention's: bool True = a padding key that no query selects, or float
        added to the scores. The masks combine; a query with fewer than k selectable keys follows
        the op's short-row rule (its remaining slots weigh 0).

        cu_seqlens: a packed batch of variable-length sequences, as FlashAttention's varlen
        functions take it: x is [T, embed_dim], the sequences' tokens concatenated, and cu_seqlens
        [S + 1] (int64 or int32) their offsets 0, ..., T. Each query selects among its own
        sequence's keys (is_causal within it), equal to running each sequence alone; the masks must
        then be None."""
        self._refuse_tracing()
        texts = self._causal_texts if is_causal else self._texts
        if cu_seqlens is not None:
            return self._forward_packed(texts, x, cu_seqlens, attn_mask, key_padding_mask)
        _ops.attention_check_input(texts, x, self.kernel)
        state = list(self.named_parameters(recurse=False)) + list(self.named_buffers(recurse=False))

        record = self._neighbour_sink is not None

        def aggregate():
            op = _ops.attention_aggregate_with_neighbours if record else _ops.attention_aggregate
            qkv = self._project_qkv(x)  # indexed, not unpacked: torch.fx cannot iterate a traced tuple
            return op(texts, qkv[0], qkv[1], qkv[2], [n for n, _ in state], [t for _, t in state], self.training,
                      self._generator, attn_mask, key_padding_mask)
        aggregated = self._run(aggregate)
        if record:
            aggregated = self._keep_neighbours(aggregated)
        return self.proj_drop(self.output_projection(aggregated))

    def make_cache(self, batch: int, max_length: int, static: bool = False) -> typing.Union[KVCache, StaticKVCache]:
        """An empty key/value cache for forward_step: `batch` samples of up to `max_length` tokens
        in num_kv_heads heads of head_dim (C++'s rule), the parameters' dtype and device. static:
        a StaticKVCache, whose step has fixed shapes (torch.compile compiles it once, CUDA graphs)."""
        weight = self.key_projection.weight
        kind = StaticKVCache if static else KVCache
        return kind(batch, max_length, *_ops.attention_cache_geometry(self._texts), dtype=weight.dtype,
                    device=weight.device)

    def forward_step(self, x: torch.Tensor, cache: typing.Union[KVCache, StaticKVCache],
                     counts: typing.Optional[typing.Sequence[int]] = None) -> torch.Tensor:
        """One decoding step, causal whatever the causal option says: x [B, t, embed_dim] are the
        next t tokens of each sample (sample b's first counts[b] of them; all t when counts is None),
        which attend to the sample's cached tokens and to each other causally; their keys and values
        are appended to the cache (detached). Equal to those rows of the causal forward on the whole
        prefix, at O(t * (M * d + K * d)) for M cached tokens with a KVCache; with a StaticKVCache
        (every sample advances by t) at O(t * max_length * d), with shapes that do not depend on the
        lengths (torch.compile compiles it once; docs/sequences.md)."""
        if not isinstance(cache, (KVCache, StaticKVCache)):
            raise TypeError(f"ConvNNAttention.forward_step: cache must be a convnn.nn.KVCache or StaticKVCache "
                            f"(make_cache(batch, max_length)), got {type(cache).__name__}")
        self._refuse_tracing()
        _ops.attention_check_input(self._causal_texts, x, self.kernel)
        state = list(self.named_parameters(recurse=False)) + list(self.named_buffers(recurse=False))
        qkv = self._project_qkv(x)
        if isinstance(cache, StaticKVCache):
            if counts is not None:
                raise ValueError("ConvNNAttention.forward_step: a StaticKVCache advances every sample by the step's "
                                 "t tokens; counts must be None (use a KVCache for per-sample counts)")
            aggregated = _ops.attention_static_step(
                self._causal_texts, qkv[0], qkv[1], qkv[2], [n for n, _ in state], [t for _, t in state],
                self.training, cache.keys, cache.values, cache.lengths)
            return self.proj_drop(self.output_projection(aggregated))
        aggregated, lengths = _ops.attention_step(
            self._causal_texts, qkv[0], qkv[1], qkv[2], [n for n, _ in state], [t for _, t in state], self.training,
            cache.keys, cache.values, cache.lengths, list(counts) if counts is not None else [])
        cache.lengths = list(lengths)
        return self.proj_drop(self.output_projection(aggregated))

    def _forward_packed(self, texts, x, cu_seqlens, attn_mask, key_padding_mask):
        for name, mask in (("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask)):
            if mask is not None:
                raise ValueError(f"ConvNNAttention: {name} must be None with cu_seqlens (a packed batch: each query "
                                 "sees its own sequence's keys; is_causal applies within it)")
        if self._neighbour_sink is not None:
            raise ValueError("ConvNNAttention: recording neighbours is not supported on a packed batch (cu_seqlens); "
                             "record them on a padded [B, N, C] batch")
        state = list(self.named_parameters(recurse=False)) + list(self.named_buffers(recurse=False))
        qkv = self._project_qkv(x)
        aggregated = _ops.attention_aggregate_packed(texts, qkv[0], qkv[1], qkv[2], [n for n, _ in state],
                                                     [t for _, t in state], self.training, cu_seqlens)
        return self.proj_drop(self.output_projection(aggregated))

    def _project_qkv(self, x):
        """(queries, keys, values): the C++ layer's projection rule (one [3C, C] product where the
        weights allow, as timm's qkv) where the three projections are plain nn.Linear modules; else
        each module, so that a replaced, wrapped or hooked projection (LoRA, quantisation) takes effect."""
        projections = (self.query_projection, self.key_projection, self.value_projection)
        if not all(_plain_linear(p) for p in projections):
            return tuple(p(x) for p in projections)
        return _ops.attention_project_qkv(x, *(t for p in projections for t in (p.weight, p.bias)))

    @property
    def proj(self):
        """The output projection under timm's name (timm's fix_init reads attn.proj.weight)."""
        return self.output_projection


@_with_signature
class BranchingConv2d(_ConvNNLayer):
    """The hybrid branching layer on [B, C, H, W] -> [B, C', H, W]: a ConvNN branch with
    round(lambda * out_channels) channels and a convolution branch, mixed by a 1x1 convolution.
    BranchingConv2d(in_channels, out_channels, lambda_=0.5, k=9, **options of the ConvNN branch)
    (C++'s `lambda`, a Python keyword, is `lambda_`)."""
    _layer = "BranchingConv2d"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] (or [C, H, W]) -> [B, out_channels, H, W], in the input's dtype and memory format."""
        return self._call(input)


@_with_signature
class BranchingConv3d(_ConvNNLayer):
    """The hybrid branching layer on volumes [B, C, D, H, W] -> [B, C', D, H, W]: a ConvNN3d branch
    with round(lambda * out_channels) channels and a 3x3x3 convolution branch, mixed by a 1x1x1
    convolution. BranchingConv3d(in_channels, out_channels, lambda_=0.5, k=27, **options of the
    ConvNN branch) (C++'s `lambda`, a Python keyword, is `lambda_`)."""
    _layer = "BranchingConv3d"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """[B, C, D, H, W] (or [C, D, H, W]) -> [B, out_channels, D, H, W], in the input's dtype and memory
        format."""
        return self._call(input)


@contextlib.contextmanager
def record_neighbours(module: torch.nn.Module) -> typing.Iterator[typing.Dict[str, Neighbours]]:
    """Records what every ConvNN layer in `module` selects while the block runs::

        with convnn.nn.record_neighbours(model) as neighbours:
            model(images)
        neighbours["layer1.0.conv1"].indices

    The dict maps each layer that ran to its Neighbours by its module path ("" for `module`
    itself), in the order they first ran (a layer run several times: its last run). Outside the
    block, forward records nothing and costs nothing more."""
    recorded: typing.Dict[str, Neighbours] = {}
    layers = [(name, m) for name, m in module.named_modules() if isinstance(m, _ConvNNLayer)]
    previous = [layer.__dict__.get("_neighbour_sink") for _, layer in layers]
    for name, layer in layers:
        layer._neighbour_sink = (lambda path: lambda n: recorded.__setitem__(path, n))(name)
    try:
        yield recorded
    finally:
        for (_, layer), sink in zip(layers, previous):
            if sink is None:
                layer.__dict__.pop("_neighbour_sink", None)
            else:
                layer._neighbour_sink = sink
