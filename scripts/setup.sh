#!/usr/bin/env bash
# Set up this machine for optirack, as root, idempotently: Debian packages, Open vSwitch
# (userspace datapath), dockerd, the virtualenv with the project, and the worker image.
# A second run checks each step, changes nothing that is already right, and says so.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
LOG_DIR=${OPTIRACK_LOG_DIR:-/var/log/optirack}
# containernetworking-plugins, busybox-static: the NIC helper image; docker-registry: the emulated
# rack's registry; openssl: its certificates; slurm*, munge, mariadb-server: Slurm on the emulated
# rack (emulation/slurm.py runs its own munged, MariaDB and daemons under /run/optirack/slurm; the
# packages' own services are not used); netconfd, python3-ncclient: the NETCONF OCS (its emulation, its driver).
PACKAGES=(openvswitch-switch mininet docker.io debootstrap iperf3 ethtool iputils-ping iproute2
          python3-venv python3-dev ca-certificates curl prometheus chromium containernetworking-plugins
          busybox-static docker-registry openssl slurmctld slurmd slurm-client slurmdbd munge mariadb-server
          netconfd python3-ncclient openssh-server)
CHANGED=0

current_step=""
step() { current_step=$1; printf '==> %s\n' "$1"; }
ok() { printf '    %s\n' "$1"; }
changed() { CHANGED=1; printf '    %s\n' "$1"; }
fail() { printf 'setup failed at step "%s": %s\n' "$current_step" "$1" >&2; exit 1; }
trap 'fail "command failed (exit $?) at line $LINENO; see the output above"' ERR

[ "$(id -u)" -eq 0 ] || { echo "setup must run as root (it installs packages and starts daemons): sudo make setup" >&2; exit 1; }
mkdir -p "$LOG_DIR"

have_systemd() { [ -d /run/systemd/system ]; }

step "Debian packages"
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  ok "all ${#PACKAGES[@]} installed"
else
  ok "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >"$LOG_DIR/apt.log" 2>&1 || fail "apt-get update failed (see $LOG_DIR/apt.log)"
  # No service is started by the install (openssh-server's would be the system's sshd, which the emulated
  # NETCONF OCS does not use: it runs its own): a policy that says so, unless the machine has one already.
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# optirack setup: no service starts while packages install\nexit 101\n' >"$policy"
    chmod 755 "$policy"
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$LOG_DIR/apt.log" 2>&1 \
    || { [ -z "$policy" ] || rm -f "$policy"; fail "apt-get install failed (see $LOG_DIR/apt.log)"; }
  [ -z "$policy" ] || rm -f "$policy"
  changed "installed ${#missing[@]} packages"
fi

step "kernel settings for the emulated rack"
# Open vSwitch's userspace datapath sends every packet of every port through one packet socket,
# made when ovs-vswitchd starts, with the default send buffer. Jumbo frames waiting in the shaped
# ports' queues fill the usual 208 kB at once, and then OVS drops packets silently (see
# emulation/shaping.py). The setting is kept in /etc/sysctl.d for the next boot.
WANT_WMEM=8388608
RESTART_OVS=0
if [ "$(sysctl -n net.core.wmem_default)" -ge "$WANT_WMEM" ]; then
  ok "net.core.wmem_default is $(sysctl -n net.core.wmem_default)"
else
  sysctl -qw net.core.wmem_default="$WANT_WMEM" || fail "cannot set net.core.wmem_default"
  echo "net.core.wmem_default = $WANT_WMEM" >>/etc/sysctl.d/60-optirack.conf
  RESTART_OVS=1
  changed "net.core.wmem_default = $WANT_WMEM (kept in /etc/sysctl.d/60-optirack.conf)"
fi
# Its receive side: one packet socket per port, made when the port is added (rack-up), with the
# default receive buffer: 208 kB, about a dozen jumbo frames. When ovs-vswitchd falls behind for a
# moment on a busy host, a port's socket overflows and drops (`ss -0 -m`, the socket's d counter;
# seen on the lossless fabric). 4 MB holds every window of the rack.
WANT_RMEM=4194304
if [ "$(sysctl -n net.core.rmem_default)" -ge "$WANT_RMEM" ]; then
  ok "net.core.rmem_default is $(sysctl -n net.core.rmem_default)"
else
  sysctl -qw net.core.rmem_default="$WANT_RMEM" || fail "cannot set net.core.rmem_default"
  grep -q rmem_default /etc/sysctl.d/60-optirack.conf 2>/dev/null \
    || echo "net.core.rmem_default = $WANT_RMEM" >>/etc/sysctl.d/60-optirack.conf
  changed "net.core.rmem_default = $WANT_RMEM (kept in /etc/sysctl.d/60-optirack.conf; new rack ports get it)"
