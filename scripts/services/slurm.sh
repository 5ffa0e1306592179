#!/usr/bin/env bash
# A throwaway single-node Slurm for gpufleet's tests (tests/slurm): Debian's Slurm 22.05 (slurmctld, slurmd,
# the client programs) and munge, with a fake GPU GRES, every file private to a state directory. It never
# touches /etc/slurm, /etc/munge or a packaged service, and needs no systemd and no cgroups.
# Usage: slurm.sh install|start|stop|status
#   GPUFLEET_SLURM_STATE (default /tmp/gpufleet-test-slurm)  GPUFLEET_SLURM_GPUS (default 4)
#   GPUFLEET_SLURMCTLD_PORT (default 16817)  GPUFLEET_SLURMD_PORT (default 16818)
#   GPUFLEET_SLURM_NODE (default sim001): the Slurm node's name. It need not be the host's name (NodeHostname
#     is; slurmd runs with -N), so it can be the name of a simulated gpufleet node, which the end-to-end tests
#     need: Slurm's node names are gpufleet's node names.
#   GPUFLEET_SLURM_DBD=1: also MariaDB (a private datadir under $STATE/mysql, 127.0.0.1:GPUFLEET_SLURM_DB_PORT,
#     default 16830) and slurmdbd (127.0.0.1:GPUFLEET_SLURMDBD_PORT, default 16819), with accounting through
#     slurmdbd and associations and limits enforced (tests/slurm/test_slurm_accounts_real.py). Run it as a separate
#     instance beside the plain one: its own GPUFLEET_SLURM_STATE, ports and GPUFLEET_SLURM_NODE. Use the same
#     value for start, status and stop.
# install: apt-get install the packages when missing (root only; otherwise exit 3).
# start:   installs, starts munged, slurmctld and slurmd (root: SlurmUser=root), waits for the node to be
#          idle, and prints the path of $STATE/env (shell exports: SLURM_CONF, SLURM_NODE, SLURM_GPUS,
#          SLURM_JOBOUT). Already running: prints the path again.
# Why the configuration (Debian 12, no systemd, root; see also ../shared/recipes/slurm-single-node.sh):
#  * proctrack/linuxproc + task/none: no cgroup plugin is needed.
#  * GRES File= must name character devices, else slurmd refuses them ("is not a valid character or block
#    device") and CUDA_VISIBLE_DEVICES stays empty: we mknod c 240 N under $STATE/dev (no driver behind them).
#  * No slurmdbd: accounting_storage/none; finished jobs are in $STATE/log/jobcomp.txt (`sacct -c`).
#  * With slurmdbd and a non-default munge socket, AccountingStoragePass=<munge socket> is required, else
#    the clients fail with "Sending PersistInit msg: Protocol authentication error". GrpTRES=gres/gpu=N is
#    enforced only with gres/gpu in AccountingStorageTRES and `limits` in AccountingStorageEnforce (which
#    implies `associations`: a job needs an association, root's comes with `sacctmgr add cluster`).
#  * ReturnToService=2: a node that was DOWN comes back by itself when slurmd registers again.
set -euo pipefail
STATE=${GPUFLEET_SLURM_STATE:-/tmp/gpufleet-test-slurm}
NGPU=${GPUFLEET_SLURM_GPUS:-4}
CTLD_PORT=${GPUFLEET_SLURMCTLD_PORT:-16817}
SLURMD_PORT=${GPUFLEET_SLURMD_PORT:-16818}
NODE=${GPUFLEET_SLURM_NODE:-sim001}
WITH_DBD=${GPUFLEET_SLURM_DBD:-0}
DB_PORT=${GPUFLEET_SLURM_DB_PORT:-16830}
DBD_PORT=${GPUFLEET_SLURMDBD_PORT:-16819}
HOST=$(hostname -s)
MUNGE_SOCK=$STATE/munge/munge.sock
export SLURM_CONF=$STATE/etc/slurm.conf

alive() { # $1 = pid file; true while that process runs (a zombie does not count)
  local pid st
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] || return 1
  st=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [[ $st != Z* ]]
}

