#!/usr/bin/env bash
# Debian's glewlwyd (2.7) as a real OpenID Connect provider for gpufleet's single sign-on tests (tests/directory).
# Each instance is a plain process on 127.0.0.1 with its own port, SQLite database and state directory, so
# pytest-xdist workers run one each without colliding. It never uses the packaged glewlwyd service.
# Plain http on 127.0.0.1 is on purpose: a test provider, reached only from this machine (gpufleet's client
# code still takes an https issuer and a CA file).
# Usage: oidc.sh install|start|stop|status
#   GPUFLEET_SERVICES_RUN          (default /tmp/gpufleet-services)  instance state under $RUN/oidc-$PORT
#   GPUFLEET_OIDC_PORT             (default 18900)
#   GPUFLEET_OIDC_REDIRECT_URIS    comma separated redirect URIs of the confidential client gpufleet-web
#   GPUFLEET_OIDC_ID_TOKEN_TTL_S   (default 300)  ID (and access) token lifetime
# `start` wipes the instance's state and makes, every time: an RSA signing key; the OIDC plugin (issuer
# http://127.0.0.1:$PORT/api/oidc: authorization code with PKCE S256, device authorization grant, discovery,
# JWKS); the clients gpufleet-web (confidential, secret) and gpufleet-cli (public, device grant); the users
# alice (gpu-admins, ml-vision), bob (ml-vision, ml-nlp) and carol (ml-nlp) with random passwords, whose ID
# tokens carry preferred_username, name, email and groups; their consent to both clients is given ahead.
# It prints last the path of an env file (keys: see tests/oidc_provider/glewlwyd_setup.py).
# In a browser: the authorization URL redirects to /login.html (fields #username and #password, button
# #loginbut, then the button "Continue"), which returns to the redirect URI with code and state.
# Without one: POST /api/auth/ {"username","password"} (what that form does) keeps a session cookie; then
# GET <callback_url of the login.html redirect>&g_continue (what Continue does), or, for a device code,
# GET <verification url>?code=<user code>&g_continue on that session.
set -euo pipefail
PORT=${GPUFLEET_OIDC_PORT:-18900}
STATE=${GPUFLEET_SERVICES_RUN:-/tmp/gpufleet-services}/oidc-$PORT
PIDFILE=$STATE/glewlwyd.pid
TTL=${GPUFLEET_OIDC_ID_TOKEN_TTL_S:-300}
HERE=$(cd "$(dirname "$0")" && pwd)
SETUP=$HERE/../../tests/oidc_provider/glewlwyd_setup.py
INIT_SQL=/usr/share/doc/glewlwyd/database/init.sqlite3.sql.gz
PY=/usr/bin/python3

