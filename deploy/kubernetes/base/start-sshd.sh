#!/bin/sh
# A worker pod's process: sshd, as the pod's own (non-root) user, so that the driver can start
# workers in the pod over SSH (docs/ssh.md). This script is the container's command
# (docs/kubernetes.md).
#
# - Only the driver's key logs in: the public half, mounted read-only from the Secret. No
#   password, no forwarding of any kind.
# - A session gets the container's environment (the image's PATH and LD_LIBRARY_PATH, the CUDA
#   and NCCL variables, the pod's `env:`), which sshd would otherwise replace by its own.
# - It is Ready (the file $CLOUD_ELASTIC_SSHD_DIR/ready, which the readiness probe tests) once
#   sshd listens.
# - On SIGTERM (the pod is being deleted) it stops accepting connections, so the pod turns
#   NotReady, passes the SIGTERM on to each worker started here (through its remote wrapper), and
#   waits for them to end: each worker asks the driver to let it leave at its next commit, so a
#   deletion the driver's own watch missed still ends in a graceful leave. The kubelet's SIGKILL
#   at the end of terminationGracePeriodSeconds bounds the wait.
#
# Settings (environment): CLOUD_ELASTIC_SSHD_PORT (2222), CLOUD_ELASTIC_SSHD_LISTEN (0.0.0.0: an
# IPv4 address, e.g. the pod IP from the downward API), CLOUD_ELASTIC_AUTHORIZED_KEYS
# (/etc/cloud-elastic/ssh/authorized_keys), CLOUD_ELASTIC_SSHD_DIR (/run/cloud-elastic/sshd: the
# ready file; the host key and configuration in its private/), CLOUD_ELASTIC_SSHD (/usr/sbin/sshd).
set -eu

PORT=${CLOUD_ELASTIC_SSHD_PORT:-2222}
LISTEN=${CLOUD_ELASTIC_SSHD_LISTEN:-0.0.0.0}
KEYS=${CLOUD_ELASTIC_AUTHORIZED_KEYS:-/etc/cloud-elastic/ssh/authorized_keys}
DIR=${CLOUD_ELASTIC_SSHD_DIR:-/run/cloud-elastic/sshd}
SSHD=${CLOUD_ELASTIC_SSHD:-/usr/sbin/sshd}

log() { printf '[start-sshd] %s\n' "$*" >&2; }

# Not Ready until this container's sshd listens: the file is on the sshd-runtime emptyDir, which
# outlives a container restart, so the last container's file would pass the readiness probe while
# nothing listens (the driver's first login is refused and blacklists the pod's slots).
rm -f "$DIR/ready"
if [ ! -r "$KEYS" ]; then
    log "no authorized key at $KEYS: create the Secret cloud-elastic-ssh (docs/kubernetes.md)"
    exit 1
fi
mkdir -p "$DIR"
# sshd's host key and configuration are for this user alone, in a directory of its own made mode
# 700 here. Not $DIR itself: the kubelet makes an emptyDir owned by root, mode 0777 (2777 with the
# pod's fsGroup), which this user may write in but not chmod (under `set -e` that killed every
# container before sshd started). The ready file stays in $DIR, where the probe looks.
PRIVATE=$DIR/private
mkdir -m 700 "$PRIVATE" 2>/dev/null || true
if [ -L "$PRIVATE" ] || [ ! -d "$PRIVATE" ] || [ ! -O "$PRIVATE" ] || ! chmod 700 "$PRIVATE"; then
    log "$PRIVATE is not a directory of this user's (uid $(id -u)): remove it"
    exit 1
fi
# A host key of the pod's own, kept for its life (an emptyDir survives a container restart): a
# replaced pod is a new host with a new key, and the driver forgets the key it recorded for a
# recycled pod IP when a new pod stands behind it (docs/ssh.md, "Known hosts").
if [ ! -s "$PRIVATE/host_ed25519" ]; then
    rm -f "$PRIVATE/host_ed25519" "$PRIVATE/host_ed25519.pub"
    ssh-keygen -q -t ed25519 -N '' -C "$(hostname)" -f "$PRIVATE/host_ed25519"
fi

cat > "$PRIVATE/sshd_config" <<EOF
Port $PORT
ListenAddress $LISTEN
HostKey $PRIVATE/host_ed25519
PidFile none
# The key file is a read-only Secret volume, whose mount directory is a world-writable tmpfs:
# StrictModes would refuse it, and nobody but the kubelet can write it.
StrictModes no
AuthorizedKeysFile $KEYS
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding no
AllowStreamLocalForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
PermitUserRC no
PrintMotd no
# The driver opens one connection per worker, all at once when a round forms.
MaxStartups 64:30:256
LogLevel INFO
EOF

