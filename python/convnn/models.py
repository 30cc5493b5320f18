"""The convnn models by name, as the C++ registry builds them: create_model(name, **options) with
the model options of `convnn info` (e.g. create_model("resnet50", layer="branching", k=9)).

The C++ registry builds the model once (torch.ops.convnn.model_build) and reports its module tree
(each module's path, kind and constructor arguments) and its initialised tensors; Python builds the
same tree from torch.nn layers and convnn.nn layers and loads the tensors. So every choice (which
slots hold ConvNN or branching layers, strides, widths, the paper variants, the initialisation) is
the C++ one, and the state_dict keys are the C++ ones.
"""
import json
import os
import zipfile

import torch
import torch.utils.checkpoint
from torch import nn

from . import _library
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


class ResNet(_GradCheckpointing, nn.Module):
    """ResNet-18/34/50 (torchvision's layout); images [B, C, H, W] -> logits [B, classes]."""

    def forward(self, images):
        x = torch.relu(self.bn1(self.conv1(images)))
        if "maxpool" in self._modules:
            x = self.maxpool(x)
        for stage in ("layer1", "layer2", "layer3", "layer4"):
            for block in getattr(self, stage):
                x = self._block(block, x)
        return self.fc(x.mean((2, 3)))


class SelfAttention(nn.Module):
    """Multi-head self-attention as timm builds it: fused qkv, scaled_dot_product_attention, proj."""

    def __init__(self, num_heads, dropout):
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, None, self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


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
        x = x + self.drop_path(self.dropout(self.attn(self.norm1(x))))
        mlp = self.fc2(self.dropout(torch.nn.functional.gelu(self.fc1(self.norm2(x)))))
        return x + self.drop_path(self.dropout(mlp))


class VisionTransformer(_GradCheckpointing, nn.Module):
    """timm's layout: patch embedding, class token, position embedding, pre-norm blocks, head."""

    def __init__(self, image_size, in_channels):
        super().__init__()
        self.image_size, self.in_channels = image_size, in_channels

    def forward(self, images):
        expected = (self.in_channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"VisionTransformer: images must be [B, {expected[0]}, {expected[1]}, {expected[2]}] "
                             f"(the position embedding fixes the size), got {tuple(images.shape)}")
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        if "patch_norm" in self._modules:
            x = self.patch_norm(x)
        x = self.pos_drop(torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed)
        for block in self.blocks:
            x = self._block(block, x)
        cls = x.select(1, 0)
        if "norm" in self._modules:
            cls = self.norm(cls)
        return self.head(cls)


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
    "SelfAttention": lambda a: SelfAttention(a["num_heads"], a["dropout"]),
    "TransformerBlock": lambda a: TransformerBlock(),
    "VisionTransformer": lambda a: VisionTransformer(a["image_size"], a["in_channels"]),
    "ModuleList": lambda a: nn.ModuleList(),
    "ConvNNAttention": lambda a: ConvNNAttention._from_option_texts(a["options"]),
    "ConvNN2d": lambda a: ConvNN2d._from_option_texts(a["options"]),
    "BranchingConv2d": lambda a: BranchingConv2d._from_option_texts(a["options"]),
}


_LAYERS = (ConvNN2d, BranchingConv2d, ConvNNAttention)


def model_names():
    return list(_ops.model_names())


def create_model(name, **options):
    """The model `name` (resnet18/34/50, vit_tiny/small/base) with the model options of `convnn
    info`; the options' names, defaults and checks are the C++ registry's."""
    if not _library.has_models():
        raise RuntimeError("this convnn package was built without its models (nlohmann-json's headers "
                           "were missing at build time: install them, e.g. Debian's nlohmann-json3-dev, "
                           "and reinstall convnn)")
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


def load_checkpoint(path, map_location="cpu"):
    """The model of a `convnn train` checkpoint, with its weights.

    The file is read with ``torch.load(path, weights_only=True)``: a dict whose ``config`` names
    the run's model and its options (``config["model"]``, ``config["model_config"]``), which
    :func:`create_model` builds, and whose ``state_dict`` is then loaded strictly. The model is
    returned in training mode, as ``create_model`` returns it; call ``.eval()`` to evaluate.
    ``convnn eval`` also checks the file's CRC-32 checksums; this does not. A run directory stands
    for its ``checkpoint-latest.pt``, as it does for ``convnn eval --checkpoint``.
    """
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint-latest.pt")
    # Before torch.load, which would hand a TorchScript archive to torch.jit.load.
    if _is_torchscript_archive(path):
        raise RuntimeError(
            f"checkpoint '{path}' is a TorchScript archive (a convnn checkpoint of format 1 or 2): "
            "opening one runs the code it may contain, so it is not opened. If you trust where the "
            f"file came from, convert it once: convnn checkpoint convert {path} NEW.pt --trust-legacy")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch.load's own errors do not always name the file
        raise RuntimeError(f"checkpoint '{path}' cannot be read: {error}") from error
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("config"), dict):
        raise ValueError(f"checkpoint '{path}' is not a convnn run's checkpoint (it has no 'config' "
                         "naming the model): for weights alone, build the model with "
                         "convnn.models.create_model(name, **options) and call load_state_dict")
    config = checkpoint["config"]
    model = create_model(config["model"], **config["model_config"])
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as error:
        raise RuntimeError(f"checkpoint '{path}' does not fit its model {config['model']}: {error}") from error
    return model


def _is_torchscript_archive(path):
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/constants.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
