#!/usr/bin/env bash
# A real Slurm cluster on this machine, for the Slurm tests and the
# control-plane benchmark (docs/slurm.md): Debian's slurm-wlm and munge,
# started without systemd, with every file of theirs under DIR.
#
#   tools/slurm-local.sh start DIR [NODES]   starts munged, slurmctld and NODES
#       slurmds (1 or 2, default 2); once every node is idle prints
#         SLURM_CONF=DIR/slurm.conf
#         SLURM_NODES=N                 the nodes it has
#         DGCA_ADVERTISE_HOST=ADDR      where the nodes reach this machine
#         DGCA_GLOO_IFACE=IF            (2 nodes) the interface both nodes have
#   tools/slurm-local.sh stop DIR    cancels the cluster's jobs, stops the
#                                    daemons, removes the second node's namespace
#
# The first node is this machine, named `hostname -s`. The second, named
# HOST-2, is a network namespace with its own address on a veth pair
# (10.77.X.2; this machine is 10.77.X.1 on it) and a UTS namespace with its
# own host name, which is all slurmd needs to be a second machine: Debian's
# slurmd is built without --enable-multiple-slurmd, so one address and name
# serve one node. Both interfaces are named dgcaX, so one DGCA_GLOO_IFACE
# serves ranks on either node. Where namespaces cannot be made, the cluster
# has one node and says why on stderr.
#
# Each node has the CPUs and (a little less) memory `slurmd -C` reports;
# one partition "debug" (the default); finished jobs leave squeue after 10 s
# (MinJobAge); free ports. Needs root (slurmd runs the jobs; munged runs as
# the munge user). Installs slurm-wlm and munge when missing. Exits 77,
# saying why, when Slurm cannot run here.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
want_nodes=${3:-2}
if [ -z "$cmd" ] || [ -z "$dir" ] || { [ "$want_nodes" != 1 ] && [ "$want_nodes" != 2 ]; }; then
  echo "usage: $0 start DIR [1|2] | stop DIR" >&2
  exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf="$dir/slurm.conf"

stop_pid() {  # stop_pid FILE: SIGTERM, then SIGKILL after 5 s
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

# The second node's namespace (its veth pair goes with it).
remove_netns() {
  [ -f "$dir/netns" ] || return 0
  ip netns del "$(cat "$dir/netns")" 2>/dev/null || true
  rm -f "$dir/netns"
}

if [ "$cmd" = stop ]; then
  if [ -f "$conf" ]; then
    SLURM_CONF="$conf" timeout 10 scancel --full --state=PENDING,RUNNING,SUSPENDED -u "$(id -un)" \
      >/dev/null 2>&1 || true
  fi
  for f in "$dir"/slurmd-*.pid; do stop_pid "$f"; done
  stop_pid "$dir/slurmctld.pid"
  stop_pid "$dir/munge/munged.pid"
  remove_netns
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: $0 start DIR [1|2] | stop DIR" >&2; exit 2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "slurm-local: a local Slurm cluster needs root here (slurmd runs the jobs as their users)" >&2
  exit 77
fi
missing=()
for p in slurm-wlm munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "slurm-local: installing ${missing[*]}" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
      >"$dir/apt.log" 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}") >>"$dir/apt.log" 2>&1 || {
      echo "slurm-local: cannot install ${missing[*]} (see $dir/apt.log)" >&2
      exit 77
    }
  fi
fi
for b in munged slurmctld slurmd sinfo; do
  command -v "$b" >/dev/null || { echo "slurm-local: $b not found after installing" >&2; exit 77; }
done

# munged runs as the munge user: DIR and its parents must let it through.
if ! runuser -u munge -- test -x "$dir"; then
  echo "slurm-local: munged (user munge) cannot reach $dir: a directory on its path is not" \
    "searchable by others (chmod o+x it, or use another DIR)" >&2
  exit 77
