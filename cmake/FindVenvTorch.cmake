# Finds the torch of the Python environment the package is being installed into, without importing
# it: pip's isolated build environment hides that environment's site-packages from `import`, but
# the interpreter is the environment's own, so sysconfig still names its purelib. Sets
# CMAKE_PREFIX_PATH for find_package(Torch) and CONVNN_TORCH_VERSION (e.g. 2.11.0+cu130), and
# refuses a torch outside CONVNN_TORCH_SERIES.
set(CONVNN_TORCH_SERIES "2.11")
find_package(Python COMPONENTS Interpreter REQUIRED)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import sysconfig; print(sysconfig.get_path('purelib'))"
  OUTPUT_VARIABLE convnn_purelib OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
set(convnn_torch_root "${convnn_purelib}/torch")
if(NOT EXISTS "${convnn_torch_root}/version.py")
  message(FATAL_ERROR "convnn builds against the torch installed in the target environment, and "
                      "found none in ${convnn_purelib} (the site-packages of ${Python_EXECUTABLE}). "
                      "Install torch ${CONVNN_TORCH_SERIES}.x first: pip install torch==${CONVNN_TORCH_SERIES}.0")
endif()
file(STRINGS "${convnn_torch_root}/version.py" convnn_version_line REGEX "^__version__")
string(REGEX MATCH "'([^']+)'" _ "${convnn_version_line}")
set(CONVNN_TORCH_VERSION "${CMAKE_MATCH_1}")
if(NOT CONVNN_TORCH_VERSION MATCHES "^${CONVNN_TORCH_SERIES}\\.")
  message(FATAL_ERROR "convnn needs torch ${CONVNN_TORCH_SERIES}.x (its C++ ABI changes between "
                      "minor versions), but ${convnn_torch_root} is torch ${CONVNN_TORCH_VERSION}. "
                      "Install torch==${CONVNN_TORCH_SERIES}.0 in this environment, or use one that has it.")
endif()
list(PREPEND CMAKE_PREFIX_PATH "${convnn_torch_root}/share/cmake")
message(STATUS "convnn: building the Python package against torch ${CONVNN_TORCH_VERSION} in ${convnn_torch_root}")
