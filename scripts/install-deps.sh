#!/usr/bin/env bash
# Installs what the build (and, with --test, the test suite) needs: Debian packages and
# PyPI packages. Only what is missing is installed; a second run is a quick no-op.
# --model-data: the Debian packages whose texts train the default model
# (scripts/default_model/prepare_data.py).
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0 model_data=0
for arg in "$@"; do
  case "$arg" in
    --test) with_tests=1 ;;
    --model-data) model_data=1 ;;
    *) echo "[install-deps] unknown option $arg (--test, --model-data)" >&2; exit 2 ;;
  esac
done

packages=(cmake g++ make pkg-config curl libcli11-dev nlohmann-json3-dev libpcre2-dev libfmt-dev libboost-dev libspdlog-dev)
# chromium: tests/python/bench renders sweep.html headless and checks the page; clang-format:
# scripts/check-format.sh (.ci/run); wamerican: the word list of the default model's English check;
# clang and its sanitizer/libFuzzer runtimes: the ASan+UBSan build of scripts/sanitize-tests.sh and
# scripts/fuzz.sh.
(( with_tests )) && packages+=(libgtest-dev chromium clang-format wamerican clang libclang-rt-14-dev)
# The default model's training text: Python docs (PSF), kernel docs (GPL-2.0), the KJV (public domain).
(( model_data )) && packages+=(python3.11-doc linux-doc-6.1 bible-kjv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "[install-deps] apt-get install ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# xgrammar's C++ core (structured output), from its PyPI source distribution, pinned; unpacked
# into .deps/ (git-ignored) and built statically by cmake/Xgrammar.cmake.
xgrammar_version=$(sed -n 's/^set(MOESERVE_XGRAMMAR_VERSION \([0-9.]*\))$/\1/p' cmake/Xgrammar.cmake)
if [[ ! -f .deps/xgrammar-$xgrammar_version/include/xgrammar/xgrammar.h ]]; then
  echo "[install-deps] xgrammar $xgrammar_version source distribution -> .deps/"
  mkdir -p .deps
  python3 -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
    -d .deps "xgrammar==$xgrammar_version"
  tar -xzf ".deps/xgrammar-$xgrammar_version.tar.gz" -C .deps
fi

if (( with_tests )); then
  if ! python3 -m pip install -q --disable-pip-version-check -r requirements-test.txt; then
    echo "[install-deps] pip install of requirements-test.txt failed" >&2
    exit 1
  fi
  # SGLang's benchmark client (tests/python/serve/test_sglang_bench_serving.py) without the
  # SGLang server's dependencies (CUDA kernels, zmq, ...): the client needs only what
  # requirements-test.txt lists; tests/python/serve/sglang_bench_runner.py says why.
  if ! python3 -m pip show -q sglang >/dev/null 2>&1 &&
     ! python3 -m pip install -q --disable-pip-version-check --no-deps "sglang==0.5.23"; then
    echo "[install-deps] pip install --no-deps sglang failed" >&2
    exit 1
  fi
fi
