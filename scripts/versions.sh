# Pinned versions and package lists, shared by every script. torch 2.11.0 on PyPI is built against
# CUDA 13.0, the major version of the installed nvcc, and is the GPU machine's version.
CONVNN_TORCH_VERSION="2.11.0"
CONVNN_PYTHON="/usr/bin/python3"
# scikit-build-core: the Python package's build backend (pyproject.toml), installed here so that
# setup.sh builds the package without an isolated build environment (no download per install).
# timm (>= 1.0.23, whose Block passes the attention arguments python/convnn/nn/modules.py honours)
# brings torchvision; installed in one pip call with torch==CONVNN_TORCH_VERSION, so pip picks the
# torchvision of that torch instead of upgrading torch (which the convnn package would refuse).
# matplotlib draws convnn.viz's pictures (the package's optional "viz" dependency; its tests need it).
# onnx, onnxscript (torch.onnx.export's translation library) and onnxruntime: the "onnx" extra, for
# python/tests/test_onnx.py.
CONVNN_PIP_PACKAGES=(numpy pytest "scikit-build-core>=0.10" "timm>=1.0.23" matplotlib onnx onnxscript onnxruntime)
CONVNN_APT_PACKAGES=(
  python3-venv cmake ninja-build ccache g++ git
  googletest libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev
  dataset-fashion-mnist gnuplot-nox
  # The text corpus of the language models (data/text.h): 2.5 MB of English in /usr/share/games/fortunes.
  fortunes
  libjpeg62-turbo-dev libpng-dev python-matplotlib-data
  libgloo-dev
  # Clang builds the fuzz targets (libFuzzer is its) and the sanitizer build (scripts/sanitize.sh);
  # libomp-14-dev is its OpenMP, which the inline at::parallel_for of LibTorch's headers needs.
  clang-14 libclang-rt-14-dev libomp-14-dev
)