fi

# The emulated racks' addresses (the benchmarking range 198.18.0.0/15: GPU NICs, engines, the
# registry) never leave this host. While no rack is up, a controller that asks a server's engine
# would send its packets out of the default route; this route refuses them at once instead. A
# rack's own bridges add more specific routes, which win while it is up. Not kept across reboots:
# make setup adds it again.
EMULATED=198.18.0.0/15
if [ -n "$(ip route show type unreachable "$EMULATED")" ]; then
  ok "$EMULATED stays on this host"
else
  ip route add unreachable "$EMULATED" metric 4000 || fail "cannot add the route that keeps $EMULATED on this host"
  changed "$EMULATED stays on this host (an unreachable route below the racks' own)"
fi

# A daemon started here must not keep the descriptors this script inherited: a lock held around `make setup`
# (`flock LOCK make demo`) would otherwise be held by ovsdb-server, ovs-vswitchd and dockerd for as long as they run.
# It replaces the process that calls it: call it in a subshell, `( exec_without_inherited_fds CMD )` or `... &`.
exec_without_inherited_fds() {
  for fd in /proc/$BASHPID/fd/*; do
    fd=${fd##*/}
    if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-" 2>/dev/null; fi
  done
  exec "$@"
}

step "Open vSwitch (userspace datapath)"
ovs_answers() { ovs-vsctl --timeout=5 show >/dev/null 2>&1 && ovs-appctl -t ovs-vswitchd version >/dev/null 2>&1; }
ovs_service() {  # start | restart
  if have_systemd; then
    systemctl "$1" openvswitch-switch || fail "systemctl $1 openvswitch-switch failed"
  else
    # No systemd here; ovs-ctl runs both daemons. The kernel module is not needed: every
    # optirack bridge uses datapath_type=netdev.
    (exec_without_inherited_fds /usr/share/openvswitch/scripts/ovs-ctl "$1" --system-id=random) >"$LOG_DIR/ovs-ctl.log" 2>&1 \
      || fail "ovs-ctl $1 failed (see $LOG_DIR/ovs-ctl.log)"
  fi
  ovs-vsctl --timeout=10 show >/dev/null || fail "ovs-vsctl does not answer after $1"
}
if ovs_answers && [ "$RESTART_OVS" -eq 1 ]; then
  # running since before the setting above: its packet socket still has the small buffer
  ovs_service restart
  changed "restarted, to take the larger socket buffer"
elif ovs_answers; then
  ok "ovsdb-server and ovs-vswitchd answer ($(ovs-vsctl --version | head -1))"
else
  ovs_service start
  changed "started"
fi

step "Docker Engine"
if timeout 10 docker info >/dev/null 2>&1; then
  ok "dockerd answers"
else
  if have_systemd; then
    systemctl start docker || fail "systemctl start docker failed"
  else
    command -v dockerd >/dev/null || fail "dockerd not found (package docker.io)"
    exec_without_inherited_fds setsid dockerd >"$LOG_DIR/dockerd.log" 2>&1 < /dev/null &
  fi
  for _ in $(seq 60); do timeout 5 docker info >/dev/null 2>&1 && break; sleep 1; done
  timeout 10 docker info >/dev/null 2>&1 || fail "dockerd did not answer within 60 s (see $LOG_DIR/dockerd.log)"
  changed "started dockerd"
fi

step "virtualenv $VENV"
# Debian's Mininet is installed for /usr/bin/python3, hence --system-site-packages.
stamp=$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)
if [ -f "$VENV/.optirack-stamp" ] && [ "$(cat "$VENV/.optirack-stamp")" = "$stamp" ] \
   && "$VENV/bin/python" -c "import controller, mininet, ryu, torch, distributed" 2>/dev/null; then
  ok "up to date"
else
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$VENV" \
    || fail "cannot create the virtualenv"
  # torch==2.13.0 is the CPU build (see README); the worker uses a GPU only where one exists.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation -e "$ROOT[controller,worker,dev]" \
    >"$LOG_DIR/pip.log" 2>&1 || { tail -20 "$LOG_DIR/pip.log" >&2; fail "pip install failed (see $LOG_DIR/pip.log)"; }
  echo "$stamp" >"$VENV/.optirack-stamp"
  changed "installed optirack and its pinned dependencies"
fi

step "worker image"
if "$ROOT/scripts/build-image.sh" --check >/dev/null 2>&1; then
  ok "up to date"
else
  "$ROOT/scripts/build-image.sh" || fail "the worker image did not build"
  CHANGED=1
fi

if [ "$CHANGED" -eq 0 ]; then
  echo "setup: nothing to do; everything was already in place."
else
  echo "setup: done."
fi
