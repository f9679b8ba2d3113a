"""Runs one pytest file for ctest (tests/CMakeLists.txt registers one entry per test file).

Exits as pytest does, except that a file whose tests were all skipped (or that collected
none) exits 5, pytest's "no tests collected": ctest maps that code to "skipped"
(SKIP_RETURN_CODE), so a suite that could not run here (no chromium, no GPU) is not
reported as passed.

    python3 tests/python/run_test_file.py FILE [pytest args...]
"""
import sys

import pytest

NOTHING_RAN = int(pytest.ExitCode.NO_TESTS_COLLECTED)


class OutcomeCounter:
    """Counts the tests that ran (passed or failed in their call phase, or errored anywhere)."""

    def __init__(self):
        self.ran = 0

    def pytest_runtest_logreport(self, report):
        if (report.when == "call" and not report.skipped) or report.failed:
            self.ran += 1


def main(argv):
    counter = OutcomeCounter()
    code = int(pytest.main(argv, plugins=[counter]))
    if code == int(pytest.ExitCode.OK) and counter.ran == 0:
        print("run_test_file: every test was skipped; reporting the file as skipped")
        return NOTHING_RAN
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
