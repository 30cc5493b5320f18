"""The convnn models in timm's model registry, registered when timm is installed (after `import
convnn`, at timm's first import, or at once if timm was imported first; `import convnn` itself does
not import timm, nor the Dynamo that timm imports): timm.create_model("convnn_vit_tiny_patch4",
num_classes=10) and friends.

The names come from the C++ registry's tables (convnn.models.model_table(), which `convnn info
--list` prints, and the family rows of convnn.models.model_family_table(), which say how timm lists
each family: its name suffixes and their defaults, its feature taps and timm config), by family:

  ViT     convnn_<name>_patch{4,16}  with ConvNN attention (K = 9 by default); patch 4 for 32 px
                                     images, patch 16 for 224 px (convnn_vit_large_patch16, ...)
  ResNet  convnn_<name>              with branching layers (K = 9, lambda 0.5)

The language models (family "lm") are not image classifiers: timm, an image library, does not list
them (convnn.models.create_model builds them).

timm's arguments map onto the model options of `convnn info`: num_classes, in_chans ->
in_channels, img_size -> image_size, drop_rate -> dropout, drop_path_rate -> drop_path; any other
keyword is a model option (e.g. k=16, attention="kvt"). global_pool sets the head's pooling (as
reset_classifier does). features_only=True (with out_indices) returns timm's FeatureGetterNet over
the model's forward_intermediates, as timm's own ViTs do (feature_cls="hook" and "fx" give timm's
FeatureHookNet and FeatureGraphNet over the feature_info modules instead): a ResNet's five maps (stem, layer1-4;
default all), a ViT's blocks (default the last 3). dynamic_img_size=True builds a ViT that takes
images of any size whose sides are multiples of its patch size (the position embedding resampled
to each call's grid, as timm's); a ViT loads the weights of another image size with its position
embedding resampled. There are no pretrained weights.
"""
import functools

from . import _after_import, _library, models

_TIMM_ARGUMENTS = {"in_chans": "in_channels", "img_size": "image_size", "drop_rate": "dropout",
                   "drop_path_rate": "drop_path"}
def _feature_getter():
    from timm.models._features import FeatureGetterNet
    return FeatureGetterNet


def _feature_hooks():
    from timm.models._features import FeatureHookNet
    return functools.partial(FeatureHookNet, no_rewrite=True)


def _feature_graph():
    from timm.models._features_fx import FeatureGraphNet
    return FeatureGraphNet


# timm's features_only wrappers by feature_cls: the same classes timm's build_model_with_cfg picks.
_FEATURE_CLASSES = {"getter": _feature_getter, "hook": _feature_hooks, "fx": _feature_graph}
@functools.lru_cache(maxsize=None)
def _timm_listings():
    """family name -> how timm lists it (the C++ family table's "timm" object: variants, out_indices,
    first_conv, classifier, feature_map, dynamic_img_size); families without one are not listed."""
    return {row["name"]: row["timm"] for row in models.model_family_table() if row["timm"] is not None}


@functools.lru_cache(maxsize=None)
def timm_models():
    """timm name -> (registry model, its family's timm listing, the variant's defaults), from the C++
    tables."""
    if not _library.has_models():
        return {}
    listings = _timm_listings()
    return {f"convnn_{row['name']}{suffix}": (row["name"], listings[row["family"]], defaults)
            for row in models.model_table() if row["family"] in listings
            for suffix, defaults in listings[row["family"]]["variants"].items()}


def _default_cfg(listing, defaults):
    """timm's default config of a model: its input size and class count (no weights to fetch)."""
    size = defaults.get("image_size", 224)
    return {"url": "", "num_classes": 1000, "input_size": (3, size, size), "pool_size": None,
            "crop_pct": 1.0 if size <= 32 else 0.875, "interpolation": "bicubic",
            "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": listing["first_conv"], "classifier": listing["classifier"]}