fi
# munge: a key and a socket of our own, so nothing else on the machine is touched.
mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
if [ ! -f "$dir/munge/munge.key" ]; then
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
fi
chown -R munge:munge "$dir/munge"
chmod 0755 "$dir/munge"  # clients reach the socket through it
chmod 0400 "$dir/munge/munge.key"
# munged refuses a key or socket directory others can traverse or write.
chmod o-w "$dir"
stop_pid "$dir/munge/munged.pid"
rm -f "$dir/munge/munge.socket" "$dir/munge/munge.socket.lock"
if ! runuser -u munge -- munged --key-file="$dir/munge/munge.key" \
    --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" 2>"$dir/log/munged.err"; then
  echo "slurm-local: munged did not start: $(cat "$dir/log/munged.err")" >&2
  exit 77
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
host=$(hostname -s)
node=$(slurmd -C | head -1)
mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
# A little less than the node reports, or slurmd drains it for low memory.
node=$(sed -e "s/RealMemory=[0-9]*/RealMemory=$((mem * 95 / 100))/" -e 's/^NodeName=[^ ]* //' <<<"$node")

# The second node: a network namespace joined to this one by a veth pair.
# X is the first free number in 10..249 (another cluster may be running).
for f in "$dir"/slurmd-*.pid; do stop_pid "$f"; done
remove_netns
nodes=1
advertise=127.0.0.1
iface=""
netns_error=""
if [ "$want_nodes" = 2 ]; then
  for x in $(seq 10 249); do
    ip link show "dgca$x" >/dev/null 2>&1 && continue
    ip netns list 2>/dev/null | grep -q "^dgca-slurm-$x\b" && continue
    ns="dgca-slurm-$x"
    if netns_error=$( {
          ip netns add "$ns" &&
          echo "$ns" >"$dir/netns" &&
          ip link add "dgca$x" type veth peer name "dgca$x" netns "$ns" &&
          ip addr add "10.77.$x.1/24" dev "dgca$x" &&
          ip link set "dgca$x" up &&
          ip -n "$ns" addr add "10.77.$x.2/24" dev "dgca$x" &&
          ip -n "$ns" link set "dgca$x" up &&
          ip -n "$ns" link set lo up
        } 2>&1 ); then
      nodes=2
      advertise="10.77.$x.1"
      iface="dgca$x"
    else
      remove_netns
      ip link del "dgca$x" 2>/dev/null || true
      echo "slurm-local: one node only: cannot make a network namespace for a second" \
        "(${netns_error//$'\n'/ })" >&2
    fi
    break
  done
fi
if [ "$nodes" = 2 ]; then
  node_lines="NodeName=$host NodeAddr=$advertise $node State=UNKNOWN
NodeName=$host-2 NodeAddr=${advertise%.1}.2 $node State=UNKNOWN"
else
  node_lines="NodeName=$host $node State=UNKNOWN"
fi
cat >"$conf" <<EOF
# Written by tools/slurm-local.sh: a $nodes-node test cluster (docs/slurm.md).
ClusterName=dgca
SlurmctldHost=$host($advertise)
SlurmUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge=10
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
$node_lines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

stop_pid "$dir/slurmctld.pid"
mkdir -p "$dir/spool/$host" "$dir/spool/$host-2"
if ! slurmctld -f "$conf" 2>"$dir/log/slurmctld.err"; then
  echo "slurm-local: slurmctld did not start: $(cat "$dir/log/slurmctld.err")" >&2
  exit 77
fi
if ! slurmd -f "$conf" -N "$host" 2>"$dir/log/slurmd.err"; then
  echo "slurm-local: slurmd did not start: $(cat "$dir/log/slurmd.err")" >&2
  exit 77
fi
if [ "$nodes" = 2 ]; then
  # In its namespaces, under its own name: what its jobs see as the host.
  # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup tree
  # slurmd reads.
  if ! nsenter --net="/var/run/netns/$(cat "$dir/netns")" unshare --uts /bin/sh -c \
      "hostname '$host-2' && exec slurmd -f '$conf' -N '$host-2'" 2>"$dir/log/slurmd-2.err"; then
    echo "slurm-local: the second slurmd did not start: $(cat "$dir/log/slurmd-2.err")" >&2
    exit 77
  fi
fi
for _ in $(seq 150); do
  states=$(SLURM_CONF="$conf" sinfo -h -N -o %T 2>/dev/null || true)
  if [ "$(grep -c '^idle$' <<<"$states")" = "$nodes" ]; then
    echo "SLURM_CONF=$conf"
    echo "SLURM_NODES=$nodes"
    echo "DGCA_ADVERTISE_HOST=$advertise"
    [ -z "$iface" ] || echo "DGCA_GLOO_IFACE=$iface"
    exit 0
  fi
  sleep 0.2
done
echo "slurm-local: the nodes did not come up idle within 30 s (sinfo: ${states//$'\n'/ });" \
  "logs in $dir/log" >&2
exit 77
