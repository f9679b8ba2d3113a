"""Runs SGLang's own benchmark client, `sglang.bench_serving` (its module
sglang.benchmark.serving), with the arguments given, without the SGLang server's imports.

Why: `import sglang` runs sglang/__init__.py, which pulls in the server (torch kernels, zmq,
triton, ...) that a benchmark client never uses and that this CPU-only test machine does not
have. The package is installed with `pip install --no-deps sglang`; this runner registers the
packages on the way to the benchmark module without running their __init__ files, stands in
for the two names the benchmark takes from the server's modules (a URL helper and a constant,
both reimplemented below exactly as they behave there), and for the `datasets` package that
only the MMMU / image datasets use (never the random datasets the test runs)."""
import importlib.util
import sys
import types


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

    sys.argv = ["sglang.bench_serving", *sys.argv[1:]]
    cli_main()


if __name__ == "__main__":
    main()