# The container's environment, for every session: one SetEnv line (sshd keeps only the first
# SetEnv it reads), a quoted NAME=VALUE a variable. Variables that
# describe the login (HOME, USER, ...) are sshd's to set; a value that sshd's configuration
# cannot carry (a double quote, a backslash, a line break) is left out and named.
python3 - "$PRIVATE/sshd_config" <<'EOF'
import os
import re
import sys

LOGIN = {"HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "MAIL"}
lines, skipped = [], []
for name, value in sorted(os.environ.items()):
    if name in LOGIN or name.startswith(("SSH_", "CLOUD_ELASTIC_SSHD")) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        continue
    if any(c in value for c in '"\\\n\r') or not value.isprintable():
        skipped.append(name)
        continue
    lines.append(f'"{name}={value}"')
if lines:
    with open(sys.argv[1], "a") as config:
        config.write("SetEnv " + " ".join(lines) + "\n")
if skipped:
    print(f"[start-sshd] not passed to sessions (a quote, backslash or line break in the value): {' '.join(skipped)}", file=sys.stderr)
EOF

"$SSHD" -t -f "$PRIVATE/sshd_config"
"$SSHD" -D -e -f "$PRIVATE/sshd_config" &
SSHD_PID=$!

# The remote wrapper of each worker the driver started through this sshd: a
# cloud_elastic.driver.launch.ssh_remote process whose SSH connection came in at this address and port. (In a
# pod every process is the pod's; the address and port tell apart two of these scripts that share
# a machine, as in the tests.)
if [ "$LISTEN" = 0.0.0.0 ]; then SERVER='[^ ]*'; else SERVER=$(printf '%s' "$LISTEN" | sed 's/[.]/[.]/g'); fi
wrappers() {
    # Their pids, one a line (a restarted driver's `--attach` relays included).
    for dir in /proc/[0-9]*; do
        grep -q 'cloud_elastic[.]driver[.]launch[.]ssh_remote' "$dir/cmdline" 2>/dev/null || continue
        # 2>/dev/null before the `<`: the shell opens the file, and says so when it may not (another
        # user's process); redirections apply left to right.
        if tr '\0' '\n' 2>/dev/null < "$dir/environ" | grep -q "^SSH_CONNECTION=.* $SERVER $PORT\$"; then
            echo "${dir#/proc/}"
        fi
    done
}

SIGNALLED=" "
pass_on_term() {
    # SIGTERM, once, to each wrapper (not to an `--attach` relay, which it would end): the wrapper
    # passes it to its worker, which leaves at its next commit (docs/kubernetes.md). Wrappers that
    # show up later (a login that sshd had already accepted) get theirs at the next look.
    for pid in $1; do
        case "$SIGNALLED" in *" $pid "*) continue ;; esac
        SIGNALLED="$SIGNALLED$pid "
        tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q 'ssh_remote --attach' && continue
        kill -TERM "$pid" 2>/dev/null || true
    done
}

on_term() {
    log "SIGTERM: no new connections; the workers started here leave at their next commit"
    rm -f "$DIR/ready"
    kill -TERM "$SSHD_PID" 2>/dev/null || true
    while left=$(wrappers) && [ -n "$left" ]; do
        pass_on_term "$left"
        sleep 1
    done
    log "no worker left: exiting"
    exit 0
}
trap on_term TERM INT

# Ready (the pod's readiness probe tests this file) once sshd listens: a probe that connected to
# sshd instead would log two lines at each period. Here, once a socket listens at sshd's address
# and port, one connection checks that sshd answers there: another process of the pod (a sidecar)
# may hold that port, and then sshd's bind fails and it exits, a moment later.
# /proc/net/tcp writes a listening socket as ADDR:PORT in hex, the address's bytes reversed.
SOCKET=$(IFS=.; set -- $LISTEN; printf '%02X%02X%02X%02X:%04X' "$4" "$3" "$2" "$1" "$PORT")
if [ "$LISTEN" = 0.0.0.0 ]; then ASK=127.0.0.1; else ASK=$LISTEN; fi
sshd_answers() {
    python3 - "$ASK" "$PORT" <<'EOF'
import socket
import sys

try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as conn:
        sys.exit(0 if conn.recv(64).startswith(b"SSH-") else 1)
except OSError:
    sys.exit(1)
EOF
}
until grep -q " $SOCKET 00000000:0000 0A " /proc/net/tcp 2>/dev/null && sshd_answers; do
    kill -0 "$SSHD_PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$SSHD_PID" 2>/dev/null; then
    touch "$DIR/ready"
    log "sshd listening on port $PORT for the key in $KEYS"
fi

# sshd ending by itself is an error: the pod restarts its container.
set +e
wait "$SSHD_PID"
status=$?
log "sshd exited with status $status"
exit "$status"
