"""Shared file systems as this node sees them: reachable or hung, capacity and inodes, the client's counters.

- `probe`: stat and statvfs of a mount point in a child process with a deadline (`MountProber`), so a
  hung NFS or Lustre server never blocks the agent; at most one probe per mount is outstanding.
- `nfs`: `/proc/self/mountstats` parsed (pure); `lustre`: `lctl get_param` and `lfs df` (pure parsers
  and the programs' argv); `gpfs`: `mmhealth node show -Y` and `mmdf -Y` (the same).
- `source`: `StorageSource`, what the collector reads, and `HostStorage`, the real node's.
- `collector`: `StorageCollector`, one `fs:<mount point>` entity per watched mount and its `MountInfo`.
- `checks`: `StorageChecks`, the verdict on each required shared mount (hung, stale or gone fails).
"""
