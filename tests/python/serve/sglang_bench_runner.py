"""Runs SGLang's own benchmark client, `sglang.bench_serving` (its module
sglang.benchmark.serving), with the arguments given, without the SGLang server's imports.

Why: `import sglang` runs sglang/__init__.py, which pulls in the server (torch kernels, zmq,
triton, ...) that a benchmark client never uses and that this CPU-only test machine does not
have. The package is installed with `pip install --no-deps sglang`; this runner registers the
packages on the way to the benchmark module without running their __init__ files, stands in
for the two names the benchmark takes from the server's modules (a URL helper and a constant,
both reimplemented below exactly as they behave there), and for the `datasets` package that
only the MMMU / image datasets use (never the datasets the test runs).

`--serve`: instead of one run, one run per line of stdin (a JSON list of bench_serving's
arguments), each answered by a line `DONE_MARKER 0` (or 1 and the error) on stdout, so that a
test interleaves runs with `moeserve bench` without paying the imports (about 20 s on a 2-core
machine) every time."""
import importlib.util
import json
import sys
import traceback
import types

DONE_MARKER = "@@sglang_bench_runner done"


def _package(name, path):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module


def main():
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        raise SystemExit("sglang is not installed (pip install --no-deps sglang)")
    root = spec.submodule_search_locations[0]
    for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
        _package(name, root + "/" + "/".join(name.split(".")[1:]))
    network = types.ModuleType("sglang.srt.utils.network")
    network.resolve_base_url = lambda base_url, host, port: base_url or f"http://{host}:{port}"
    network.resolve_host_port = lambda base_url, host, port: base_url or f"{host}:{port}"
    sys.modules[network.__name__] = network
    disaggregation = types.ModuleType("sglang.srt.disaggregation.utils")
    disaggregation.FAKE_BOOTSTRAP_HOST = "2.2.2.2"
    sys.modules[disaggregation.__name__] = disaggregation
    if importlib.util.find_spec("datasets") is None:
        datasets = types.ModuleType("datasets")

        def load_dataset(*args, **kwargs):
            raise RuntimeError("the datasets package is not installed (only the MMMU / image datasets need it)")

        datasets.load_dataset = load_dataset
        sys.modules["datasets"] = datasets
    from sglang.benchmark.serving import cli_main

    if sys.argv[1:] != ["--serve"]:
        sys.argv = ["sglang.bench_serving", *sys.argv[1:]]
        return cli_main()
    for line in sys.stdin:
        sys.argv = ["sglang.bench_serving", *json.loads(line)]
        try:
            cli_main()
            answer = "0"
        except BaseException:  # noqa: B036 (argparse's SystemExit too: the test reads the reason)
            answer = "1 " + json.dumps(traceback.format_exc())
        print(f"{DONE_MARKER} {answer}", flush=True)


if __name__ == "__main__":
    main()
