# Third-party libraries come from Debian packages (see scripts/install-deps.sh).
# Everything is header-only or linked statically so that the same binary runs on
# machines that have only the CUDA runtime libraries.
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 2.0 REQUIRED)
find_package(fmt 9 REQUIRED)
# Boost.Beast / Asio (header-only: Debian's libboost-dev) for the HTTP server and the bench client.
find_package(Boost 1.74 REQUIRED)
add_library(moeserve_beast INTERFACE)
target_link_libraries(moeserve_beast INTERFACE Boost::headers Threads::Threads)
# Asio's own error categories header-only, and no deprecated interfaces.
target_compile_definitions(moeserve_beast INTERFACE BOOST_ASIO_NO_DEPRECATED BOOST_BEAST_USE_STD_STRING_VIEW)

# fmt in header-only mode: no libfmt.so at run time.
add_library(moeserve_fmt INTERFACE)
target_link_libraries(moeserve_fmt INTERFACE fmt::fmt-header-only)

# PCRE2 (8-bit) linked statically, for tokenizer pre-tokenizer regexes.
find_path(PCRE2_INCLUDE_DIR pcre2.h REQUIRED)
find_library(PCRE2_STATIC_LIBRARY NAMES libpcre2-8.a REQUIRED)
add_library(moeserve_pcre2 INTERFACE)
target_include_directories(moeserve_pcre2 INTERFACE ${PCRE2_INCLUDE_DIR})
target_compile_definitions(moeserve_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8 PCRE2_STATIC)
target_link_libraries(moeserve_pcre2 INTERFACE ${PCRE2_STATIC_LIBRARY})

if(MOESERVE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
