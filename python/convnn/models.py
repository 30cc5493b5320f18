"""The convnn models by name, as the C++ registry builds them: create_model(name, **options) with
the model options of `convnn info` (e.g. create_model("resnet50", layer="branching", k=9)).

The C++ registry builds the model once (torch.ops.convnn.model_build) and reports its module tree
(each module's path, kind and constructor arguments) and its initialised tensors; Python builds the
same tree from torch.nn layers and convnn.nn layers and loads the tensors. So every choice (which
slots hold ConvNN or branching layers, strides, widths, the paper variants, the initialisation) is
the C++ one, and the state_dict keys are the C++ ones.
"""
import json
import math
import os
import typing

import torch
import torch.fx
import torch.utils.checkpoint
from torch import nn

from . import _library
from .nn.kv_cache import KVCache
from .nn.modules import BranchingConv2d, ConvNN2d, ConvNNAttention

_ops = torch.ops.convnn


class _GradCheckpointing:
    """timm's set_grad_checkpointing: each block's activations are recomputed in backward instead
    of stored (torch.utils.checkpoint, non-reentrant, which restores the default generator; the
    ConvNN layers replay their own generators), with the gradients of the plain run."""

    grad_checkpointing = False

    def set_grad_checkpointing(self, enable=True):
        self.grad_checkpointing = bool(enable)

    def _block(self, block, x):
        if self.grad_checkpointing and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return block(x)


class ResidualBlock(nn.Module):
    """torchvision's BasicBlock / Bottleneck: conv, norm (ReLU between), plus the shortcut."""

    def forward(self, x):
        out = x
        count = len([name for name in self._modules if name.startswith("conv")])
        for i in range(1, count + 1):
            out = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(out))
            if i < count:
                out = torch.relu(out)
        shortcut = self.downsample(x) if "downsample" in self._modules else x
        return torch.relu(out + shortcut)


def _take_indices(count, indices):
    """timm's feature_take_indices: the features to keep of `count` (None: all; an int n: the last
    n; a sequence: those positions, negative ones from the end), and the largest."""
    if indices is None:
        indices = count
    if isinstance(indices, int):
        if not 0 < indices <= count:
            raise ValueError(f"indices = {indices}: the last n features must have n in [1, {count}]")
        taken = list(range(count - indices, count))
    else:
        taken = []
        for index in indices:
            absolute = count + index if index < 0 else index
            if not 0 <= absolute < count:
                raise ValueError(f"indices: feature {index} is out of range (there are {count}, 0 to {count - 1})")
            taken.append(absolute)
        if not taken:
            raise ValueError("indices: an empty sequence takes no feature")
    return taken, max(taken)


def _pool(x, pool, dims):
    """timm's global pooling over `dims`: avg, max, avgmax; '' pools nothing."""
    if pool == "avg":
        return x.mean(dims)
    if pool == "max":
        return x.amax(dims)
    if pool == "avgmax":
        return 0.5 * (x.mean(dims) + x.amax(dims))
    return x


def _new_head(old, in_features, num_classes):
    """timm's reset_classifier head: Linear(in_features, num_classes) (torch's initialisation) on the
    old head's device and dtype, or Identity for num_classes 0."""
    if num_classes == 0:
        return nn.Identity()
    reference = next(old.parameters(), None)
    kwargs = {} if reference is None else dict(device=reference.device, dtype=reference.dtype)
    return nn.Linear(in_features, num_classes, **kwargs)


def _check_pool(model, global_pool, allowed):
    if global_pool not in allowed:
        raise ValueError(f"{type(model).__name__}: global_pool must be one of "
                         f"{', '.join(repr(p) for p in allowed)}, got {global_pool!r}")


