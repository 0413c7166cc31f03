#!/usr/bin/env bash
# Starts `kiln serve` on a free port with the given model and server options, runs a client
# command against it (the URL appended as --url URL), and stops the server.
#   tests/server_harness.sh KILN MODEL_DIR "SERVE OPTIONS" CLIENT [CLIENT ARGS...]
set -u
kiln=$1 model=$2 serve_options=$3
shift 3
log=$(mktemp)
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
  echo "kiln serve did not start:"; cat "$log"; kill "$server" 2>/dev/null; rm -f "$log"; exit 1
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
rm -f "$log"
exit $status
