#!/usr/bin/env bash
# Debian's slapd (OpenLDAP 2.5) as a real directory with TLS for gpufleet's directory tests (tests/directory).
# Each instance is a plain slapd process on 127.0.0.1 with its own ports and state directory, so pytest-xdist
# workers run one each without colliding. Debian's packaged slapd service is never used: `install` stops and
# disables it if the package started it.
# Usage: ldap.sh install|start|stop|status
#   GPUFLEET_SERVICES_RUN   (default /tmp/gpufleet-services)  instance state under $RUN/ldap-$PORT
#   GPUFLEET_LDAP_PORT      (default 18389)  plain LDAP, StartTLS offered
#   GPUFLEET_LDAP_TLS_PORT  (default 18636)  LDAPS
# `start` wipes the instance's state and makes a clean directory every time: a throwaway CA and a server
# certificate for 127.0.0.1 and localhost, suffix dc=gpufleet,dc=test, schemas core, cosine, nis,
# inetorgperson and openssh-lpk, the memberof and ppolicy overlays, and the seed below. It prints, last, the
# path of an env file (KEY=VALUE lines) holding everything a client needs.
# Seed: users alice, bob, carol, dave (uidNumber 20001-20004; password "<name>-pw"; dave locked by ppolicy),
# groupOfNames gpu-admins (alice), ml-vision (alice, bob), ml-nlp (bob, carol) and posixGroup hpc-users
# (alice, bob, carol, dave), ops (dave). The reader service account may read people and groups, never
# userPassword. Test credentials only.
set -euo pipefail
PORT=${GPUFLEET_LDAP_PORT:-18389}
TLS_PORT=${GPUFLEET_LDAP_TLS_PORT:-18636}
STATE=${GPUFLEET_SERVICES_RUN:-/tmp/gpufleet-services}/ldap-$PORT
PIDFILE=$STATE/slapd.pid.run
ENVFILE=$STATE/ldap.env
SLAPD=/usr/sbin/slapd
SLAPTEST=/usr/sbin/slaptest
SLAPPASSWD=/usr/sbin/slappasswd
BASE_DN=dc=gpufleet,dc=test
ADMIN_DN=cn=admin,$BASE_DN
READER_DN=cn=gpufleet-reader,ou=services,$BASE_DN
PEOPLE_BASE=ou=people,$BASE_DN
GROUP_BASE=ou=groups,$BASE_DN
POLICY_DN=cn=default,ou=policies,$BASE_DN

install() {
  if [ -x "$SLAPD" ] && command -v ldapsearch >/dev/null && command -v openssl >/dev/null; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "ldap: slapd, ldap-utils or openssl missing and not root (apt-get install slapd ldap-utils openssl)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slapd ldap-utils openssl >/dev/null
  stop_packaged
}

# The package starts its own slapd on port 389 where nothing forbids it (no policy-rc.d); the tests never
# use it, so it is stopped and kept from starting at boot.
stop_packaged() {
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now slapd >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/slapd ]; then
    /etc/init.d/slapd stop >/dev/null 2>&1 || true
    update-rc.d slapd disable >/dev/null 2>&1 || true
  fi
}

alive() { # a zombie is not alive
  local pid stat
  [ -f "$PIDFILE" ] || return 1
  pid=$(cat "$PIDFILE" 2>/dev/null); [ -n "$pid" ] || return 1
  stat=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [[ $stat != Z* ]]
}

fail() { # $1: what failed; the log's tail goes to stderr
  echo "ldap: $1 (port $PORT)" >&2
  [ -f "$STATE/slapd.log" ] && tail -25 "$STATE/slapd.log" >&2
  return 1
}

make_certs() {
  local d=$STATE/tls
  mkdir -p "$d"
  openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 30 -subj "/CN=gpufleet test LDAP CA $PORT" \
    -keyout "$d/ca.key" -out "$d/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req -new -nodes -newkey rsa:2048 -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
  cat > "$d/server.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
  openssl x509 -req -sha256 -days 30 -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null
  chmod 600 "$d/ca.key" "$d/server.key"
}

# openssh-lpk: the attribute sshd's AuthorizedKeysCommand tools read; Debian ships no schema for it.
write_lpk_schema() {
  cat > "$STATE/openssh-lpk.schema" <<'EOF'
attributetype ( 1.3.6.1.4.1.24552.500.1.1.1.13 NAME 'sshPublicKey'
  DESC 'OpenSSH public key'
  EQUALITY octetStringMatch
  SYNTAX 1.3.6.1.4.1.1466.115.121.1.40 )
objectclass ( 1.3.6.1.4.1.24552.500.1.1.2.0 NAME 'ldapPublicKey' SUP top AUXILIARY
  DESC 'OpenSSH public keys of a user'
  MAY ( sshPublicKey $ uid ) )
EOF
}

