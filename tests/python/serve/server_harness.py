"""Starts `moeserve serve` on a free port and talks to it: base URL, /metrics as a dict,
resident memory, and a graceful stop (SIGTERM) that must exit 0."""
import json
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import moeserve_bin, run_moeserve  # noqa: E402,F401

MODEL = "synthetic:tiny"


class Server:
    def __init__(self, *args, startup_timeout=120, model=""):
        """model "": the module's MODEL as it is when the server starts (tests set it); None: the
        shipped default model (no --model)."""
        model = MODEL if model == "" else model
        self.args = ["serve", *(["--model", model] if model else []), "--port", "0", *map(str, args)]
        self.proc = subprocess.Popen([moeserve_bin(), *self.args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines = queue.Queue()
        self.output = []
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.time() + startup_timeout
        self.port = None
        while self.port is None:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"moeserve {' '.join(self.args)} did not start:\n" + "".join(self.output))
            if line is None:
                raise AssertionError(f"moeserve {' '.join(self.args)} exited:\n" + "".join(self.output))
            match = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if match:
                self.port = int(match.group(1))
        self.base = f"http://127.0.0.1:{self.port}"

    def _drain(self):
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        """(status, parsed JSON or text) of one request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def metrics(self, headers=None):
        """{'name' or 'name{labels}': value} from /metrics."""
        status, text = self.request("GET", "/metrics", headers=headers)
        assert status == 200, text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self, timeout=60):
        """SIGTERM, then the exit code (which a graceful drain makes 0)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("moeserve did not stop within {timeout}s of SIGTERM:\n" + "".join(self.output))
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        code = self.stop()
        if exc[0] is None:
            assert code == 0, f"moeserve exited {code}:\n" + "".join(self.output)


def openai_client(server, **kwargs):
    import openai
    return openai.OpenAI(base_url=server.base + "/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0,
                         **kwargs)


def generate_ids(prompts, plan="single", n=16, extra=()):
    """`moeserve generate` greedy token ids for each prompt (lists of ids)."""
    args = ["generate", "--model", MODEL, "--plan", plan, "-n", n, *extra]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    out = run_moeserve(*args).stdout.strip().splitlines()
    return [[int(t) for t in line.split(",")] if line else [] for line in out]


def detokenize(ids, skip_special=True):
    """The text of ids with the synthetic model's tokenizer (as the server decodes them)."""
    if not ids:
        return ""
    args = [moeserve_bin(), "detokenize", "--tokenizer", "synthetic", "--ids", ",".join(map(str, ids))]
    if skip_special:
        args.append("--skip-special")
    # Bytes, not text mode: universal newlines would turn a generated "\r" into "\n".
    return subprocess.run(args, capture_output=True, check=True).stdout.decode("utf-8")
