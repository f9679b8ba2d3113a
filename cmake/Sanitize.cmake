# MOESERVE_SANITIZE: one clang build for the sanitizer job and the fuzzing (scripts/sanitize-tests.sh,
# scripts/fuzz.sh, docs/fuzzing.md). Every library, the GoogleTest suite and the app are compiled with
# AddressSanitizer + UndefinedBehaviorSanitizer (any UB report aborts) and libFuzzer's coverage
# instrumentation (fuzzer-no-link: harmless in a binary without libFuzzer); the targets under fuzz/
# add the libFuzzer driver. CPU-only: nvcc code is not instrumented.
option(MOESERVE_SANITIZE "ASan+UBSan build with the libFuzzer targets (clang, -DMOESERVE_CUDA=OFF)" OFF)
if(MOESERVE_SANITIZE)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MOESERVE_SANITIZE needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(MOESERVE_CUDA)
    message(FATAL_ERROR "MOESERVE_SANITIZE is the CPU-only build: add -DMOESERVE_CUDA=OFF")
  endif()
  set(moeserve_sanitizers -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  # -O1 and line tables only (after the build type's -O3, so they win): a third less compile time
  # than -O2 -g, and still symbolized reports.
  add_compile_options(${moeserve_sanitizers} -fsanitize=fuzzer-no-link -fno-omit-frame-pointer -O1 -gline-tables-only)
  add_link_options(${moeserve_sanitizers})
endif()