def _pool_size(model, listing, image_size):
    """forward_features's spatial size at input_size, as timm's CNN configs give it (None where the
    features are tokens, as timm's own ViT configs): the last stage's reduction rounded up, since
    every stride-2 step of the ResNets (3x3 or 1x1 kernels, padding 1 or 0) rounds up."""
    if not listing["feature_map"]:
        return None
    side = -(-image_size // model.feature_info[-1]["reduction"])
    return (side, side)


# Read by timm's register_model from this module (timm's convention); filled by register().
default_cfgs = {}
_registered = []


def _create(name, pretrained=False, pretrained_cfg=None, pretrained_cfg_overlay=None, **kwargs):
    if pretrained:
        raise ValueError(f"{name}: convnn has no pretrained weights; use pretrained=False")
    model_name, listing, defaults = timm_models()[name]
    features_only = kwargs.pop("features_only", False)
    if features_only:
        out_indices = kwargs.pop("out_indices", listing["out_indices"])
        out_indices = tuple(out_indices) if isinstance(out_indices, list) else out_indices
        feature_cls = kwargs.pop("feature_cls", "getter")
        if feature_cls not in _FEATURE_CLASSES:
            raise ValueError(f"{name}: features_only takes feature_cls 'getter' (timm's FeatureGetterNet over "
                             "forward_intermediates, the default), 'hook' (FeatureHookNet: forward hooks on the "
                             f"feature_info modules) or 'fx' (FeatureGraphNet), got feature_cls={feature_cls!r}")
    global_pool = kwargs.pop("global_pool", None)
    dynamic_img_size = kwargs.pop("dynamic_img_size", False)
    if dynamic_img_size and not listing["dynamic_img_size"]:
        raise ValueError(f"{name}: dynamic_img_size is a ViT option (a ResNet takes any image size as it is)")
    options = dict(defaults)
    for key, value in kwargs.items():
        if value is not None:
            options[_TIMM_ARGUMENTS.get(key, key)] = value
    model = models.create_model(model_name, **options)
    if global_pool is not None:
        model.reset_classifier(model.num_classes, global_pool)
    if listing["dynamic_img_size"]:
        model.dynamic_img_size = bool(dynamic_img_size)
    cfg = dict(default_cfgs[name])
    if pretrained_cfg is not None:
        cfg.update(pretrained_cfg.to_dict() if hasattr(pretrained_cfg, "to_dict") else dict(pretrained_cfg))
    cfg.update(pretrained_cfg_overlay or {})
    image_size, channels = options.get("image_size", 224), options.get("in_channels", 3)
    cfg.update(num_classes=options.get("num_classes", 1000), input_size=(channels, image_size, image_size),
               pool_size=_pool_size(model, listing, image_size))
    model.pretrained_cfg = model.default_cfg = cfg
    if features_only:
        model = _FEATURE_CLASSES[feature_cls]()(model, out_indices=out_indices)
        # As timm's build_model_with_cfg: a backbone's config has no classifier.
        cfg = {key: value for key, value in cfg.items() if key not in ("num_classes", "classifier", "global_pool")}
        model.pretrained_cfg = model.default_cfg = cfg
    return model


def register():
    """Registers the models in timm's registry now (once); False where timm is not installed."""
    if _registered:
        return True
    try:
        from timm.models import register_model
    except ImportError:
        return False
    entries = timm_models()
    default_cfgs.update({name: _default_cfg(listing, defaults) for name, (_, listing, defaults) in entries.items()})
    for name in entries:
        function = functools.partial(_create, name)
        function.__name__ = name
        function.__module__ = __name__
        register_model(function)
    _registered.append(True)
    return True


def register_when_timm_loads():
    """register() now if timm is imported already; otherwise once timm's own import has finished
    (importing timm, and the Dynamo it imports, costs about a second, which `import convnn` should
    not pay for a program that never uses timm), so `import timm; timm.create_model("convnn_...")`
    works; nothing where timm is not installed."""
    _after_import.call_after_import("timm", _register_after_import)


def _register_after_import(_timm):
    register()