class ResNet(_GradCheckpointing, nn.Module):
    """ResNet-18/34/50 (torchvision's layout); images [B, C, H, W] -> logits [B, classes].

    timm's model interface: forward_features (the last stage's map), forward_head(x, pre_logits),
    get_classifier / reset_classifier(num_classes, global_pool), forward_intermediates (five maps:
    the stem after its ReLU, then layer1-4), prune_intermediate_layers, feature_info,
    set_grad_checkpointing, no_weight_decay, group_matcher."""

    _POOLS = ("avg", "max", "avgmax", "")

    def _init_interface(self):
        self.num_classes = self.fc.out_features
        self.num_features = self.head_hidden_size = self.fc.in_features
        self.global_pool = "avg"
        # The stem's ReLU as a module (no state), so that a forward hook can tap the stem's map as
        # timm's ResNet names it (act1; timm's FeatureHookNet).
        self.act1 = nn.ReLU()
        # Each map's channels and stride: the stem's (and max pool's), then each stage's first block.
        reduction = self.conv1.stride[0]
        info = [dict(num_chs=self.bn1.num_features, reduction=reduction, module="act1")]
        if "maxpool" in self._modules:
            reduction *= self.maxpool.stride
        for stage in ("layer1", "layer2", "layer3", "layer4"):
            blocks = getattr(self, stage)
            if "downsample" in blocks[0]._modules:
                reduction *= blocks[0].downsample[0].stride[0]
            last = blocks[len(blocks) - 1]
            channels = [m.num_features for name, m in last.named_children() if name.startswith("bn")][-1]
            info.append(dict(num_chs=channels, reduction=reduction, module=stage))
        self.feature_info = info

    def _stem(self, images):
        return self.act1(self.bn1(self.conv1(images)))

    def _stage(self, name, x):
        stage = getattr(self, name)
        if not (self.grad_checkpointing and torch.is_grad_enabled()):
            return stage(x)  # the stage module itself (its blocks in order), so that its hooks fire
        for block in stage:
            x = self._block(block, x)
        return x

    def forward_features(self, images):
        """images [B, C, H, W] -> the last stage's map [B, num_features, H', W']."""
        x = self._stem(images)
        if "maxpool" in self._modules:
            x = self.maxpool(x)
        for stage in ("layer1", "layer2", "layer3", "layer4"):
            x = self._stage(stage, x)
        return x

    def forward_head(self, x, pre_logits=False):
        """The map [B, C, H, W] pooled (global_pool) to [B, C], then the classifier unless pre_logits."""
        x = _pool(x, self.global_pool, (2, 3))
        return x if pre_logits else self.fc(x)

    def forward(self, images):
        return self.forward_head(self.forward_features(images))

    def get_classifier(self):
        return self.fc

    def reset_classifier(self, num_classes, global_pool="avg"):
        """A new classifier of num_classes (0: none, forward returns the pooled features)."""
        global_pool = self.global_pool if global_pool is None else global_pool
        _check_pool(self, global_pool, self._POOLS)
        if global_pool == "" and num_classes > 0:
            raise ValueError("ResNet: global_pool '' (no pooling) leaves a map, which a classifier of "
                             f"num_classes = {num_classes} cannot take; use num_classes=0")
        self.global_pool, self.num_classes = global_pool, num_classes
        self.fc = _new_head(self.fc, self.num_features, num_classes)

    def forward_intermediates(self, x, indices=None, norm=False, stop_early=False, output_fmt="NCHW",
                              intermediates_only=False):
        """timm's forward_intermediates: the maps of `indices` among the five (0: the stem after
        its ReLU, 1-4: layer1-4; None: all, an int n: the last n), as [B, C, H, W]; with the final
        map unless intermediates_only. `norm` has no effect (a ResNet has no final norm), as in timm."""
        if output_fmt != "NCHW":
            raise ValueError(f"ResNet: output_fmt must be 'NCHW', got {output_fmt!r}")
        taken, last = _take_indices(5, indices)
        intermediates = []
        x = self._stem(x)
        if 0 in taken:
            intermediates.append(x)
        if "maxpool" in self._modules:
            x = self.maxpool(x)
        stages = ("layer1", "layer2", "layer3", "layer4")
        for i, stage in enumerate(stages[:last] if stop_early else stages, start=1):
            x = self._stage(stage, x)
            if i in taken:
                intermediates.append(x)
        return intermediates if intermediates_only else (x, intermediates)

    def prune_intermediate_layers(self, indices=1, prune_norm=False, prune_head=True):
        """Drops the stages after the last of `indices` (and the head): timm's features_only."""
        taken, last = _take_indices(5, indices)
        for stage in ("layer1", "layer2", "layer3", "layer4")[last:]:
            setattr(self, stage, nn.Sequential())
        if last == 0 and "maxpool" in self._modules:
            self.maxpool = nn.Identity()
        if last < 4:
            self.num_features = self.head_hidden_size = self.feature_info[last]["num_chs"]
        if prune_head or last < 4:
            self.reset_classifier(0, "")
        return taken

    def no_weight_decay(self):
        return set()

    def group_matcher(self, coarse=False):
        return dict(stem=r"^conv1|bn1|maxpool", blocks=r"^layer(\d+)" if coarse else r"^layer(\d+)\.(\d+)")


