#!/usr/bin/env bash
# README command one: install what is missing, build, start the OpenAI-compatible server on
# the shipped default model (models/default, a small DeepSeek-V3-architecture model trained
# on Python, kernel and KJV text), answer one completion and one chat request with curl,
# then stop the server with SIGTERM (it drains and exits 0).
# MOESERVE_PORT picks the port (default 30000); MOESERVE_KEEP_RUNNING=1 leaves the server
# running in the foreground after the requests (Ctrl-C stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
MOESERVE_BUILD_TESTS=OFF scripts/build.sh -DMOESERVE_BUILD_TESTS=OFF

port="${MOESERVE_PORT:-30000}"
log="$(mktemp)"
echo "[quickstart] build/bin/moeserve serve --port $port   (no --model: models/default)"
build/bin/moeserve serve --port "$port" >"$log" 2>&1 &
server=$!
stop_server() {
  if kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server"
    wait "$server" || true
  fi
  cat "$log"
  rm -f "$log"
}
trap stop_server EXIT

for _ in $(seq 1 600); do  # up to 60 s for start-up (warm-up included)
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$server" 2>/dev/null; then echo "[quickstart] the server exited:" >&2; exit 1; fi
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null

echo "[quickstart] curl http://127.0.0.1:$port/v1/completions (greedy)"
curl -sS "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" \
  -d '{"model": "default", "prompt": "The Python interpreter is", "max_tokens": 32, "temperature": 0}'
echo
echo "[quickstart] curl http://127.0.0.1:$port/v1/chat/completions (streaming)"
curl -sSN "http://127.0.0.1:$port/v1/chat/completions" -H "Content-Type: application/json" \
  -d '{"model": "default", "messages": [{"role": "user", "content": "What is a list?"}], "max_tokens": 32, "temperature": 0, "stream": true}'

if [[ "${MOESERVE_KEEP_RUNNING:-0}" == "1" ]]; then
  trap - EXIT
  echo "[quickstart] the server keeps running on http://127.0.0.1:$port (pid $server); Ctrl-C stops it"
  tail -n +1 -f --pid "$server" "$log" &
  wait "$server" || true
  rm -f "$log"
else
  echo "[quickstart] stopping the server (SIGTERM: it drains, then exits 0)"
fi