write_config() { # $1: the admin password's hash
  cat > "$STATE/slapd.conf" <<EOF
# written by gpufleet scripts/services/ldap.sh
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/nis.schema
include /etc/ldap/schema/inetorgperson.schema
include $STATE/openssh-lpk.schema
modulepath /usr/lib/ldap
moduleload back_mdb
moduleload memberof
moduleload ppolicy
pidfile $STATE/slapd.pid
argsfile $STATE/slapd.args
TLSCACertificateFile $STATE/tls/ca.pem
TLSCertificateFile $STATE/tls/server.pem
TLSCertificateKeyFile $STATE/tls/server.key
TLSProtocolMin 3.3
# Anyone may read the root DSE and the schema: clients look for StartTLS and paging there.
access to dn.base="" by * read
access to dn.base="cn=Subschema" by * read

database mdb
maxsize 67108864
suffix "$BASE_DN"
rootdn "$ADMIN_DN"
rootpw $1
directory $STATE/db
index objectClass eq
index uid,memberUid,member,uniqueMember eq
# The total of a paged search is not capped: big directories are read page by page.
limits dn.exact="$READER_DN" size.soft=500 size.hard=500 size.prtotal=unlimited
access to attrs=userPassword
  by self write
  by anonymous auth
  by * none
access to dn.subtree="$PEOPLE_BASE"
  by dn.exact="$READER_DN" read
  by self read
  by * none
access to dn.subtree="$GROUP_BASE"
  by dn.exact="$READER_DN" read
  by * none
access to dn.base="$BASE_DN"
  by dn.exact="$READER_DN" read
  by * none
access to * by * none

overlay memberof
memberof-group-oc groupOfNames
memberof-member-ad member
memberof-memberof-ad memberOf
memberof-refint TRUE

overlay ppolicy
ppolicy_default "$POLICY_DN"
EOF
}

user_ldif() { # $1: name  $2: uidNumber  $3: gidNumber  $4: full name  $5...: SSH public keys
  local name=$1 uid=$2 gid=$3 full=$4 key
  shift 4
  echo "dn: uid=$name,$PEOPLE_BASE"
  printf 'objectClass: %s\n' inetOrgPerson posixAccount ldapPublicKey
  echo "uid: $name"
  echo "cn: $full"
  echo "sn: ${full##* }"
  echo "givenName: ${full%% *}"
  echo "mail: $name@gpufleet.test"
  echo "uidNumber: $uid"
  echo "gidNumber: $gid"
  echo "homeDirectory: /home/$name"
  echo "loginShell: /bin/bash"
  for key in "$@"; do echo "sshPublicKey: $key"; done
  echo "userPassword: $("$SLAPPASSWD" -s "$name-pw")"
  echo
}

write_seed() { # $1: the reader's password
  {
    printf 'dn: %s\nobjectClass: dcObject\nobjectClass: organization\ndc: gpufleet\no: gpufleet tests\n\n' "$BASE_DN"
    for ou in people groups services policies; do
      printf 'dn: ou=%s,%s\nobjectClass: organizationalUnit\nou: %s\n\n' "$ou" "$BASE_DN" "$ou"
    done
    # No automatic lockout (pwdMaxFailure 0): the tests try wrong passwords on purpose. An account is
    # locked by hand, as sites disable one: pwdAccountLockedTime 000001010000Z.
    printf 'dn: %s\nobjectClass: device\nobjectClass: pwdPolicy\ncn: default\n' "$POLICY_DN"
    printf 'pwdAttribute: userPassword\npwdLockout: TRUE\npwdMaxFailure: 0\n\n'
    printf 'dn: %s\nobjectClass: applicationProcess\nobjectClass: simpleSecurityObject\ncn: gpufleet-reader\n' "$READER_DN"
    printf 'userPassword: %s\n\n' "$("$SLAPPASSWD" -s "$1")"
    user_ldif alice 20001 20001 "Alice Archer" \
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJqmbsO6VabbXYbvYJ+NYXNxFSu3pELU9+DDL/O5Vt2v alice@gpufleet.test" \
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk77pxGvLr0F9qyj0ZEEUmK01FZP7FR2EoN37FLyhCk alice@laptop"
    user_ldif bob 20002 20002 "Bob Baker" \
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICzL69+F/mqRZov1b2tGuO9+7eMrGKyR1SeYARP7KXrn bob@gpufleet.test"
    user_ldif carol 20003 20003 "Carol Chen" \
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII7rkqLMVbN4G1gGFMmKP7S+CXTJ0rkZbgGISNslC6aG carol@gpufleet.test"
    user_ldif dave 20004 20004 "Dave Dunn" \
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOR6j+BIXMuxReaN2wSirOq4j64GI5d0OMPTU0PesVUk dave@gpufleet.test"
    printf 'dn: uid=dave,%s\nchangetype: modify\nadd: pwdAccountLockedTime\npwdAccountLockedTime: 000001010000Z\n\n' "$PEOPLE_BASE"
    group_of_names gpu-admins alice
    group_of_names ml-vision alice bob
    group_of_names ml-nlp bob carol
    posix_group hpc-users 30001 alice bob carol dave
    posix_group ops 30002 dave
  } > "$STATE/seed.ldif"
}