wait_for() { # $1 = seconds, then a command to retry every 0.2 s
  local tries=$(($1 * 5))
  shift
  for _ in $(seq 1 "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

install() {
  local missing=() pkgs=(slurmctld slurmd slurm-client munge)
  [ "$WITH_DBD" = 1 ] && pkgs+=(slurmdbd mariadb-server mariadb-client)
  for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done  # not "rc": removed, configuration kept
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    echo "slurm: ${missing[*]} not installed and not root (apt-get install ${missing[*]})" >&2; return 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

configure() {
  mkdir -p "$STATE"/{etc,spool/ctld,spool/d,log,run,dev,munge,jobout}
  chmod 755 "$STATE" "$STATE/etc" "$STATE/run" "$STATE/munge"  # munge wants its socket's directory 0755
  chmod 1777 "$STATE/jobout"
  if [ ! -s "$STATE/munge/munge.key" ]; then
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    chmod 600 "$STATE/munge/munge.key"
  fi
  local i
  for i in $(seq 0 $((NGPU - 1))); do
    [ -c "$STATE/dev/fakegpu$i" ] || { rm -f "$STATE/dev/fakegpu$i"; mknod -m 666 "$STATE/dev/fakegpu$i" c 240 "$i"; }
  done
  # gpufleet's job <-> GPU mapping (docs/slurm.md): Prolog= takes a path without arguments and slurmd
  # gives it a clean environment, so two wrappers hand the shipped scripts (from this checkout) the map
  # directory. It starts empty, as /run does at boot.
  local jobmap_src
  jobmap_src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../src/gpufleet/agent/slurm" && pwd)
  rm -rf "$STATE/jobmap"
  for i in prolog epilog; do
    printf '#!/bin/sh\nexec /bin/sh "%s/%s.sh" "%s"\n' "$jobmap_src" "$i" "$STATE/jobmap" >"$STATE/etc/$i"
    chmod 755 "$STATE/etc/$i"
  done
  cat >"$SLURM_CONF" <<EOF
ClusterName=gpufleet
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
$(accounting_conf)
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
SchedulerType=sched/backfill
# A pending job is tried again within seconds, not Slurm's default minute: tests wait for jobs to start.
SchedulerParameters=sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
Prolog=$STATE/etc/prolog
Epilog=$STATE/etc/epilog
GresTypes=gpu
NodeName=$NODE NodeHostname=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=1000 Gres=gpu:fake:$NGPU State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$STATE/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=$NODE Name=gpu Type=fake File=$STATE/dev/fakegpu[0-$((NGPU - 1))]
EOF
  cat >"$STATE/env" <<EOF
export SLURM_CONF=$SLURM_CONF
export SLURM_NODE=$NODE
export SLURM_GPUS=$NGPU
export SLURM_JOBOUT=$STATE/jobout
export SLURM_JOB_MAP_DIR=$STATE/jobmap
EOF
}

accounting_conf() { # slurm.conf's accounting lines
  if [ "$WITH_DBD" = 1 ]; then
    printf '%s\n' "AccountingStorageType=accounting_storage/slurmdbd" "AccountingStorageHost=127.0.0.1" \
      "AccountingStoragePort=$DBD_PORT" "AccountingStoragePass=$MUNGE_SOCK" "AccountingStorageTRES=gres/gpu" \
      "AccountingStorageEnforce=associations,limits"
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi
}

configure_dbd() { # slurmdbd.conf beside slurm.conf (where slurmdbd looks for it), with a password made
  # for this start (no fixed secret in a file) for a throwaway database reachable only on 127.0.0.1.
  DB_PASS=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  cat >"$STATE/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$STATE/etc/slurmdbd.conf" # slurmdbd refuses a slurmdbd.conf others can read
  echo "export SLURM_ACCOUNTING=slurmdbd" >>"$STATE/env"
}

start_dbd() { # MariaDB in a fresh private datadir (a clean start, like slurmctld -c), then slurmdbd
  local sock=$STATE/run/mysql.sock cluster
  rm -rf "$STATE/mysql"
  mariadb-install-db --no-defaults --datadir="$STATE/mysql" --user=root --skip-test-db \
    --auth-root-authentication-method=socket >"$STATE/log/mariadb-install.log" 2>&1 \
    || fail "mariadb-install-db failed" "$STATE/log/mariadb-install.log"
  setsid mariadbd --no-defaults --datadir="$STATE/mysql" --user=root --bind-address=127.0.0.1 --port="$DB_PORT" \
    --socket="$sock" --pid-file="$STATE/run/mariadbd.pid" --log-error="$STATE/log/mariadb.err" \
    --skip-log-bin --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=0 >/dev/null 2>&1 </dev/null &
  wait_for 30 mariadb --no-defaults -S "$sock" -uroot -e 'select 1' || fail "MariaDB did not come up" "$STATE/log/mariadb.err"
  # On stdin, not -e: the password stays off the command line.
  mariadb --no-defaults -S "$sock" -uroot <<<"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  slurmdbd
  wait_for 30 sacctmgr -n list cluster || fail "slurmdbd did not come up" "$STATE/log/slurmdbd.log"
  cluster=$(sed -n 's/^ClusterName=//p' "$SLURM_CONF")
  sacctmgr -i add cluster "$cluster" >/dev/null # also makes the root account and root's association
}

daemons() { # the daemons this instance runs, in starting order
  echo munged
  [ "$WITH_DBD" = 1 ] && echo mariadbd slurmdbd
  echo slurmctld slurmd
}

running() { # every daemon of this instance is alive
  local d
  for d in $(daemons); do alive "$STATE/run/$d.pid" || return 1; done
}

fail() { # $1 = message, $2 = log to show
  echo "slurm: $1" >&2
  [ -f "$2" ] && tail -20 "$2" >&2
  return 1
}

start() {
  install
  if running; then echo "$STATE/env"; return 0; fi
  stop >/dev/null 2>&1 || true
  rm -rf "$STATE/spool" "$STATE/log" "$STATE/jobout"
  configure
  if [ "$WITH_DBD" = 1 ]; then configure_dbd; fi
  munged --socket="$MUNGE_SOCK" --key-file="$STATE/munge/munge.key" --log-file="$STATE/log/munged.log" \
    --pid-file="$STATE/run/munged.pid" --seed-file="$STATE/munge/munged.seed"
  wait_for 10 bash -c "munge -n --socket='$MUNGE_SOCK' | unmunge --socket='$MUNGE_SOCK'" \
    || fail "munged did not come up" "$STATE/log/munged.log"
  if [ "$WITH_DBD" = 1 ]; then start_dbd; fi # not `&& start_dbd`: set -e does not reach into that
  slurmctld -c  # -c: a clean start, forgetting earlier jobs and node states
  wait_for 20 scontrol ping || fail "slurmctld did not come up" "$STATE/log/slurmctld.log"
  slurmd -N "$NODE"
  wait_for 30 bash -c "sinfo -h -N -o %T | grep -qx idle" || fail "slurmd did not register" "$STATE/log/slurmd.log"
  echo "$STATE/env"
}

stop() {
  local d
  for d in slurmd slurmctld slurmdbd mariadbd munged; do # the dbd pair has no pid file without GPUFLEET_SLURM_DBD
    if alive "$STATE/run/$d.pid"; then
      kill "$(cat "$STATE/run/$d.pid")" || true
      for _ in $(seq 1 100); do alive "$STATE/run/$d.pid" || break; sleep 0.1; done
    fi
    rm -f "$STATE/run/$d.pid"
  done
  echo "slurm: stopped"
}

status() {
  local d rc=0
  for d in $(daemons); do
    if alive "$STATE/run/$d.pid"; then echo "$d: running (pid $(cat "$STATE/run/$d.pid"))"; else echo "$d: not running"; rc=1; fi
  done
  [ $rc = 0 ] && echo "slurm: running (source $STATE/env)"
  return $rc
}

case "${1:-}" in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
