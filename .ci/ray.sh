#!/usr/bin/env bash
# A single-node Ray head on loopback with 4 logical GPUs, for the Ray executor's tests.
#
#   .ci/ray.sh up      start it unless a Ray dashboard already answers (idempotent)
#   .ci/ray.sh down    stop it, only if `up` started it
#   .ci/ray.sh url     print the dashboard URL (the Jobs REST API lives there)
#
# Ray comes from RAY_VENV (default: the project's .venv), which needs `ray[default]`
# (requirements-engines.txt). `up` runs `ray start --block` in its own session and records that
# process's pid in $RAY_CI_TMP/started-by-ci.pid; every Ray process (GCS, raylet, dashboard,
# workers, job drivers) descends from it, so `down` ends exactly that tree, by pid.
set -euo pipefail
cd "$(dirname "$0")/.."

V=${RAY_VENV:-$PWD/.venv}
T=${RAY_CI_TMP:-/tmp/starforge-ray}
GCS_PORT=${RAY_GCS_PORT:-6380}              # 6379 is Redis
DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
URL="http://127.0.0.1:$DASHBOARD_PORT"
MARKER="$T/started-by-ci.pid"

answers() { "$V/bin/python" - "$URL/api/version" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2).read()
except Exception:
    sys.exit(1)
PY
}

# The marker's pid, if that process is still our `ray start` (guards against pid reuse).
our_pid() {
  [ -f "$MARKER" ] || return 1
  local pid; pid=$(cat "$MARKER")
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--temp-dir=$T" \
    && echo "$pid"
}

# End `ray start --block` (pid $1) and everything below it, by pid (never by name). Its SIGTERM
# handler stops Ray's processes in order (a SIGTERM to each of them at once can hang); what
# outlives it (a job's processes in their own sessions) gets SIGTERM, then SIGKILL.
end_tree() { "$V/bin/python" - "$1" <<'PY'
import os, signal, sys, time

def parents():
    found = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            after_name = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if after_name[0] != "Z":  # a zombie has already ended
            found[int(p)] = int(after_name[1])
    return found

def tree(root):
    live, pids = parents(), {root}
    grew = True
    while grew:
        more = {p for p, parent in live.items() if parent in pids} - pids
        pids |= more
        grew = bool(more)
    return pids & set(live)

def send(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while (left := pids & set(parents())) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left

root = int(sys.argv[1])
pids = tree(root)
send({root}, signal.SIGTERM)
wait_gone({root}, 8)
send(pids & set(parents()), signal.SIGTERM)
send(wait_gone(pids, 3), signal.SIGKILL)
PY
}

up() {
  if [ ! -x "$V/bin/ray" ]; then
    echo "ray is not installed in $V: run make engines (pip install -r requirements-engines.txt)" >&2
    exit 1
  fi
  if answers; then echo "ray already up at $URL"; exit 0; fi
  local stale
  if stale=$(our_pid); then end_tree "$stale"; fi  # ours, but its dashboard does not answer
  rm -f "$MARKER"
  mkdir -p "$T"
  # PATH first: a job's `python` is the one on the PATH that `ray start` had.
  PATH="$V/bin:$PATH" RAY_USAGE_STATS_ENABLED=0 \
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 \
    RAY_JOB_START_TIMEOUT_SECONDS="${RAY_JOB_START_TIMEOUT_SECONDS:-30}" \
    setsid "$V/bin/ray" start --head --block --num-cpus=2 --num-gpus=4 \
    --node-ip-address=127.0.0.1 --port="$GCS_PORT" --ray-client-server-port=10001 \
    --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" \
    --object-store-memory=536870912 --disable-usage-stats --temp-dir="$T" \
    </dev/null >"$T/start.log" 2>&1 &
  echo $! >"$MARKER"
  for _ in $(seq 150); do
    answers && { echo "ray up at $URL"; exit 0; }
    kill -0 "$(cat "$MARKER")" 2>/dev/null || break
    sleep 0.2
  done
  echo "ray did not come up at $URL; last lines of $T/start.log:" >&2
  tail -20 "$T/start.log" >&2
  down
  exit 1
}

down() {
  local pid
  if ! pid=$(our_pid); then
    rm -f "$MARKER"
    echo "ray was not started by .ci/ray.sh: nothing to stop"
    return 0
  fi
  end_tree "$pid"
  rm -f "$MARKER"
  echo "ray down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 up|down|url" >&2; exit 2 ;;
esac
