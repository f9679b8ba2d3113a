# xgrammar's C++ core (structured output: grammar/), built from its PyPI source distribution
# (scripts/install-deps.sh unpacks it into .deps/) as a static library without its Python
# bindings, so the moeserve binary needs no extra shared library. The sdist carries what the
# C++ build needs: picojson and dlpack under 3rdparty/.
set(MOESERVE_XGRAMMAR_VERSION 0.1.27)
set(MOESERVE_XGRAMMAR_DIR "${PROJECT_SOURCE_DIR}/.deps/xgrammar-${MOESERVE_XGRAMMAR_VERSION}"
    CACHE PATH "The unpacked xgrammar source distribution")
if(NOT EXISTS "${MOESERVE_XGRAMMAR_DIR}/CMakeLists.txt")
  message(FATAL_ERROR "xgrammar ${MOESERVE_XGRAMMAR_VERSION} not found at ${MOESERVE_XGRAMMAR_DIR}: "
                      "run scripts/install-deps.sh")
endif()
# xgrammar reads its options from ${CMAKE_BINARY_DIR}/config.cmake before its defaults (which turn
# the nanobind bindings on); its own flags add -flto and -Werror, which we turn off (no LTO
# objects in a static archive; a newer compiler's warnings must not break the build).
file(WRITE "${CMAKE_BINARY_DIR}/config.cmake"
     "set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\n"
     "set(XGRAMMAR_BUILD_CXX_TESTS OFF)\n"
     "set(XGRAMMAR_ENABLE_CPPTRACE OFF)\n"
     "set(XGRAMMAR_ENABLE_COVERAGE OFF)\n"
     "set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)\n"
     "set(CMAKE_CXX_FLAGS \"\${CMAKE_CXX_FLAGS} -fno-lto -Wno-error\")\n")
add_subdirectory("${MOESERVE_XGRAMMAR_DIR}" "${CMAKE_BINARY_DIR}/xgrammar" EXCLUDE_FROM_ALL SYSTEM)
