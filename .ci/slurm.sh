#!/usr/bin/env bash
# A real Slurm (Debian's slurm-wlm 22.05) on this host for the Slurm executor's tests and
# benchmarks: slurmctld and three slurmd as root.
#   partition debug (Default): the host's own node, 4 fake untyped GPUs (gpu:4) declared as GRES;
#   partition multi: two more nodes, multi1 and multi2, each a slurmd of its own on this host
#     (`slurmd -N`; its own port, spool dir, pid and log file; NodeAddr 127.0.0.2 and 127.0.0.3,
#     both this host's loopback) with 2 fake GPUs of type a100 each (gpu:a100:2), so that a
#     multi-node job runs one rank per node and asks for a GPU type.
#
#   .ci/slurm.sh install   apt-get install slurm-wlm, munge, slurmdbd and mariadb-server if missing
#   .ci/slurm.sh up        start what is not running (idempotent); prints the SLURM_CONF to use
#   .ci/slurm.sh down      stop only what `up` started (by PID file, never by name)
#   .ci/slurm.sh status    exit 0 when slurmctld answers
#   .ci/slurm.sh restart-ctld  SIGKILL slurmctld (as a crash would) and start it again
#
# Accounting (SF_SLURM_ACCOUNTING=1, the default): slurmdbd on a MariaDB server of its own
# (Debian's mariadb-server; its data dir, socket and port under the state dir, never the
# machine's own MariaDB), so that `sacct` answers as on a site's cluster. `up` starts both,
# `down` stops both. SF_SLURM_ACCOUNTING=0 runs without (sacct then exits 1).
#
# The configuration lives in the state dir, not /etc/slurm, so a machine's own Slurm config is
# never touched: point the Slurm commands at it with SLURM_CONF=$SF_SLURM_DIR/etc/slurm.conf.
# Env: SF_SLURM_DIR (default /tmp/starforge-slurm), SF_SLURM_CPUS (default 16, may exceed the
# real cores so that many short jobs run at once), SF_SLURM_GPUS (default 4), SF_SLURM_MULTI_CPUS
# and SF_SLURM_MULTI_GPUS (per multi node, default 8 and 2), SF_SLURM_PORT (slurmctld port,
# default 6817; the host's slurmd uses the next one, multi1 and multi2 the two after, slurmdbd
# the one after them), SF_SLURM_DB_PORT (its MariaDB's, default 3316).
set -euo pipefail
D=${SF_SLURM_DIR:-/tmp/starforge-slurm}
CPUS=${SF_SLURM_CPUS:-16}
GPUS=${SF_SLURM_GPUS:-4}
MULTI_CPUS=${SF_SLURM_MULTI_CPUS:-8}
MULTI_GPUS=${SF_SLURM_MULTI_GPUS:-2}
MULTI_TYPE=a100
MULTI_NODES="multi1 multi2"
PORT=${SF_SLURM_PORT:-6817}
ACCOUNTING=${SF_SLURM_ACCOUNTING:-1}
DB_PORT=${SF_SLURM_DB_PORT:-3316}
DBD_PORT=$((PORT + 4))
DB_SOCK=$D/mysql/mysqld.sock
export SLURM_CONF=$D/etc/slurm.conf
STARTED=$D/started   # one line per daemon `up` started: what `down` may stop

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pid() { # pidfile: TERM, wait up to 5 s, then KILL
  [ -s "$1" ] || return 0
  local p
  p=$(cat "$1")
  if kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p"
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p"
  fi
  rm -f "$1"
}

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge
  chmod 0700 /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key --force
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  munge_ok && return 0
  rm -f /run/munge/munged.pid /run/munge/munge.socket.2*
  runuser -u munge -- /usr/sbin/munged
  echo "munged /run/munge/munged.pid" >>"$STARTED"
  for _ in $(seq 50); do munge_ok && return 0; sleep 0.1; done
  echo "munged did not start" >&2
  return 1
}

fake_gpus() { # dir count: char devices aliasing /dev/null, one per fake GPU. GRES needs File= to
  # hand out CUDA_VISIBLE_DEVICES, and slurmd complains about plain files.
  mkdir -p "$1"
  for i in $(seq 0 $(($2 - 1))); do
    [ -c "$1/nvidia$i" ] || {
      rm -f "$1/nvidia$i"
      mknod -m 666 "$1/nvidia$i" c 1 3 2>/dev/null || touch "$1/nvidia$i"
    }
  done
}

nodes() { hostname -s; echo $MULTI_NODES | tr ' ' '\n'; } # every node `up` runs a slurmd for

pidfile() { echo "$D/slurmd-$1.pid"; } # node: its slurmd's (SlurmdPidFile, %n expanded)