install() {
  if [ -x /usr/bin/glewlwyd ] && [ -f "$INIT_SQL" ] && command -v sqlite3 >/dev/null && command -v openssl >/dev/null \
    && [ -x "$PY" ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "oidc: glewlwyd, sqlite3, openssl or python3 missing and not root" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    glewlwyd sqlite3 openssl python3 >/dev/null
  # The package may start its own service (port 4593) where an init system runs; the tests never use it.
  if command -v systemctl >/dev/null && systemctl is-active --quiet glewlwyd 2>/dev/null; then
    systemctl disable --now glewlwyd >/dev/null 2>&1 || true
  fi
}

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
url() { echo "http://127.0.0.1:$PORT"; }

write_config() {
  local ext mime
  {
    echo "# written by gpufleet scripts/services/oidc.sh"
    echo "port=$PORT"
    echo "bind_address=\"127.0.0.1\""
    echo "external_url=\"$(url)\""
    echo "login_url=\"login.html\""
    echo "static_files_path=\"$STATE/webapp/\""
    echo "api_prefix=\"api\""
    echo "allow_origin=\"*\""
    echo "log_mode=\"file\""
    echo "log_level=\"INFO\""
    echo "log_file=\"$STATE/glewlwyd.log\""
    echo "cookie_secure=0"
    echo "cookie_same_site=\"empty\""
    echo "session_expiration=3600"
    echo "session_key=\"GLEWLWYD2_SESSION_ID\""
    echo "admin_session_authentication=\"cookie\""
    echo "profile_session_authentication=\"cookie\""
    echo "allow_multiple_user_per_session=true"
    echo "login_api_enabled=true"
    echo "add_x_frame_option_header_deny=true"
    echo "max_post_size=16778240"
    echo "admin_scope=\"g_admin\""
    echo "profile_scope=\"g_profile\""
    echo "user_module_path=\"/usr/lib/glewlwyd/user\""
    echo "client_module_path=\"/usr/lib/glewlwyd/client\""
    echo "user_auth_scheme_module_path=\"/usr/lib/glewlwyd/scheme\""
    echo "plugin_module_path=\"/usr/lib/glewlwyd/plugin\""
    echo "use_secure_connection=false"
    # glewlwyd 2.7.5 refuses a config without these two even when TLS is off ("certificate is not valid")
    echo "secure_connection_key_file=\"$STATE/unused-tls.key\""
    echo "secure_connection_pem_file=\"$STATE/unused-tls.pem\""
    echo "hash_algorithm=\"SHA512\""
    echo "database ="
    echo "{"
    echo "  type = \"sqlite3\""
    echo "  path = \"$STATE/glewlwyd.db\""
    echo "};"
    echo "static_files_mime_types ="
    echo "("
    local first=1
    for ext in .html:text/html .css:text/css .js:application/javascript .json:application/json .png:image/png \
      .ico:image/x-icon .ttf:font/ttf .woff:font/woff .woff2:font/woff2 .eot:application/vnd.ms-fontobject \
      .map:application/octet-stream; do
      mime=${ext#*:}; ext=${ext%%:*}
      [ "$first" = 1 ] || echo "  ,"
      first=0
      echo "  {"
      echo "    extension = \"$ext\""
      echo "    mime_type = \"$mime\""
      echo "  }"
    done
    echo ");"
  } > "$STATE/glewlwyd.conf"
}

wait_up() {
  for _ in $(seq 1 100); do
    if "$PY" - "$(url)/login.html" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=1).read()
EOF
    running || return 1
    sleep 0.1
  done
  return 1
}

start() {
  install
  stop >/dev/null  # every start is a fresh provider: new key, secret and passwords
  # Another process on the port would answer in our place, and be configured by us.
  if ! "$PY" -c 'import socket, sys; socket.create_server(("127.0.0.1", int(sys.argv[1]))).close()' "$PORT" 2>/dev/null; then
    echo "oidc: port $PORT on 127.0.0.1 is in use by another process" >&2; return 1
  fi
  rm -rf "$STATE"; mkdir -p "$STATE"
  chmod 700 "$STATE"
  zcat "$INIT_SQL" | sqlite3 "$STATE/glewlwyd.db"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$STATE/signing.key" 2>/dev/null
  openssl pkey -in "$STATE/signing.key" -pubout -out "$STATE/signing.pub" 2>/dev/null
  # The login page: the package's webapp links its scripts and styles into other packages, and its
  # config.json to a directory; glewlwyd serves neither link, so each instance gets a real copy.
  cp -rL /usr/share/glewlwyd/webapp "$STATE/webapp" 2>/dev/null || true
  rm -rf "$STATE/webapp/config.json"
  cp /usr/share/glewlwyd/templates/config.json "$STATE/webapp/config.json"
  write_config
  setsid /usr/bin/glewlwyd --config-file="$STATE/glewlwyd.conf" >"$STATE/stdout.log" 2>&1 </dev/null &
  echo $! > "$PIDFILE"
  if ! wait_up; then
    echo "oidc: glewlwyd did not start on port $PORT" >&2
    tail -20 "$STATE/stdout.log" "$STATE/glewlwyd.log" >&2 2>/dev/null || true
    return 1
  fi
  "$PY" "$SETUP" --url "$(url)" --key "$STATE/signing.key" --cert "$STATE/signing.pub" \
    --redirect-uris "${GPUFLEET_OIDC_REDIRECT_URIS:-}" --id-token-ttl "$TTL" > "$STATE/oidc.env.new"
  mv "$STATE/oidc.env.new" "$STATE/oidc.env"
  echo "$STATE/oidc.env"
}

stop() {
  if running; then
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    for _ in $(seq 1 50); do running || break; sleep 0.1; done
    running && kill -9 "$(cat "$PIDFILE")" 2>/dev/null || true
  fi
  rm -f "$PIDFILE"
  echo "oidc: stopped (port $PORT)"
}

status() {
  if running; then echo "oidc: glewlwyd running pid $(cat "$PIDFILE") at $(url)/api/oidc"
  else echo "oidc: not running (port $PORT)"; return 1; fi
}

case "${1:-}" in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
