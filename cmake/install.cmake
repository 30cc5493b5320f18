# What `cmake --install build --prefix P` installs, so that another CMake project can depend on
# convnn as it depends on LibTorch:
#   P/include/convnn/...                       the public headers and the generated version.h
#   P/lib/libconvnn*.so.<version>              every library of src/CMakeLists.txt (with soname links)
#   P/bin/convnn                               the command, finding its libraries and LibTorch by RPATH
#   P/lib/cmake/convnn/convnnConfig.cmake      the package: find_package(convnn) gives the targets
#     convnnConfigVersion.cmake, convnnTargets*.cmake    convnn::ops, convnn::nn, convnn::models, ...
#   P/share/doc/convnn/                        README, docs/, the example consumer (examples/cpp)
# Only CMake's own helpers write paths (GNUInstallDirs, install(EXPORT), CMakePackageConfigHelpers),
# so the installed package is relocatable: it finds itself from where its config file lies.
include(CMakePackageConfigHelpers)

set(CONVNN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/convnn" CACHE STRING
    "Where the CMake package (convnnConfig.cmake) is installed, relative to the prefix")

# Every library convnn_add_library made (src/CMakeLists.txt), under its EXPORT_NAME.
get_property(convnn_libraries GLOBAL PROPERTY CONVNN_LIBRARIES)
install(TARGETS ${convnn_libraries} EXPORT convnnTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/convnn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES "${PROJECT_BINARY_DIR}/include/convnn/version.h" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/convnn)

# The command's install rule is beside it, in apps/convnn/CMakeLists.txt.

install(FILES README.md RESULTS.md BENCHMARKS.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY examples/cpp DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# The package. Its components are the export names; convnnConfig.cmake reads these lists.
set(CONVNN_COMPONENTS "")
foreach(library IN LISTS convnn_libraries)
  get_target_property(export_name ${library} EXPORT_NAME)
  list(APPEND CONVNN_COMPONENTS ${export_name})
endforeach()
set(CONVNN_JSON_COMPONENTS "")
get_property(convnn_json_users GLOBAL PROPERTY CONVNN_JSON_USERS)
foreach(library IN LISTS convnn_json_users)
  get_target_property(export_name ${library} EXPORT_NAME)
  list(APPEND CONVNN_JSON_COMPONENTS ${export_name})
endforeach()

install(EXPORT convnnTargets NAMESPACE convnn:: DESTINATION ${CONVNN_INSTALL_CMAKEDIR})
configure_package_config_file(cmake/convnnConfig.cmake.in "${PROJECT_BINARY_DIR}/convnnConfig.cmake"
  INSTALL_DESTINATION ${CONVNN_INSTALL_CMAKEDIR})
# SameMinorVersion: while convnn is 0.x its C++ API and ABI may change with every minor release
# (semantic versioning's rule for 0.y.z), so a project asking for 0.1 accepts 0.1.z (z >= its
# patch) but not 0.2. From 1.0 on, SameMajorVersion would be the rule. The sonames follow the
# same rule (major.minor, src/CMakeLists.txt).
write_basic_package_version_file("${PROJECT_BINARY_DIR}/convnnConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/convnnConfig.cmake" "${PROJECT_BINARY_DIR}/convnnConfigVersion.cmake"
  DESTINATION ${CONVNN_INSTALL_CMAKEDIR})