write_config() { # prints "changed" when the node or GRES definition differs from the last run
  local host mem i n
  host=$(hostname -s)
  mem=$(($(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024)) # MiB, leave 1 GiB
  fake_gpus "$D/dev" "$GPUS"
  for n in $MULTI_NODES; do fake_gpus "$D/dev/$n" "$MULTI_GPUS"; done
  cat >"$D/etc/slurm.conf.new" <<EOF
ClusterName=starforge-ci
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
$(accounting_config)
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.log
MinJobAge=600
MaxJobCount=20000
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
GresTypes=gpu
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${mem} Gres=gpu:${GPUS} State=UNKNOWN
EOF
  echo "AutoDetect=off" >"$D/etc/gres.conf.new"
  echo "NodeName=${host} Name=gpu File=$D/dev/nvidia[0-$((GPUS - 1))]" >>"$D/etc/gres.conf.new"
  i=0
  for n in $MULTI_NODES; do
    i=$((i + 1))
    echo "NodeName=$n NodeAddr=127.0.0.$((i + 1)) Port=$((PORT + 1 + i))" \
      "CPUs=${MULTI_CPUS} RealMemory=${mem} Gres=gpu:${MULTI_TYPE}:${MULTI_GPUS} State=UNKNOWN" \
      >>"$D/etc/slurm.conf.new"
    echo "NodeName=$n Name=gpu Type=${MULTI_TYPE} File=$D/dev/$n/nvidia[0-$((MULTI_GPUS - 1))]" \
      >>"$D/etc/gres.conf.new"
  done
  cat >>"$D/etc/slurm.conf.new" <<EOF
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
PartitionName=multi Nodes=$(echo $MULTI_NODES | tr ' ' ',') MaxTime=INFINITE State=UP
EOF
  local f
  for f in slurm.conf gres.conf; do
    if cmp -s "$D/etc/$f.new" "$D/etc/$f"; then
      rm -f "$D/etc/$f.new"
    else
      mv "$D/etc/$f.new" "$D/etc/$f"
      echo changed
    fi
  done
}

accounting_config() { # slurm.conf's accounting lines
  if [ "$ACCOUNTING" = 1 ]; then
    echo "AccountingStorageType=accounting_storage/slurmdbd"
    echo "AccountingStorageHost=127.0.0.1"
    echo "AccountingStoragePort=$DBD_PORT"
    echo "AccountingStorageTRES=gres/gpu,gres/gpu:$MULTI_TYPE"
    echo "JobAcctGatherType=jobacct_gather/linux"
    echo "JobAcctGatherFrequency=30"
  else
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
  fi
}

db_ok() { mysqladmin --socket="$DB_SOCK" ping >/dev/null 2>&1; }

start_accounting() { # MariaDB (own data dir, socket, port) and slurmdbd, before slurmctld
  command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null || {
    echo "accounting needs slurmdbd and mariadb-server: run .ci/slurm.sh install" \
      "(or SF_SLURM_ACCOUNTING=0)" >&2
    exit 1
  }
  mkdir -p "$D/mysql" # run as root, as the Slurm daemons are: the state dir is root's alone
  if ! db_ok; then
    [ -d "$D/mysql/data/mysql" ] ||
      mariadb-install-db --no-defaults --user=root --datadir="$D/mysql/data" \
        --auth-root-authentication-method=socket --skip-test-db >"$D/log/mariadb-install.log" 2>&1
    /usr/sbin/mariadbd --no-defaults --user=root --datadir="$D/mysql/data" \
      --bind-address=127.0.0.1 --port="$DB_PORT" --socket="$DB_SOCK" \
      --pid-file="$D/mysql/mysqld.pid" --log-error="$D/log/mariadb.log" \
      --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=2 --skip-name-resolve \
      >/dev/null 2>&1 &
    echo "mariadbd $D/mysql/mysqld.pid" >>"$STARTED"
    for _ in $(seq 150); do db_ok && break; sleep 0.1; done
    db_ok || { echo "MariaDB did not start (see $D/log/mariadb.log)" >&2; return 1; }
  fi
  mysql --socket="$DB_SOCK" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  {
    echo "AuthType=auth/munge"
    echo "DbdHost=localhost"
    echo "DbdAddr=127.0.0.1"
    echo "DbdPort=$DBD_PORT"
    echo "SlurmUser=root"
    echo "StorageType=accounting_storage/mysql"
    echo "StorageHost=127.0.0.1"
    echo "StoragePort=$DB_PORT"
    echo "StorageUser=slurm"
    echo "StoragePass=slurm"
    echo "StorageLoc=slurm_acct_db"
    echo "LogFile=$D/log/slurmdbd.log"
    echo "PidFile=$D/slurmdbd.pid"
  } >"$D/etc/slurmdbd.conf.new"
  chmod 600 "$D/etc/slurmdbd.conf.new"
  if ! cmp -s "$D/etc/slurmdbd.conf.new" "$D/etc/slurmdbd.conf"; then
    mv "$D/etc/slurmdbd.conf.new" "$D/etc/slurmdbd.conf"
    alive "$D/slurmdbd.pid" && stop_pid "$D/slurmdbd.pid"
  else
    rm -f "$D/etc/slurmdbd.conf.new"
  fi
  if ! alive "$D/slurmdbd.pid"; then
    /usr/sbin/slurmdbd # daemonizes; reads slurmdbd.conf beside $SLURM_CONF
    echo "slurmdbd $D/slurmdbd.pid" >>"$STARTED"
    for _ in $(seq 150); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx starforge-ci ||
    sacctmgr -i add cluster starforge-ci >/dev/null
}

wait_for_nodes() { # until every node takes jobs; a down or drained one is resumed
  local out="" node st bad
  for _ in $(seq 100); do
    out=$(sinfo -h -N -o '%N %T' 2>/dev/null || true)
    bad=0
    for node in $(nodes); do
      st=$(awk -v n="$node" '$1 == n {print $2; exit}' <<<"$out")
      case "$st" in
        idle | mixed | allocated | completing) ;;
        drain* | inval* | down*)
          bad=1
          scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
          ;;
        *) bad=1 ;;
      esac
    done
    if [ "$bad" = 0 ]; then
      echo "slurm up: nodes $(awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2}' <<<"$out")"
      return 0
    fi
    sleep 0.2
  done
  sinfo -N -l || true
  echo "slurm node states: ${out:-none} (see $D/log/)" >&2
  return 1
}

