"""The convnn models in timm's model registry, registered when timm is installed (`import convnn`
does it): timm.create_model("convnn_vit_tiny_patch4", num_classes=10) and friends.

  convnn_vit_{tiny,small,base}_patch{4,16}  ViT with ConvNN attention (K = 9 by default); patch 4
                                            for 32 px images, patch 16 for 224 px
  convnn_resnet{18,34,50}                   ResNet with branching layers (K = 9, lambda 0.5)

timm's arguments map onto the model options of `convnn info`: num_classes, in_chans ->
in_channels, img_size -> image_size, drop_rate -> dropout, drop_path_rate -> drop_path; any other
keyword is a model option (e.g. k=16, attention="kvt"). There are no pretrained weights.
"""
import functools

from . import models

_TIMM_ARGUMENTS = {"in_chans": "in_channels", "img_size": "image_size", "drop_rate": "dropout",
                   "drop_path_rate": "drop_path"}

# name -> (registry model, its defaults)
_MODELS = {
    **{f"convnn_vit_{size}_patch{patch}": (f"vit_{size}", dict(attention="convnn", patch_size=patch,
                                                              image_size=32 if patch == 4 else 224))
       for size in ("tiny", "small", "base") for patch in (4, 16)},
    **{f"convnn_resnet{depth}": (f"resnet{depth}", dict(layer="branching")) for depth in (18, 34, 50)},
}


def _default_cfg(model_name, defaults):
    """timm's default config of a model: its input size and class count (no weights to fetch)."""
    size = defaults.get("image_size", 224)
    return {"url": "", "num_classes": 1000, "input_size": (3, size, size), "pool_size": None,
            "crop_pct": 1.0 if size <= 32 else 0.875, "interpolation": "bicubic",
            "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "patch_embed" if model_name.startswith("vit") else "conv1",
            "classifier": "head" if model_name.startswith("vit") else "fc"}


# Read by timm's register_model from this module (timm's convention).
default_cfgs = {name: _default_cfg(*entry) for name, entry in _MODELS.items()}


def _create(name, pretrained=False, pretrained_cfg=None, pretrained_cfg_overlay=None, **kwargs):
    if pretrained:
        raise ValueError(f"{name}: convnn has no pretrained weights; use pretrained=False")
    model_name, defaults = _MODELS[name]
    options = dict(defaults)
    for key, value in kwargs.items():
        if value is not None:
            options[_TIMM_ARGUMENTS.get(key, key)] = value
    model = models.create_model(model_name, **options)
    cfg = dict(default_cfgs[name])
    if pretrained_cfg is not None:
        cfg.update(pretrained_cfg.to_dict() if hasattr(pretrained_cfg, "to_dict") else dict(pretrained_cfg))
    cfg.update(pretrained_cfg_overlay or {})
    image_size, channels = options.get("image_size", 224), options.get("in_channels", 3)
    cfg.update(num_classes=options.get("num_classes", 1000), input_size=(channels, image_size, image_size))
    model.pretrained_cfg = model.default_cfg = cfg
    return model


def register():
    try:
        from timm.models import register_model
    except ImportError:
        return False
    for name in _MODELS:
        function = functools.partial(_create, name)
        function.__name__ = name
        function.__module__ = __name__
        register_model(function)
    return True