class SelfAttention(nn.Module):
    """Multi-head self-attention as timm builds it: fused qkv, scaled_dot_product_attention, proj.
    With grouped key/value heads the fused projection gives the queries, then num_kv_heads heads of
    keys, then of values; causal: each token attends to itself and the tokens before it."""

    def __init__(self, num_heads, dropout, num_kv_heads=None, causal=False):
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout
        self.num_kv_heads, self.causal = num_kv_heads or num_heads, causal

    def _project(self, x):
        b, n, c = x.shape
        d = c // self.num_heads
        q, k, v = self.qkv(x).split([c, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        return (q.view(b, n, self.num_heads, d).transpose(1, 2), k.view(b, n, self.num_kv_heads, d).transpose(1, 2),
                v.view(b, n, self.num_kv_heads, d).transpose(1, 2))

    def forward(self, x):
        q, k, v = self._project(x)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, None, self.dropout if self.training else 0.0, is_causal=self.causal,
            enable_gqa=self.num_kv_heads != self.num_heads)
        return self.proj(out.transpose(1, 2).reshape(x.shape))

    def make_cache(self, batch, max_length):
        """An empty key/value cache for forward_step (a convnn.nn.KVCache)."""
        d = self.qkv.in_features // self.num_heads
        return KVCache(batch, max_length, self.num_kv_heads, d, d, dtype=self.qkv.weight.dtype,
                       device=self.qkv.weight.device)

    def forward_step(self, x, cache, counts=None):
        """One decoding step (C++ SelfAttention.forward_step through the op convnn::self_attention_step):
        x [B, t, C] the next tokens of each sample attend to the cached ones and to each other causally,
        and are appended to the cache."""
        if not isinstance(cache, KVCache):
            raise TypeError(f"SelfAttention.forward_step: cache must be a convnn.nn.KVCache (make_cache), "
                            f"got {type(cache).__name__}")
        q, k, v = self._project(x)
        out, lengths = _ops.self_attention_step(q, k, v, cache.keys, cache.values, cache.lengths,
                                                list(counts) if counts is not None else [])
        cache.lengths = list(lengths)
        return self.proj(out.transpose(1, 2).reshape(x.shape))


class DropPath(nn.Module):
    """Stochastic depth: in training, drops a sample's residual branch with probability p."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        return x * torch.empty((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype, device=x.device).bernoulli_(
            keep).div_(keep)


class TransformerBlock(nn.Module):
    """x + DropPath(Dropout(Attention(LayerNorm(x)))), then x + DropPath(MLP(LayerNorm(x)))."""

    def forward(self, x):
        return self._mlp(x + self.drop_path(self.dropout(self.attn(self.norm1(x)))))

    def _mlp(self, x):
        mlp = self.fc2(self.dropout(torch.nn.functional.gelu(self.fc1(self.norm2(x)))))
        return x + self.drop_path(self.dropout(mlp))

    def make_cache(self, batch, max_length):
        return self.attn.make_cache(batch, max_length)

    def forward_step(self, x, cache):
        """One decoding step of a causal block: the attention's forward_step in place of its forward."""
        return self._mlp(x + self.drop_path(self.dropout(self.attn.forward_step(self.norm1(x), cache))))


class LanguageModel(nn.Module):
    """A decoder-only language model (C++ convnn::models::LanguageModel): token and position
    embeddings, causal pre-norm blocks (MHSA, KVT or ConvNN attention), a final LayerNorm and a
    linear head. forward(tokens [B, T]) -> logits [B, T, vocab_size]; make_caches and forward_step
    decode incrementally; generate samples (the C++ rule, convnn::sample_tokens)."""

    def __init__(self, context, vocab_size):
        super().__init__()
        self.context, self.vocab_size = context, vocab_size

    def _init_interface(self):
        self.num_classes = self.vocab_size
        self.embed_dim = self.token_embed.embedding_dim

    def _check_tokens(self, tokens, first_position=0, argument="tokens"):
        """The C++ model's rule (convnn::models::check_tokens): int64 [B, T], T >= 1, ids in [0,
        vocab_size), positions within the context."""
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"LanguageModel: {argument} must be an int64 tensor [B, T], got {type(tokens).__name__}")
        _ops.language_model_check_tokens(tokens, self.vocab_size, self.context, first_position, argument)

    def _logits(self, tokens, first_position, caches):
        x = self.token_embed(tokens) + self.pos_embed[:, first_position:first_position + tokens.shape[1]]
        x = self.pos_drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x) if caches is None else block.forward_step(x, caches[i])
        return self.head(self.norm(x))

    def forward(self, tokens):
        self._check_tokens(tokens)
        return self._logits(tokens, 0, None)

    def make_caches(self, batch, max_length=None):
        """One empty key/value cache per block, for `batch` samples of up to max_length tokens
        (default and at most: the context)."""
        max_length = self.context if max_length is None else max_length
        if not 1 <= max_length <= self.context:
            raise ValueError(f"LanguageModel: max_length must be in [1, context = {self.context}], got {max_length}")
        return [block.make_cache(batch, max_length) for block in self.blocks]

    def forward_step(self, tokens, caches):
        """The next tokens [B, t] after those the caches hold (as many for every sample) -> their
        logits [B, t, vocab_size], equal to those rows of forward on the whole prefix."""
        if len(caches) != len(self.blocks):
            raise ValueError(f"LanguageModel: forward_step needs one cache per block ({len(self.blocks)}), "
                             f"got {len(caches)} (make_caches makes them)")
        lengths = set(caches[0].lengths)
        if len(lengths) != 1:
            raise ValueError(f"LanguageModel: forward_step needs every sample's cache to hold as many tokens; "
                             f"they hold {sorted(lengths)}")
        first = lengths.pop()
        self._check_tokens(tokens, first)
        return self._logits(tokens, first, caches)

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, temperature=1.0, top_k=0, seed=0):
        """The prompts (int64 [B, P], or a str: its UTF-8 bytes) followed by max_new_tokens tokens
        sampled one at a time with the caches, as `convnn generate` samples them (C++ generate):
        softmax(logits / temperature) over the top_k most likely tokens (0: all; temperature 0: the
        most likely), drawn by a CPU generator seeded with `seed`; past the context the caches restart
        from the last context / 2 tokens. A str prompt gives the text back."""
        text = isinstance(prompts, str)
        if text:
            prompts = torch.tensor([list(prompts.encode("utf-8"))], dtype=torch.long)
        if text and self.vocab_size > 256:
            raise ValueError(f"generate: a str prompt is read as UTF-8 bytes (token ids 0 to 255), so it needs a "
                             f"byte-level model (vocab_size at most 256, as `convnn train` trains on text); this "
                             f"one's vocab_size is {self.vocab_size} (num_classes; create_model(name, "
                             f"num_classes=256) builds a byte-level one): pass the prompt as token ids")
        self._check_tokens(prompts, argument="prompts")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        device = self.head.weight.device
        generator = torch.Generator().manual_seed(seed)
        was_training = self.training
        self.eval()
        try:
            caches = self.make_caches(prompts.shape[0])
            tokens = prompts.to(device)
            logits = self.forward_step(tokens, caches)
            for i in range(max_new_tokens):
                following = _ops.sample_tokens(logits[:, -1], float(temperature), int(top_k), generator)[:, None]
                tokens = torch.cat([tokens, following], 1)
                if i + 1 == max_new_tokens:
                    break
                if caches[0].lengths[0] < self.context:
                    logits = self.forward_step(following, caches)
                    continue
                for cache in caches:
                    cache.reset()
                logits = self.forward_step(tokens[:, -_ops.generation_restart_tokens(self.context):], caches)
        finally:
            self.train(was_training)
        return bytes(tokens[0].tolist()).decode("utf-8", errors="replace") if text else tokens