up() {
  command -v sbatch >/dev/null || {
    echo "sbatch is not installed: run .ci/slurm.sh install" >&2
    exit 1
  }
  mkdir -p "$D"/{etc,state,spool,log,dev}
  touch "$STARTED"
  start_munge
  local node pf changed
  changed=$(write_config)
  if [ "$ACCOUNTING" = 1 ]; then start_accounting; fi # before slurmctld, which registers
  if [ -n "$changed" ]; then # node/GRES changes need a restart, not `scontrol reconfigure`
    # every node's slurmd, and slurmd.pid of a state dir from before the multi nodes
    for pf in "$D"/slurmd-*.pid "$D"/slurmd.pid; do alive "$pf" && stop_pid "$pf"; done
    alive "$D/slurmctld.pid" && stop_pid "$D/slurmctld.pid"
  fi
  if ! alive "$D/slurmctld.pid"; then
    /usr/sbin/slurmctld # daemonizes and writes its pid file
    echo "slurmctld $D/slurmctld.pid" >>"$STARTED"
  fi
  for node in $(nodes); do
    pf=$(pidfile "$node")
    if ! alive "$pf"; then
      if [ "$node" = "$(hostname -s)" ]; then
        /usr/sbin/slurmd -N "$node"
      else # a log of its own: SlurmdLogFile is the host node's
        /usr/sbin/slurmd -N "$node" -L "$D/log/slurmd-$node.log"
      fi
      echo "slurmd $pf" >>"$STARTED"
    fi
  done
  wait_for_nodes
  echo "SLURM_CONF=$SLURM_CONF"
}

down() {
  [ -f "$STARTED" ] || { echo "slurm down: nothing was started by .ci/slurm.sh up"; return 0; }
  # slurmd, slurmctld, slurmdbd, MariaDB, munged: the reverse of the start order
  local daemon
  for daemon in slurmd slurmctld slurmdbd mariadbd munged; do
    awk -v d="$daemon" '$1 == d {print $2}' "$STARTED" | sort -u | while read -r pidfile; do
      stop_pid "$pidfile"
    done
  done
  rm -f "$STARTED"
  echo "slurm down"
}

restart_ctld() { # a crash and a restart: slurmctld recovers its jobs from the state dir
  if [ -s "$D/slurmctld.pid" ]; then
    kill -KILL "$(cat "$D/slurmctld.pid")" 2>/dev/null || true
    rm -f "$D/slurmctld.pid"
  fi
  /usr/sbin/slurmctld
  for _ in $(seq 100); do
    scontrol ping 2>/dev/null | grep -q "is UP" && break
    sleep 0.1
  done
  echo "slurmctld restarted: nodes $(sinfo -h -N -o '%N %T' 2>/dev/null | paste -sd, -)"
  wait_for_nodes # a node the restart left down or drained is resumed, as an operator would
}

case "${1:-}" in
  install)
    command -v sbatch >/dev/null && command -v slurmdbd >/dev/null &&
      command -v mariadbd >/dev/null && { echo "slurm already installed"; exit 0; }
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge slurmdbd mariadb-server
    ;;
  up) up ;;
  down) down ;;
  status) scontrol ping 2>/dev/null | grep -q "is UP" ;;
  restart-ctld) restart_ctld ;;
  *) echo "usage: $0 install|up|down|status|restart-ctld" >&2; exit 2 ;;
esac
