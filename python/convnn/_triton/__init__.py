"""convnn's Triton kernels (aggregate.py, select.py, pair_gradients.py, attention.py,
attention_backward.py), the list of their specialisations (specialisations.py) and the package's
launcher of them for the C++ library's CUDA kernels (register.py)."""