def _check_images(images, channels, size):
    """Raises unless images is [B, channels, size, size]. A call that torch.fx records as one node
    (torch.fx.wrap below) instead of tracing into: its branch on the input's shape cannot be traced,
    and the check then runs whenever the traced module runs."""
    if images.dim() != 4 or tuple(images.shape[1:]) != (channels, size, size):
        raise ValueError(f"VisionTransformer: images must be [B, {channels}, {size}, {size}] "
                         f"(the position embedding fixes the size), got {tuple(images.shape)}")


torch.fx.wrap("_check_images")


def _check_dynamic_images(images, channels, patch):
    """Raises unless images is [B, channels, H, W] with H and W whole multiples of the patch size
    (a ViT built with dynamic_img_size). Recorded by torch.fx as one call, as _check_images."""
    if images.dim() != 4 or images.shape[1] != channels or images.shape[2] % patch or images.shape[3] % patch:
        raise ValueError(f"VisionTransformer: images must be [B, {channels}, H, W] with H and W multiples of the "
                         f"patch size {patch} (dynamic_img_size), got {tuple(images.shape)}")


torch.fx.wrap("_check_dynamic_images")


def resample_position_embedding(pos_embed, grid, prefix_tokens=1):
    """pos_embed [1, prefix_tokens + side*side, C] (a square grid of patches) for a grid of (rows,
    columns) patches: the patch part resampled bicubically with antialiasing in float32, the prefix
    (class) tokens kept; pos_embed itself where the grid is its own. The same resampling as timm's
    resample_abs_pos_embed, so weights move between sizes as they do in timm."""
    side = math.isqrt(pos_embed.shape[1] - prefix_tokens)
    if (int(grid[0]), int(grid[1])) == (side, side):
        return pos_embed
    patches = pos_embed[:, prefix_tokens:].float().reshape(1, side, side, -1).permute(0, 3, 1, 2)
    patches = torch.nn.functional.interpolate(patches, size=(int(grid[0]), int(grid[1])), mode="bicubic",
                                              antialias=True)
    patches = patches.permute(0, 2, 3, 1).reshape(1, -1, pos_embed.shape[-1]).to(pos_embed.dtype)
    return torch.cat([pos_embed[:, :prefix_tokens], patches], 1)


