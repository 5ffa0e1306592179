#!/bin/sh
# gpufleet's Slurm epilog: forgets the ending job in the map directory gpufleet's prolog (prolog.sh)
# wrote, so the GPUs it held stop carrying its label.
#
# slurmd runs it as root after each job on the node (slurm.conf: Epilog=). It takes the job's id off
# every GPU file that still names it, removing a file left naming no job, and removes the job's details
# (<dir>/jobs/<job id>). It looks at every GPU file rather than trusting SLURM_JOB_GPUS, so a file is
# cleaned even if the epilog's environment lacks the GPUs; a file naming only another job is left alone.
#
# The map directory: the first argument, else $GPUFLEET_SLURM_JOB_MAP_DIR, else /run/gpufleet/slurm-jobs
# (see prolog.sh for a wrapper that sets another one). It always exits 0: a failing Epilog drains the node.

dir=${1:-${GPUFLEET_SLURM_JOB_MAP_DIR:-/run/gpufleet/slurm-jobs}}
job=${SLURM_JOB_ID:-}

log() {
  echo "gpufleet-epilog: job ${job:-?}: $*" >&2
  command -v logger >/dev/null 2>&1 && logger -t gpufleet-slurm -p daemon.warning -- "epilog: job ${job:-?}: $*" 2>/dev/null
  return 0
}

replace() { # as in prolog.sh: written aside, then renamed over the old file
  tmp=$(mktemp "$(dirname "$1")/.gpufleet.XXXXXX") || return 1
  if printf '%s' "$2" >"$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$1"; then return 0; fi
  rm -f "$tmp"
  return 1
}

main() {
  case $job in '' | *[!0-9]*) log "SLURM_JOB_ID '$job' is not a job id; nothing removed"; return 0 ;; esac
  [ -d "$dir" ] || return 0 # no prolog ever wrote here
  # `command exec`: a redirection that fails must not end the shell (exec is a special built-in).
  if command -v flock >/dev/null 2>&1 && command exec 9>>"$dir/.lock"; then
    flock -w 10 9 || log "$dir/.lock still held after 10 s; going on without it"
  fi
  for file in "$dir"/*; do
    gpu=${file##*/}
    case $gpu in '' | *[!0-9]*) continue ;; esac
    [ -f "$file" ] || continue
    grep -qx -- "$job" "$file" || continue # another job's GPU (or no longer ours): leave it
    others=$(grep -vx -- "$job" "$file")
    if [ -z "$others" ]; then
      rm -f "$file" || log "cannot remove $file"
    else
      replace "$file" "$others
" || log "cannot rewrite $file"
    fi
  done
  rm -f "$dir/jobs/$job" || log "cannot remove $dir/jobs/$job"
  return 0
}

# slurmd hands over no PATH at all (Slurm 22.05); each shell has its own default then, so say it.
PATH=${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
umask 022 # the agent reads the map as whatever user it runs as
(main) # in a subshell: whatever goes wrong in it, the exit status below is still 0
exit 0
