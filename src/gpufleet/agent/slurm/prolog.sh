#!/bin/sh
# gpufleet's Slurm prolog: writes down which GPUs of this node the starting job holds, so the gpufleet
# agent (and dcgm-exporter's --hpc-job-mapping-dir) can label those GPUs' metrics with the job.
#
# slurmd runs it as root before each job on the node (slurm.conf: Prolog=), with the job in its
# environment: SLURM_JOB_ID, SLURM_JOB_GPUS (the allocated GPU indexes, "0,1"; unset without GPUs),
# SLURM_JOB_USER, SLURM_JOB_ACCOUNT (unset when the job names none and there is no accounting) and
# SLURM_JOB_PARTITION. It writes, in the map directory:
#   <dir>/<gpu index>    the ids of the jobs holding that GPU, one a line (dcgm-exporter's format)
#   <dir>/jobs/<job id>  user=, account=, partition= lines: what gpufleet labels the job with
# Every file is written aside and renamed into place, so a reader never sees half of one.
#
# The map directory: the first argument, else $GPUFLEET_SLURM_JOB_MAP_DIR, else /run/gpufleet/slurm-jobs
# (the agent's slurm_job_map_dir). slurm.conf cannot pass either (Prolog= takes a path, no arguments,
# and slurmd gives the prolog a clean environment), so another directory needs a two-line wrapper:
#   #!/bin/sh
#   exec /etc/slurm/gpufleet-prolog.sh /var/run/my-job-map
#
# It always exits 0: a failing Prolog drains the node and requeues the job, far worse than a GPU's
# metrics without a job label. Problems go to stderr (slurmd's log) and to syslog.

dir=${1:-${GPUFLEET_SLURM_JOB_MAP_DIR:-/run/gpufleet/slurm-jobs}}
job=${SLURM_JOB_ID:-}

log() {
  echo "gpufleet-prolog: job ${job:-?}: $*" >&2
  command -v logger >/dev/null 2>&1 && logger -t gpufleet-slurm -p daemon.warning -- "prolog: job ${job:-?}: $*" 2>/dev/null
  return 0
}

# $1 = file, $2 = its new content: written aside in the same directory, then renamed over the old one.
# The temporary name is not a number, so readers skip it as they skip anything else.
replace() {
  tmp=$(mktemp "$(dirname "$1")/.gpufleet.XXXXXX") || return 1
  if printf '%s' "$2" >"$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$1"; then return 0; fi
  rm -f "$tmp"
  return 1
}

# One value of the job file: a single line, whatever Slurm handed over.
clean() { printf '%s' "$1" | tr -d '\n\r' | cut -c1-64; }

main() {
  case $job in '' | *[!0-9]*) log "SLURM_JOB_ID '$job' is not a job id; nothing recorded"; return 0 ;; esac
  gpus=${SLURM_JOB_GPUS:-}
  [ -n "$gpus" ] || return 0 # a job without GPUs: nothing to map
  mkdir -p "$dir/jobs" || { log "cannot create $dir/jobs"; return 0; }
  # Prologs and epilogs of jobs sharing a GPU may run at once: take turns (never for more than 10 s).
  # `command exec`: a redirection that fails must not end the shell (exec is a special built-in).
  if command -v flock >/dev/null 2>&1 && command exec 9>>"$dir/.lock"; then
    flock -w 10 9 || log "$dir/.lock still held after 10 s; going on without it"
  fi
  details="user=$(clean "${SLURM_JOB_USER:-}")
account=$(clean "${SLURM_JOB_ACCOUNT:-}")
partition=$(clean "${SLURM_JOB_PARTITION:-}")
"
  # The job's details first: a reader that finds the job on a GPU finds who runs it too.
  replace "$dir/jobs/$job" "$details" || log "cannot write $dir/jobs/$job"
  for gpu in $(echo "$gpus" | tr ',' ' '); do
    case $gpu in '' | *[!0-9]*) log "SLURM_JOB_GPUS '$gpus': '$gpu' is not a GPU index"; continue ;; esac
    others=""
    if [ -f "$dir/$gpu" ]; then others=$(grep -vx -- "$job" "$dir/$gpu"); fi
    if [ -n "$others" ]; then content="$others
$job
"; else content="$job
"; fi
    replace "$dir/$gpu" "$content" || log "cannot write $dir/$gpu"
  done
  return 0
}

# slurmd hands over no PATH at all (Slurm 22.05); each shell has its own default then, so say it.
PATH=${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
umask 022 # the agent reads the map as whatever user it runs as
(main) # in a subshell: whatever goes wrong in it, the exit status below is still 0
exit 0