torch.fx.wrap("resample_position_embedding")


class VisionTransformer(_GradCheckpointing, nn.Module):
    """timm's layout: patch embedding, class token, position embedding, pre-norm blocks, head.

    timm's model interface: forward_features (every token, after the final norm), forward_head(x,
    pre_logits), get_classifier / reset_classifier(num_classes, global_pool), forward_intermediates
    (each block's tokens), prune_intermediate_layers, feature_info, set_grad_checkpointing,
    no_weight_decay (pos_embed, cls_token), group_matcher."""

    _POOLS = ("token", "avg", "max", "avgmax", "")
    num_prefix_tokens = 1
    # As timm's dynamic_img_size: images of any size whose sides are multiples of the patch size,
    # the position embedding resampled to their grid at each call (timm.create_model(...,
    # dynamic_img_size=True) sets it).
    dynamic_img_size = False

    def __init__(self, image_size, in_channels):
        super().__init__()
        self.image_size, self.in_channels = image_size, in_channels
        # A checkpoint of another image size loads with its position embedding resampled to this one's.
        self._register_load_state_dict_pre_hook(self._resample_loaded_position_embedding)

    def _resample_loaded_position_embedding(self, state_dict, prefix, *args):
        key = prefix + "pos_embed"
        own = self._parameters.get("pos_embed")
        if key in state_dict and own is not None and state_dict[key].shape != own.shape:
            loaded = state_dict[key]
            if loaded.dim() == 3 and loaded.shape[-1] == own.shape[-1]:  # else load_state_dict names the mismatch
                side = math.isqrt(own.shape[1] - self.num_prefix_tokens)
                state_dict[key] = resample_position_embedding(loaded, (side, side), self.num_prefix_tokens)

    def _init_interface(self):
        self.num_classes = self.head.out_features
        self.embed_dim = self.num_features = self.head_hidden_size = self.head.in_features
        self.global_pool = "token"
        self.patch_size = self.patch_embed.stride[0]
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=self.embed_dim, reduction=self.patch_size)
                             for i in range(len(self.blocks))]

    def _embed(self, images):
        if self.dynamic_img_size:
            _check_dynamic_images(images, self.in_channels, self.patch_size)
        else:
            _check_images(images, self.in_channels, self.image_size)
        x = self.patch_embed(images)
        pos_embed = self.pos_embed
        if self.dynamic_img_size:
            pos_embed = resample_position_embedding(pos_embed, x.shape[2:], self.num_prefix_tokens)
        x = x.flatten(2).transpose(1, 2)
        if "patch_norm" in self._modules:
            x = self.patch_norm(x)
        return self.pos_drop(torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + pos_embed)

    def _norm(self, x):
        return self.norm(x) if "norm" in self._modules else x

    def _tokens(self, images):
        x = self._embed(images)
        for block in self.blocks:
            x = self._block(block, x)
        return x

    def forward_features(self, images):
        """images [B, C, H, W] -> tokens [B, 1 + patches, embed_dim] (class token first), after the
        final norm (the paper variant has none)."""
        return self._norm(self._tokens(images))

    def forward_head(self, x, pre_logits=False):
        """Tokens [B, N, C] pooled (global_pool: the class token by default) to [B, C], then the head
        unless pre_logits."""
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool:
            x = _pool(x[:, self.num_prefix_tokens:], self.global_pool, 1)
        return x if pre_logits else self.head(x)

    def forward(self, images):
        if self.global_pool != "token":
            return self.forward_head(self.forward_features(images))
        # The class token alone through the final norm (a per-token LayerNorm): the C++ model's
        # computation, equal to forward_head(forward_features(images)).
        return self.head(self._norm(self._tokens(images).select(1, 0)))

    def get_classifier(self):
        return self.head

    def reset_classifier(self, num_classes, global_pool=None):
        """A new head of num_classes (0: none, forward returns the pooled features); global_pool
        None keeps the pooling."""
        if global_pool is not None:
            _check_pool(self, global_pool, self._POOLS)
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = _new_head(self.head, self.embed_dim, num_classes)

    def forward_intermediates(self, x, indices=None, return_prefix_tokens=False, norm=False, stop_early=False,
                              output_fmt="NCHW", intermediates_only=False, output_dict=False):
        """timm's forward_intermediates: the tokens after the blocks of `indices` (None: all, an
        int n: the last n), without the class token, as [B, C, H, W] maps (output_fmt 'NCHW') or
        [B, patches, C] ('NLC'); with norm, through the final norm. Returns them with the final
        tokens (after the norm) unless intermediates_only; return_prefix_tokens pairs each with
        its class token [B, 1, C]; output_dict returns timm's dict instead."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"VisionTransformer: output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        taken, last = _take_indices(len(self.blocks), indices)
        batch, rows, columns = x.shape[0], x.shape[2] // self.patch_size, x.shape[3] // self.patch_size
        x = self._embed(x)
        intermediates = []
        blocks = list(self.blocks)
        for i, block in enumerate(blocks[:last + 1] if stop_early else blocks):
            x = self._block(block, x)
            if i in taken:
                intermediates.append(self._norm(x) if norm else x)
        prefix = [y[:, :self.num_prefix_tokens] for y in intermediates]
        intermediates = [y[:, self.num_prefix_tokens:] for y in intermediates]
        if output_fmt == "NCHW":
            intermediates = [y.reshape(batch, rows, columns, -1).permute(0, 3, 1, 2).contiguous()
                             for y in intermediates]
        if output_dict:
            result = {"image_intermediates": intermediates}
            if return_prefix_tokens:
                result["image_intermediates_prefix"] = prefix
            if not intermediates_only:
                result["image_features"] = self._norm(x)
            return result
        if return_prefix_tokens:
            intermediates = list(zip(intermediates, prefix))
        return intermediates if intermediates_only else (self._norm(x), intermediates)

    def prune_intermediate_layers(self, indices=1, prune_norm=False, prune_head=True):
        """Drops the blocks after the last of `indices` (and the final norm, the head): timm's
        features_only."""
        taken, last = _take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:last + 1]
        if prune_norm and "norm" in self._modules:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return taken

    def no_weight_decay(self):
        """The class token and a learned position embedding (a sinusoidal one is a buffer)."""
        parameters = dict(self.named_parameters(recurse=False))
        return {name for name in ("pos_embed", "cls_token") if name in parameters}

    def group_matcher(self, coarse=False):
        return dict(stem=r"^cls_token|pos_embed|patch_embed|patch_norm",
                    blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])


def _on_meta(cls, **kwargs):
    """A torch.nn layer without its own initialisation (it would draw from the random generator
    that the C++ construction already used): built on the meta device, its tensors loaded after."""
    return cls(**kwargs, device="meta")


_BUILDERS = {
    "ResNet": lambda a: ResNet(),
    "ResidualBlock": lambda a: ResidualBlock(),
    "Sequential": lambda a: nn.Sequential(),
    "Conv2d": lambda a: _on_meta(nn.Conv2d, in_channels=a["in_channels"], out_channels=a["out_channels"],
                                 kernel_size=a["kernel_size"], stride=a["stride"], padding=a["padding"],
                                 bias=a["bias"]),
    "BatchNorm2d": lambda a: _on_meta(nn.BatchNorm2d, num_features=a["num_features"], eps=a["eps"],
                                      momentum=a["momentum"], affine=a["affine"],
                                      track_running_stats=a["track_running_stats"]),
    "MaxPool2d": lambda a: nn.MaxPool2d(a["kernel_size"], a["stride"], a["padding"]),
    "Linear": lambda a: _on_meta(nn.Linear, in_features=a["in_features"], out_features=a["out_features"],
                                 bias=a["bias"]),
    "LayerNorm": lambda a: _on_meta(nn.LayerNorm, normalized_shape=a["normalized_shape"], eps=a["eps"],
                                    elementwise_affine=a["elementwise_affine"]),
    "Dropout": lambda a: nn.Dropout(a["p"]),
    "DropPath": lambda a: DropPath(a["p"]),
    "SelfAttention": lambda a: SelfAttention(a["num_heads"], a["dropout"], a["num_kv_heads"], a["causal"]),
    "Embedding": lambda a: _on_meta(nn.Embedding, num_embeddings=a["num_embeddings"],
                                    embedding_dim=a["embedding_dim"]),
    "LanguageModel": lambda a: LanguageModel(a["context"], a["vocab_size"]),
    "TransformerBlock": lambda a: TransformerBlock(),
    "VisionTransformer": lambda a: VisionTransformer(a["image_size"], a["in_channels"]),
    "ModuleList": lambda a: nn.ModuleList(),
    "ConvNNAttention": lambda a: ConvNNAttention._from_option_texts(a["options"]),
    "ConvNN2d": lambda a: ConvNN2d._from_option_texts(a["options"]),
    "BranchingConv2d": lambda a: BranchingConv2d._from_option_texts(a["options"]),
}


_LAYERS = (ConvNN2d, BranchingConv2d, ConvNNAttention)


def _require_models():
    if not _library.has_models():
        raise RuntimeError("this convnn package was built without its models (nlohmann-json's headers "
                           "were missing at build time: install them, e.g. Debian's nlohmann-json3-dev, "
                           "and reinstall convnn)")


def model_table() -> typing.List[typing.Dict[str, typing.Any]]:
    """The C++ registry's rows, in order (what `convnn info --list --json` prints): dicts with the
    model's name, its family (a name of model_family_table()) and its preset (the sizes the name
    stands for)."""
    _require_models()
    return json.loads(_ops.model_table())


def model_family_table() -> typing.List[typing.Dict[str, typing.Any]]:
    """The C++ family rows, in order: dicts with the family's name and title, its own options, the
    option that picks its layer (its value without ConvNN, its ConvNN values), whether it is an
    image classifier (`convnn compare` has cells for it, on random candidates too where
    compare_random_candidates), and how timm lists it ("timm": variants, out_indices, first_conv, classifier,
    feature_map, dynamic_img_size; None for a family timm does not list)."""
    _require_models()
    return json.loads(_ops.model_family_table())


def model_names() -> typing.List[str]:
    """The registry's model names, in the table's order."""
    return [row["name"] for row in model_table()]


def create_model(name: str, **options: typing.Any) -> nn.Module:
    """The model `name` (one of model_names(): resnet18/34/50, vit_tiny/small/base/large, the
    language models lm_tiny/small) with the model options of `convnn info`; the names, options, defaults and checks are the C++ registry's
    (an unknown name is refused with the valid ones)."""
    _require_models()
    paths, kinds, arguments, names, tensors, trainable = _ops.model_build(name, json.dumps(options))
    root = None
    for path, kind, argument in zip(paths, kinds, arguments):
        module = _BUILDERS[kind](json.loads(argument))
        if not path:
            root = module
            continue
        parent_path, _, child = path.rpartition(".")
        parent = root.get_submodule(parent_path) if parent_path else root
        parent.add_module(child, module)
    # The C++ tensors, under the same names; the convnn layers already hold theirs.
    for tensor_name, tensor, is_parameter in zip(names, tensors, trainable):
        owner_path, _, leaf = tensor_name.rpartition(".")
        owner = root.get_submodule(owner_path) if owner_path else root
        if isinstance(owner, _LAYERS) or _inside_layer(root, owner_path):
            with torch.no_grad():
                _state_of(root, tensor_name).copy_(tensor)
            continue
        if is_parameter:
            setattr(owner, leaf, nn.Parameter(tensor))
        else:
            owner.register_buffer(leaf, tensor)
    root.model_name, root.options = name, options
    root._init_interface()
    return root


def _inside_layer(root, path):
    parts = path.split(".") if path else []
    for i in range(1, len(parts) + 1):
        if isinstance(root.get_submodule(".".join(parts[:i])), _LAYERS):
            return True
    return False


def _state_of(root, name):
    state = dict(root.named_parameters())
    state.update(dict(root.named_buffers()))
    return state[name]


class CheckpointError(ValueError):
    """A file that load_checkpoint refuses: not a convnn run's checkpoint, or one that the C++
    reader's checks refuse (the message names the file and the rule)."""


