#!/usr/bin/env bash
# Churn against `myapp-operator dev`, the way a long local session or a CI soak loads it:
# cycles of "apply N MyApps, edit them all, delete them all and wait", for MINUTES minutes.
# Prints one line per cycle: seconds to apply, to edit, to delete (with --wait), the dev
# process's resident memory, and how many Events the API server holds. It measures; it
# asserts nothing.
#
#   cargo build && benches/churn.sh                     # 12 minutes, 200 MyApps per cycle
#   MINUTES=3 APPS=100 BIN=target/release/myapp-operator benches/churn.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/debug/myapp-operator}
MINUTES=${MINUTES:-12}
APPS=${APPS:-200}
[ -x "$BIN" ] || { echo "no $BIN: run cargo build first (or set BIN)" >&2; exit 1; }

dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
"$BIN" dev --api-addr 127.0.0.1:0 --webhook-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
  --state-dir "$dir/state" >"$dir/dev.out" 2>"$dir/dev.log" &
pid=$!
export KUBECONFIG="$dir/state/kubeconfig"
for _ in $(seq 1 300); do
  [ -s "$KUBECONFIG" ] && kubectl get namespace default >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/dev.log" >&2; exit 1; }
  sleep 0.2
done
kubectl get namespace default >/dev/null

manifest() { # $1: image tag
  for i in $(seq 1 "$APPS"); do
    printf 'apiVersion: example.com/v1\nkind: MyApp\nmetadata:\n  name: churn-%s\n  namespace: default\nspec:\n  replicas: 1\n  image: ghcr.io/example/web:%s\n  port: 8080\n---\n' "$i" "$1"
  done
}
manifest 1.0.0 >"$dir/apps.yaml"
manifest 1.0.1 >"$dir/edited.yaml"

seconds() { local start=$1; echo "$(( $(date +%s%N) - start ))" | awk '{printf "%.2f", $1/1e9}'; }
rss_mib() { awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$pid/status"; }

echo "cycle apply_s edit_s delete_s rss_mib events"
end=$(( $(date +%s) + MINUTES * 60 ))
cycle=0
while [ "$(date +%s)" -lt "$end" ]; do
  cycle=$((cycle + 1))
  t=$(date +%s%N); kubectl apply -f "$dir/apps.yaml" >/dev/null; apply=$(seconds "$t")
  t=$(date +%s%N); kubectl apply -f "$dir/edited.yaml" >/dev/null; edit=$(seconds "$t")
  t=$(date +%s%N); kubectl delete -f "$dir/apps.yaml" --wait=true >/dev/null; delete=$(seconds "$t")
  events=$(kubectl get events.events.k8s.io -A --no-headers 2>/dev/null | wc -l)
  echo "$cycle $apply $edit $delete $(rss_mib) $events"
done
