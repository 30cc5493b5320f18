"""The key/value cache of a causal ConvNNAttention for incremental decoding (C++ convnn::nn::KVCache;
docs/sequences.md). Its rule (the append, the max_length check) runs in C++ inside the step op."""
import typing

import torch


class KVCache:
    """The projected keys and values a causal ConvNNAttention has seen, per sample and key/value
    head, preallocated to max_length tokens: keys [B, kv_heads, max_length, key_head_dim] and values
    [B, kv_heads, max_length, value_head_dim] (head-major, as the op reads them in place). Build it
    with ConvNNAttention.make_cache(batch, max_length); ConvNNAttention.forward_step(x, cache)
    appends to it. Samples may hold different numbers of tokens (`lengths`)."""

    def __init__(self, batch: int, max_length: int, kv_heads: int, key_head_dim: int, value_head_dim: int, *,
                 dtype: typing.Optional[torch.dtype] = None, device: typing.Optional[torch.device] = None):
        for name, value in (("batch", batch), ("max_length", max_length), ("kv_heads", kv_heads),
                            ("key_head_dim", key_head_dim), ("value_head_dim", value_head_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache: {name} must be an integer of at least 1, got {value!r}")
        self.keys = torch.zeros(batch, kv_heads, max_length, key_head_dim, dtype=dtype, device=device)
        self.values = torch.zeros(batch, kv_heads, max_length, value_head_dim, dtype=dtype, device=device)
        self.lengths: typing.List[int] = [0] * batch

    @property
    def batch(self) -> int:
        return self.keys.shape[0]

    @property
    def max_length(self) -> int:
        return self.keys.shape[2]

    def reset(self) -> None:
        """Empties every sample (the storage is kept)."""
        self.lengths = [0] * self.batch

    def truncate(self, length: int) -> None:
        """Drops each sample's tokens past `length` (a rollback, as beam search or speculative
        decoding need); samples holding fewer keep theirs."""
        if not isinstance(length, int) or length < 0:
            raise ValueError(f"KVCache: truncate takes a length of at least 0, got {length!r}")
        self.lengths = [min(held, length) for held in self.lengths]

    def __repr__(self):
        return (f"KVCache(batch={self.batch}, max_length={self.max_length}, lengths={self.lengths}, "
                f"keys={tuple(self.keys.shape)}, values={tuple(self.values.shape)}, dtype={self.keys.dtype})")
