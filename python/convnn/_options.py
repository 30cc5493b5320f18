"""Options of the convnn layers and functional forms, as the C++ library defines them.

The names, types and defaults come from the compiled library (torch.ops.convnn.layer_option_fields,
functional_option_fields), which reads them off the C++ options structs: Python restates none of
them. Options travel back to C++ as "name=value" texts, which C++ parses and validates.
"""
import functools
import inspect
import keyword
import numbers

import torch

_PARSERS = {
    "int": int,
    "int?": lambda text: None if text == "none" else int(text),
    "float": float,
    "bool": lambda text: text == "true",
    "str": str,
    "int[]": lambda text: tuple(int(item) for item in text.split(",")),
}


_TYPE_NAMES = {"int": "an integer", "int?": "an integer or None", "float": "a number", "bool": "True or False",
               "str": "a string", "int[]": "an integer or a tuple of integers (one per axis)"}


def _has_type(value, kind):
    """Whether a Python value fits a C++ field of this type (bool is not taken for a number; a
    SymInt or SymFloat, which torch.compile passes, is)."""
    integral = isinstance(value, (numbers.Integral, torch.SymInt)) and not isinstance(value, bool)
    if kind == "int":
        return integral
    if kind == "int?":
        return value is None or integral
    if kind == "float":
        return integral or isinstance(value, (numbers.Real, torch.SymFloat))
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int[]":
        items = value if isinstance(value, (tuple, list)) else (value,)
        return len(items) > 0 and all(_has_type(item, "int") for item in items)
    return isinstance(value, str)


def _text(value):
    """The C++ text form of a Python option value (C++ checks the value against the field's type)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):  # per-axis values (stride, dilation)
        return ",".join(str(item) for item in value)
    return str(value)


def _python_name(name):
    """A C++ option named like a Python keyword takes a trailing underscore: lambda -> lambda_."""
    return name + "_" if keyword.iskeyword(name) else name


class OptionFields:
    """One layer's (or the functional forms') option fields: names, types and defaults, under
    their Python names."""

    def __init__(self, names, types, defaults, required):
        self.cpp_names = {_python_name(name): name for name in names}
        self.names = list(self.cpp_names)
        self.types = dict(zip(self.names, types))
        self.defaults = {name: _PARSERS[kind](text) for name, kind, text in zip(self.names, types, defaults)}
        self.required = self.names[:required]

    def signature(self, leading=(), trailing=()):
        """The Python signature: the required options positional, then the others by keyword with
        their C++ defaults (what help() and IDEs show)."""
        params = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in leading]
        params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in self.required]
        params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=self.defaults[name])
                   for name in self.names if name not in self.required]
        params += list(trailing)
        return inspect.Signature(params)

    def bind(self, where, args, kwargs):
        """The complete options from a call's arguments, with the defaults filled in. An unknown
        keyword is named before any missing one (ConvNN2d(8, 8, kernel_size=3) is told that
        kernel_size is not an option, not that k is missing), and each value must have its C++
        field's type (ConvNN2d(8, 8, "9") is refused, not stored as k="9")."""
        kwargs = self._resolve_aliases(where, kwargs)
        unknown = [name for name in kwargs if name not in self.cpp_names]
        if unknown:
            raise TypeError(f"{where}: {unknown[0]} is not an option; its options are {', '.join(self.names)}")
        try:
            bound = self.signature().bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{where}: {error}; its options are {', '.join(self.names)}") from None
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            if not _has_type(value, self.types[name]):
                raise TypeError(f"{where}: option {name} must be {_TYPE_NAMES[self.types[name]]}, "
                                f"got {value!r} ({type(value).__name__})")
        return dict(bound.arguments)

    def _resolve_aliases(self, where, kwargs):
        """kwargs with the names PyTorch/timm/NATTEN use (num_heads, is_causal) under this layer's
        own (the C++ alias table, torch.ops.convnn.option_aliases)."""
        resolved = dict(kwargs)
        for alias, option in zip(*_aliases()):
            if alias in resolved and alias not in self.cpp_names and option in self.cpp_names:
                if option in resolved:
                    raise TypeError(f"{where}: {alias} and {option} are the same option; give one")
                resolved[option] = resolved.pop(alias)
        return resolved

    def from_texts(self, texts):
        """The Python options of C++ "name=value" texts (e.g. a model's layers, from the registry)."""
        python_names = {cpp: name for name, cpp in self.cpp_names.items()}
        options = {}
        for text in texts:
            cpp, _, value = text.partition("=")
            name = python_names[cpp]
            options[name] = _PARSERS[self.types[name]](value)
        return options

    def texts(self, options):
        return [f"{self.cpp_names[name]}={_text(value)}" for name, value in options.items()]


@functools.lru_cache(maxsize=None)
def _aliases():
    return torch.ops.convnn.option_aliases()


@functools.lru_cache(maxsize=None)
def layer_fields(layer):
    return OptionFields(*torch.ops.convnn.layer_option_fields(layer))


@functools.lru_cache(maxsize=None)
def functional_fields():
    return OptionFields(*torch.ops.convnn.functional_option_fields())
