"""ConvNN layers and functional forms for PyTorch, on the C++ library's rules."""
from . import functional
from .modules import BranchingConv2d, ConvNN1d, ConvNN2d, ConvNNAttention

__all__ = ["ConvNN1d", "ConvNN2d", "ConvNNAttention", "BranchingConv2d", "functional"]
