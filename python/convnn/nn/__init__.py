"""ConvNN layers and functional forms for PyTorch, on the C++ library's rules."""
from . import functional
from .kv_cache import KVCache, StaticKVCache
from .modules import BranchingConv2d, BranchingConv3d, ConvNN1d, ConvNN2d, ConvNN3d, ConvNNAttention, record_neighbours
from .neighbours import NeighbourView, Neighbours

__all__ = ["ConvNN1d", "ConvNN2d", "ConvNN3d", "ConvNNAttention", "BranchingConv2d", "BranchingConv3d",
           "KVCache", "StaticKVCache", "Neighbours", "NeighbourView", "record_neighbours", "functional"]