group_of_names() { # $1: cn  $2...: member uids
  local cn=$1 m
  shift
  printf 'dn: cn=%s,%s\nchangetype: add\nobjectClass: groupOfNames\ncn: %s\n' "$cn" "$GROUP_BASE" "$cn"
  for m in "$@"; do echo "member: uid=$m,$PEOPLE_BASE"; done
  echo
}

posix_group() { # $1: cn  $2: gidNumber  $3...: memberUid values
  local cn=$1 gid=$2 m
  shift 2
  printf 'dn: cn=%s,%s\nchangetype: add\nobjectClass: posixGroup\ncn: %s\ngidNumber: %s\n' "$cn" "$GROUP_BASE" "$cn" "$gid"
  for m in "$@"; do echo "memberUid: $m"; done
  echo
}

ldap_tool() { # $1: ldapsearch|ldapmodify  $2...: its arguments; StartTLS checked against the instance's CA
  local tool=$1
  shift
  LDAPCONF=/dev/null LDAPTLS_CACERT=$STATE/tls/ca.pem LDAPTLS_REQCERT=demand "$tool" -x -ZZ \
    -H "ldap://127.0.0.1:$PORT" -o nettimeout=2 "$@"
}

write_env() { # $1: the admin's password  $2: the reader's
  cat > "$ENVFILE" <<EOF
GPUFLEET_LDAP_URL=ldap://127.0.0.1:$PORT
GPUFLEET_LDAPS_URL=ldaps://127.0.0.1:$TLS_PORT
GPUFLEET_LDAP_CA_FILE=$STATE/tls/ca.pem
GPUFLEET_LDAP_BASE_DN=$BASE_DN
GPUFLEET_LDAP_USER_BASE=$PEOPLE_BASE
GPUFLEET_LDAP_GROUP_BASE=$GROUP_BASE
GPUFLEET_LDAP_BIND_DN=$READER_DN
GPUFLEET_LDAP_BIND_PASSWORD=$2
GPUFLEET_LDAP_ADMIN_DN=$ADMIN_DN
GPUFLEET_LDAP_ADMIN_PASSWORD=$1
GPUFLEET_LDAP_USER_PASSWORDS=alice:alice-pw,bob:bob-pw,carol:carol-pw,dave:dave-pw
GPUFLEET_LDAP_STATE=$STATE
GPUFLEET_LDAP_PID=$(cat "$PIDFILE")
EOF
}

start() {
  install
  if alive; then echo "$ENVFILE"; return 0; fi
  local admin_pw reader_pw
  rm -rf "$STATE"; mkdir -p "$STATE/db"
  admin_pw=admin-$(openssl rand -hex 8)
  reader_pw=reader-$(openssl rand -hex 8)
  make_certs
  write_lpk_schema
  write_config "$("$SLAPPASSWD" -s "$admin_pw")"
  "$SLAPTEST" -u -f "$STATE/slapd.conf" >"$STATE/slapd.log" 2>&1 || fail "slaptest refused the configuration" || return 1
  # -d keeps slapd in the foreground (setsid: out of the caller's process group); 256 logs each operation.
  setsid "$SLAPD" -d 256 -f "$STATE/slapd.conf" -h "ldap://127.0.0.1:$PORT/ ldaps://127.0.0.1:$TLS_PORT/" \
    >"$STATE/slapd.log" 2>&1 </dev/null &
  echo $! > "$PIDFILE"
  local up=
  for _ in $(seq 1 100); do
    if ldap_tool ldapsearch -LLL -s base -b "" namingContexts >/dev/null 2>&1; then up=1; break; fi
    alive || break
    sleep 0.1
  done
  [ -n "$up" ] || { fail "slapd did not answer StartTLS"; stop >/dev/null; return 1; }
  write_seed "$reader_pw"
  if ! ldap_tool ldapmodify -a -D "$ADMIN_DN" -w "$admin_pw" -f "$STATE/seed.ldif" >"$STATE/seed.log" 2>&1; then
    cat "$STATE/seed.log" >&2
    fail "seeding the directory failed"; stop >/dev/null; return 1
  fi
  write_env "$admin_pw" "$reader_pw"
  echo "$ENVFILE"
}

stop() {
  if alive; then
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    for _ in $(seq 1 50); do alive || break; sleep 0.1; done
    alive && kill -9 "$(cat "$PIDFILE")" 2>/dev/null || true
  fi
  rm -f "$PIDFILE"
  echo "ldap: stopped (port $PORT)"
}

status() {
  if alive; then echo "ldap: running pid $(cat "$PIDFILE") on ports $PORT and $TLS_PORT, env $ENVFILE"
  else echo "ldap: not running (port $PORT)"; return 1; fi
}

case "${1:-}" in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
