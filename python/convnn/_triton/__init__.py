"""convnn's Triton kernels (issue 25): python/convnn/_triton/aggregate.py and their registration
for CUDA tensors (register.py)."""
