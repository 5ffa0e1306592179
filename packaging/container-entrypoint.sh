#!/bin/sh
# The head image's entrypoint (Containerfile). On the first start of `server` with an empty volume it
# makes the cluster CA and the server certificate (`gpufleet server init`), for the names in
# GPUFLEET_SAN (space-separated host names and IPs the agents use to reach the head), so the head
# serves HTTPS from its first start. Certificates of your own: set GPUFLEET_TLS_CERT and GPUFLEET_TLS_KEY.
# The database is migrated by the head itself on every start. Any other command runs as `gpufleet ARGS`.
set -eu
if [ "${1:-}" = server ] && [ "$#" = 1 ] && [ -z "${GPUFLEET_TLS_CERT:-}" ] \
    && [ ! -f "${GPUFLEET_DATA_DIR}/tls/server.pem" ]; then
  set --
  for name in ${GPUFLEET_SAN:-}; do set -- "$@" --san "$name"; done
  gpufleet server init "$@"
  set -- server
fi
exec gpufleet "$@"