def load_checkpoint(path: typing.Union[str, os.PathLike], map_location: typing.Any = "cpu") -> nn.Module:
    """The model of a `convnn train` checkpoint, with its weights.

    The file is first put through the C++ reader's checks (torch.ops.convnn.check_torch_file, what
    `convnn eval` reads it with: only plain data, nesting and what shared references expand to
    bounded, every tensor within its record), without reading the tensors; only then is it read
    with ``torch.load(path, weights_only=True)``: a dict whose ``config`` names the run's model and
    its options (``config["model"]``, ``config["model_config"]``), which :func:`create_model`
    builds, and whose ``state_dict`` is then loaded strictly. The model is returned in training
    mode, as ``create_model`` returns it; call ``.eval()`` to evaluate. ``convnn eval`` also checks
    the file's CRC-32 checksums; this does not. A run directory stands for its
    ``checkpoint-latest.pt``, as it does for ``convnn eval --checkpoint``. A file refused for what
    it holds raises :class:`CheckpointError` (a ValueError).
    """
    _require_models()
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint-latest.pt")
    # Before anything unpickles it: torch.load would hand a TorchScript archive to torch.jit.load.
    if _ops.is_torchscript_archive(path):
        raise CheckpointError(
            f"checkpoint '{path}' is a TorchScript archive (a convnn checkpoint of format 1 or 2): "
            "opening one runs the code it may contain, so it is not opened. If you trust where the "
            f"file came from, convert it once: convnn checkpoint convert {path} NEW.pt --trust-legacy")
    try:
        _ops.check_torch_file(path)
    except RuntimeError as error:  # torch.load's unpickler would recurse or allocate without bound
        raise CheckpointError(f"checkpoint '{path}' cannot be read: {error}") from None
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch.load's own errors do not always name the file
        raise CheckpointError(f"checkpoint '{path}' cannot be read: {error}") from error
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("config"), dict):
        raise CheckpointError(f"checkpoint '{path}' is not a convnn run's checkpoint (it has no 'config' "
                              "naming the model): for weights alone, build the model with "
                              "convnn.models.create_model(name, **options) and call load_state_dict")
    config = checkpoint["config"]
    if not isinstance(config.get("model"), str) or not isinstance(config.get("model_config", {}), dict):
        raise CheckpointError(f"checkpoint '{path}' has a 'config' without the run's model: it must name the "
                              "model (config['model'], a string) and may give its options "
                              "(config['model_config'], a dict)")
    if not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(f"checkpoint '{path}' has no 'state_dict' (a dict of the model's tensors)")
    model = create_model(config["model"], **config.get("model_config", {}))
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as error:
        raise RuntimeError(f"checkpoint '{path}' does not fit its model {config['model']}: {error}") from error
    return model

