"""The key/value cache of a causal ConvNNAttention for incremental decoding (C++ convnn::nn::KVCache;
docs/sequences.md). Its rule (the append, the max_length check) runs in C++ inside the step op."""
import typing

import torch


class _Storage:
    """Keys [B, kv_heads, max_length, key_head_dim] and values [B, kv_heads, max_length,
    value_head_dim], head-major, as the op reads them in place."""

    def __init__(self, batch: int, max_length: int, kv_heads: int, key_head_dim: int, value_head_dim: int, *,
                 dtype: typing.Optional[torch.dtype] = None, device: typing.Optional[torch.device] = None):
        for name, value in (("batch", batch), ("max_length", max_length), ("kv_heads", kv_heads),
                            ("key_head_dim", key_head_dim), ("value_head_dim", value_head_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be an integer of at least 1, got {value!r}")
        self.keys = torch.zeros(batch, kv_heads, max_length, key_head_dim, dtype=dtype, device=device)
        self.values = torch.zeros(batch, kv_heads, max_length, value_head_dim, dtype=dtype, device=device)

    @property
    def batch(self) -> int:
        return self.keys.shape[0]

    @property
    def max_length(self) -> int:
        return self.keys.shape[2]

    def _check_length(self, length):
        if not isinstance(length, int) or length < 0:
            raise ValueError(f"{type(self).__name__}: truncate takes a length of at least 0, got {length!r}")

    def __repr__(self):
        return (f"{type(self).__name__}(batch={self.batch}, max_length={self.max_length}, lengths={self.lengths}, "
                f"keys={tuple(self.keys.shape)}, values={tuple(self.values.shape)}, dtype={self.keys.dtype})")


class KVCache(_Storage):
    """The projected keys and values a causal ConvNNAttention has seen, per sample and key/value
    head, preallocated to max_length tokens (C++ convnn::nn::KVCache). Build it with
    ConvNNAttention.make_cache(batch, max_length); ConvNNAttention.forward_step(x, cache) appends to
    it and reads only the held tokens. Samples may hold different numbers of tokens (`lengths`, host
    integers)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lengths: typing.List[int] = [0] * self.batch

    def reset(self) -> None:
        """Empties every sample (the storage is kept)."""
        self.lengths = [0] * self.batch

    def truncate(self, length: int) -> None:
        """Drops each sample's tokens past `length` (a rollback, as beam search or speculative
        decoding need); samples holding fewer keep theirs."""
        self._check_length(length)
        self.lengths = [min(held, length) for held in self.lengths]


class StaticKVCache(_Storage):
    """A key/value cache whose step has fixed shapes, for torch.compile and CUDA graphs:
    ConvNNAttention.make_cache(batch, max_length, static=True). `lengths` is an int64 [B] tensor on
    the cache's device that a step advances in place; a step reads the whole cache with a mask (cost
    O(max_length) per query row, not O(held tokens)), so a compiled step compiles once for every
    length. Every sample advances by the step's t tokens (prompts of different lengths: decode them
    into a KVCache, or pad them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lengths = torch.zeros(self.batch, dtype=torch.long, device=self.keys.device)

    def reset(self) -> None:
        """Empties every sample (the storage is kept)."""
        self.lengths.zero_()

    def truncate(self, length: int) -> None:
        """Drops each sample's tokens past `length`; samples holding fewer keep theirs."""
        self._check_length(length)
        self.lengths.clamp_(max=length)
