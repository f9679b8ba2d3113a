"""`moeserve bench-sampling`: the host sampler's timing line, its checksum a pure function of
the rows and options (two runs agree), and a clear error for an unknown --backend."""
import re

from conftest import run_moeserve


def checksum(*extra):
    out = run_moeserve("bench-sampling", "--vocab", 5000, "--rows", 6, "--repeat", 1, *extra).stdout
    match = re.search(r"vocab 5000, 6 rows, .* ms per row \(best of 1\), checksum (\d+)", out)
    assert match, out
    return int(match.group(1))


def test_checksum_is_reproducible_and_depends_on_the_options():
    assert checksum() == checksum()
    assert checksum("--top-p", 1) != checksum("--top-p", 0.2)


def test_unknown_backend_is_named():
    proc = run_moeserve("bench-sampling", "--vocab", 100, "--rows", 1, "--repeat", 1, "--backend", "tpu", check=False)
    assert proc.returncode != 0
    assert "--backend 'tpu'" in proc.stderr
