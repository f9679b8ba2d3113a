"""`moeserve generate` from the GPU scripts: greedy continuations of token-id prompts."""
import subprocess


def generate_tokens(binary, model, prompts, flags, new_tokens=32):
    """Runs `moeserve generate --model MODEL -n NEW --ignore-eos FLAGS --prompt-ids ...`.
    Returns (one token list per prompt, "") or (None, stderr) when it fails."""
    args = [binary, "generate", "--model", str(model), "-n", str(new_tokens), "--ignore-eos", *map(str, flags)]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return [list(map(int, line.split(","))) for line in out.stdout.strip().splitlines()], ""
