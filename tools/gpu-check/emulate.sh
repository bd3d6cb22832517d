#!/usr/bin/env bash
# Runs rpc_client.cu's kernels on the CPU (emulate.cpp) against rpc-serve: the client's protocol
# logic, tested where there is no GPU. Needs g++ and cargo. Usage: bash emulate.sh [PORTS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
ports="${1:-64}"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -INT "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
(cd "$root" && cargo build --quiet -p rpc-serve)
g++ -std=c++17 -O1 -pthread -Wall -Wextra -o "$work/emulate" "$here/emulate.cpp"
"$root/target/debug/rpc-serve" --file "$work/mailbox" --gen v1 --ports "$ports" --lanes 32 \
  --stdout "$work/stdout" > "$work/serve.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do grep -q '^ready' "$work/serve.log" && break; sleep 0.1; done
grep -q '^ready' "$work/serve.log" || { cat "$work/serve.log"; echo "emulate: rpc-serve did not start"; exit 1; }
status=0
timeout "${EMULATE_TIMEOUT:-300}" "$work/emulate" "$work/mailbox" "$ports" "$work/expected" || status=$?
kill -INT "$server_pid"; wait "$server_pid" || true; server_pid=""
if [ "$status" != 0 ]; then
  [ "$status" = 124 ] && echo "FAIL emulate: timed out (a deadlock)" || echo "FAIL emulate: exit status $status"
elif diff <(sort "$work/expected") <(sort "$work/stdout") > "$work/diff"; then
  echo "PASS stdout: $(wc -l < "$work/stdout") lines exactly as expected"
else
  echo "FAIL stdout: printed lines differ from the expected ones:"; head -20 "$work/diff"; status=1
fi
grep -i -E 'warn|error' "$work/serve.log" | head -20 || true
echo "emulate: $([ "$status" = 0 ] && echo PASS || echo "FAIL ($status)")"
exit "$status"
