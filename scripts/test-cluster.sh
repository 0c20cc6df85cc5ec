#!/usr/bin/env bash
# A real Kubernetes control plane for tests: etcd, kube-apiserver and
# kube-controller-manager (built by conformance/k8s/build.sh), on free
# 127.0.0.1 ports, with their own PKI, service-account keys and audit log.
#
#   scripts/test-cluster.sh start --version 1.37 --dir DIR [--node]
#   scripts/test-cluster.sh stop --dir DIR
#
# `start` returns when the API server answers /readyz and the controller
# manager has created the `default` ServiceAccount (readiness by polling the
# servers themselves, never a fixed sleep) and leaves in DIR:
#   kubeconfig    the admin's (client certificate, group system:masters)
#   pids          "name pid" per started process (what `stop` kills)
#   cluster.env   SERVER, VERSION, SERVICE_CIDR, SERVICE_ACCOUNT_ISSUER
#   audit.jsonl   the API server's audit log (JSON lines, level Metadata)
#   pki/          the CA, serving, client and service-account keys
#   *.log         each process's output
#
# Services: kube-apiserver validates a Service's clusterIP against its service
# CIDR only, and accepts a CIDR in 127.0.0.0/8, so the cluster's Services get
# loopback cluster IPs (127.16.0.0/12 by default, --service-cidr to change)
# that a test's backend can listen on; Endpoints and EndpointSlices would
# refuse loopback addresses. The `kubernetes` Service gets no endpoints
# (--endpoint-reconciler-type=none): a loopback advertise address cannot be
# one, and nothing here reaches the API server through that Service.
#
# --node adds one real node where pods run (docs/test-control-plane.md):
# containerd + runc, the CNI bridge `tuna-node0` on 198.19.254.0/24 (pods in
# .0/26, the host at .1 = HOST_ADDRESS, Services in .128/26, cluster DNS at
# .138; the network-namespace test hosts keep 198.18.0.0/16), kubelet,
# kube-scheduler, kube-proxy (iptables) and CoreDNS (cluster.local only, no
# `forward`: nothing leaves the machine). The API server then listens on the
# bridge address, which pods reach, and the `kubernetes` Service has it as its
# endpoint. One node per machine (the kubelet has host-wide paths). Images are
# never pulled: pause and CoreDNS come from scripts/node-images.sh; a test
# imports its own with `ctr --address $CONTAINERD_ADDRESS -n k8s.io images
# import` (or scripts/image.sh --load DIR). cluster.env gets NODE_NAME, KUBELET_DIR,
# POD_CIDR, HOST_ADDRESS, CLUSTER_DNS, CONTAINERD_ADDRESS. Every host change
# (the bridge, iptables chains, mounts, cgroups, files the kubelet writes
# outside DIR, the kernel settings it changes) is listed in DIR/host-changes
# as it is made and undone by `stop`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  echo "usage: scripts/test-cluster.sh start --version MINOR --dir DIR [--service-cidr CIDR] [--node]" >&2
  echo "       scripts/test-cluster.sh stop --dir DIR" >&2
  exit 2
}

cmd=${1:-}; [ -n "$cmd" ] || usage; shift
version=1.37 dir="" service_cidr="" node=""
while [ $# -gt 0 ]; do
  case $1 in
    --version) version=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --service-cidr) service_cidr=$2; shift 2 ;;
    --node) node=1; shift ;;
    *) usage ;;
  esac
done
[ -n "$dir" ] || usage
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

# The node's network (fixed: one node per machine).
bridge=tuna-node0
host_address=198.19.254.1
pod_cidr=198.19.254.0/26
cluster_dns=198.19.254.138
node_name=tuna-node
if [ -n "$node" ]; then
  service_cidr=${service_cidr:-198.19.254.128/26}
else
  service_cidr=${service_cidr:-127.16.0.0/12}
fi

# Kills what `start` wrote into DIR/pids with SIGKILL (a test cluster's state
# is thrown away: a graceful kube-apiserver shutdown takes ~9 s) and waits
# until each is gone. A pid is only killed while its command line still names
# DIR (no stranger that reused the number).
stop() {
  [ -f "$dir/host-changes" ] && stop_node
  [ -f "$dir/pids" ] || return 0
  local name pid pids=()
  while read -r name pid; do
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir"; then
      kill -KILL "$pid" 2>/dev/null && pids+=("$pid")
    fi
  done <"$dir/pids"
  for pid in "${pids[@]}"; do
    while [ -e "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; do sleep 0.02; done
  done
  rm -f "$dir/pids"
}

# Kills the node processes of DIR/pids (kubelet and the rest, then
# containerd and its shims) and undoes DIR/host-changes, last change first.
# Pods go away through the kubelet first (it stops containers, unmounts their
# volumes and tears down their network) while the API server still answers.
stop_node() {
  local ctr=(ctr --address "$dir/containerd/containerd.sock" -n k8s.io)
  if [ -f "$dir/pids" ] && kubectl --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
    kubectl --kubeconfig "$dir/kubeconfig" delete deployments,daemonsets,statefulsets,replicasets,jobs --all -A \
      --wait=false >/dev/null 2>&1 || true
    kubectl --kubeconfig "$dir/kubeconfig" delete pods --all -A --grace-period=0 --force \
      >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 60))
    while [ $SECONDS -lt $deadline ] && [ -n "$("${ctr[@]}" tasks ls -q 2>/dev/null)" ]; do sleep 0.1; done
  fi
  kill_named kubelet kube-scheduler kube-proxy
  if [ -x "$bin/kube-proxy" ]; then "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  # What the kubelet left running (a pod it could not stop in time).
  local id
  for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$id" >/dev/null 2>&1 || true; done
  for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks rm -f "$id" >/dev/null 2>&1 || true; done
  kill_named containerd
  # The runc shims of this containerd (they outlive it by design).
  local pid
  for pid in $(grep -lsF -- "$dir/containerd/containerd.sock" /proc/[0-9]*/cmdline | cut -d/ -f3); do
    case "$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" in *containerd-shim*) kill -KILL "$pid" 2>/dev/null ;; esac
  done
  # Mounts under DIR (sandboxes' shm, projected volumes, overlay rootfs), deepest first.
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  local change what
  tac "$dir/host-changes" | while read -r change what; do
    case $change in
      netns) # the pods' network namespaces containerd made (created after start)
        for ns in $(ls /run/netns 2>/dev/null); do
          grep -qx "$ns" "$dir/netns.before" || case $ns in cni-*) ip netns del "$ns" 2>/dev/null || true ;; esac
        done ;;
      bridge) ip link del "$what" 2>/dev/null || true ;;
      iptables) remove_chains ;;
      path) rm -rf "$what" ;;
      dir) rmdir "$what" 2>/dev/null || true ;; # shared (others' netns): only if empty
      cgroups) remove_cgroups ;;
      sysctl) restore_sysctls ;;
    esac
  done
  rm -f "$dir/host-changes"
}

# kill_named NAME...: SIGKILL the DIR/pids entries of these names; wait for them.
kill_named() {
  [ -f "$dir/pids" ] || return 0
  local name pid want pids=()
  while read -r name pid; do
    for want in "$@"; do
      [ "$name" = "$want" ] || continue
      if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir"; then
        kill -KILL "$pid" 2>/dev/null && pids+=("$pid")
      fi
    done
  done <"$dir/pids"
  for pid in "${pids[@]}"; do
    while [ -e "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; do sleep 0.02; done
  done
}

# The KUBE-* and CNI-* chains (kubelet, kube-proxy, the portmap plugin) and
# the rules that jump to them, in every table, IPv4 and IPv6; then the
# nftables tables that iptables-nft created for them, if nothing else is in
# them now.
remove_chains() {
  local v save restore
  for v in "" 6; do
    save=ip${v}tables-save restore=ip${v}tables-restore
    command -v "$save" >/dev/null 2>&1 || continue
    "$save" | awk '
      /^:(KUBE|CNI)-/ {next}
      /^-A (KUBE|CNI)-/ {next}
      / -j (KUBE|CNI)-/ {next}
      {print}' | "$restore" || true
  done
  if command -v nft >/dev/null 2>&1; then
    local family table
    nft list tables 2>/dev/null | while read -r _ family table; do
      grep -qx "table $family $table" "$dir/nft.before" && continue
      # Empty = only base chains without rules.
      rules="$(nft list table "$family" "$table" | grep -vE '^\s*(table|chain|type|policy|\}|$)' || true)"
      if [ -z "$rules" ]; then
        nft delete table "$family" "$table" 2>/dev/null || true
      fi
    done
  fi
}

# The cgroups the kubelet and containerd made, in every hierarchy, that did
# not exist before `start` (rmdir only: a cgroup with a process stays).
remove_cgroups() {
  local top cg
  for top in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/kubepods /sys/fs/cgroup/k8s.io; do
    [ -d "$top" ] || continue
    grep -qx "$top" "$dir/cgroups.before" && continue
    find "$top" -depth -type d 2>/dev/null | while read -r cg; do rmdir "$cg" 2>/dev/null || true; done
  done
}

# The kernel settings the kubelet (and kube-proxy) may change at start.
node_sysctls=(kernel.panic kernel.panic_on_oops vm.overcommit_memory net.ipv4.ip_forward
  net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables net.netfilter.nf_conntrack_max)
restore_sysctls() {
  local key value
  while read -r key value; do
    [ "$(sysctl -n "$key" 2>/dev/null)" = "$value" ] || sysctl -q -w "$key=$value" >/dev/null 2>&1 || true
  done <"$dir/sysctls.before"
}

# Polls `check` every 50 ms until it succeeds; after `secs` prints the log.
wait_for() { # what secs log check...
  local what=$1 secs=$2 log=$3; shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "test-cluster: $what not ready after ${secs} s; the end of $log:" >&2
      tail -n 40 "$log" >&2 || true
      stop
      exit 1
    fi
    sleep 0.05
  done
}

bin="$root/.tools/k8s/$version"
case $cmd in
  stop) stop; exit 0 ;;
  start) ;;
  *) usage ;;
esac

if [ ! -x "$bin/kube-apiserver" ] || [ ! -x "$bin/kube-controller-manager" ] || [ ! -x "$bin/etcd" ]; then
  "$root/conformance/k8s/build.sh" "$version"
fi
if [ -f "$dir/pids" ]; then
  echo "test-cluster: $dir already has a running cluster (scripts/test-cluster.sh stop --dir $dir)" >&2
  exit 1
fi

if [ -n "$node" ]; then
  for b in kubelet kube-scheduler kube-proxy; do
    [ -x "$bin/$b" ] || { "$root/conformance/k8s/build.sh" --node "$version"; break; }
  done
  images=()
  while read -r f; do images+=("$f"); done < <("$root/scripts/node-images.sh")
  for tool in containerd runc ctr iptables-save; do
    command -v "$tool" >/dev/null 2>&1 || { echo "test-cluster: $tool not found (scripts/setup.sh --node)" >&2; exit 1; }
  done
  [ -x /usr/lib/cni/bridge ] || { echo "test-cluster: no CNI plugins in /usr/lib/cni (scripts/setup.sh --node)" >&2; exit 1; }
  if ip link show "$bridge" >/dev/null 2>&1; then
    echo "test-cluster: a node is already running on this machine (bridge $bridge exists; scripts/test-cluster.sh stop --dir ITS_DIR)" >&2
    exit 1
  fi
  # The state `stop` restores or compares with.
  for key in "${node_sysctls[@]}"; do
    value=$(sysctl -n "$key" 2>/dev/null) && echo "$key $value"
  done >"$dir/sysctls.before"
  ls /run/netns 2>/dev/null >"$dir/netns.before" || : >"$dir/netns.before"
  { nft list tables 2>/dev/null || true; } >"$dir/nft.before"
  ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/kubepods /sys/fs/cgroup/k8s.io \
    2>/dev/null >"$dir/cgroups.before" || true
  : >"$dir/host-changes"
  change() { echo "$*" >>"$dir/host-changes"; }
  change sysctl
  change cgroups
  # Paths the kubelet, containerd's runc shim and libcni write whatever their
  # configuration says (only those that did not exist before).
  for p in /var/lib/kubelet /var/log/containers /run/containerd /var/lib/cni; do
    [ -e "$p" ] || change path "$p"
  done
  [ -e /run/netns ] || change dir /run/netns
  change iptables
  change netns
  change bridge "$bridge"
  ip link add "$bridge" type bridge
  ip addr add "$host_address/${pod_cidr#*/}" dev "$bridge"
  ip link set "$bridge" up
fi

# --- the node --------------------------------------------------------------
# containerd (CRI) + runc + the CNI bridge, then kubelet, kube-scheduler and
# kube-proxy; Ready when the node is, and CoreDNS has rolled out.
start_node() {
  local nd="$dir/node" cdir="$dir/containerd"
  mkdir -p "$nd" "$cdir" "$dir/cni/net.d" "$dir/pod-logs"
  # restrict_oom_score_adj: these VMs withhold CAP_SYS_RESOURCE from every
  # process, so runc cannot give a sandbox the kubelet's -998 (clamped to
  # containerd's own score instead). runc, not crun: crun refuses the hybrid
  # cgroup v1 layout. Non-root pods may bind :53 (CoreDNS).
  cat >"$cdir/config.toml" <<EOF
version = 2
root = "$cdir/root"
state = "$cdir/state"
[grpc]
  address = "$cdir/containerd.sock"
[ttrpc]
  address = "$cdir/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$cdir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:3.10"
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
  cat >"$dir/cni/net.d/10-tuna-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "tuna-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$host_address"}]],
        "routes": [{"dst": "${host_address%.*}.0/24"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  spawn containerd containerd --config "$cdir/config.toml"
  wait_for containerd 30 "$dir/containerd.log" ctr --address "$cdir/containerd.sock" version
  local f
  for f in "${images[@]}"; do
    ctr --address "$cdir/containerd.sock" -n k8s.io images import "$f" >/dev/null
  done

  echo "search ." >"$nd/resolv.conf"
  # failCgroupV1: false + cgroupfs: the machine is cgroup v1 (1.35+ refuse it
  # by default). oomScoreAdj 0: no CAP_SYS_RESOURCE. Images cannot be pulled
  # back, so never garbage-collect them.
  cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$cdir/containerd.sock
address: $host_address
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_healthz_port
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [$cluster_dns]
resolvConf: $nd/resolv.conf
podLogsDir: $dir/pod-logs
failSwapOn: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 30
oomScoreAdj: 0
EOF
  # TUNA_KUBELET_V: the kubelet's log verbosity (1; 4 logs its volume and
  # token decisions, as the token-rotation finding of issue 38 needed).
  spawn kubelet "$bin/kubelet" --config "$nd/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
    --root-dir "$nd/kubelet" --cert-dir "$nd/certs" --hostname-override "$node_name" \
    --node-ip "$host_address" --v="${TUNA_KUBELET_V:-1}"
  spawn kube-scheduler "$bin/kube-scheduler" --kubeconfig "$dir/kubeconfig" \
    --authentication-kubeconfig "$dir/kubeconfig" --authorization-kubeconfig "$dir/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$scheduler_port" --leader-elect=false
  # conntrack zeros and no localhost node ports: kube-proxy leaves the
  # host's sysctls alone.
  cat >"$nd/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/kubeconfig}
mode: iptables
clusterCIDR: $pod_cidr
hostnameOverride: $node_name
healthzBindAddress: 127.0.0.1:$proxy_healthz_port
metricsBindAddress: 127.0.0.1:$proxy_metrics_port
nodePortAddresses: ["$host_address/32"]
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, masqueradeAll: false}
EOF
  spawn kube-proxy "$bin/kube-proxy" --config "$nd/kube-proxy.yaml"
  node_ready() {
    [ "$(kubectl --kubeconfig "$dir/kubeconfig" get node "$node_name" \
      -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
  }
  wait_for "the node" 60 "$dir/kubelet.log" node_ready
  # CoreDNS only once kube-proxy has written the API server's Service rules:
  # a pod that dials the cluster IP before them has its SYN dropped, and its
  # retransmissions keep the untranslated conntrack entry until the client's
  # dial gives up (client-go: 30 s; seen as a 40 s start on 1.34).
  kube_proxy_synced() {
    iptables -w -t nat -S KUBE-SERVICES 2>/dev/null | grep -q 'default/kubernetes:https'
  }
  wait_for "kube-proxy's rules" 30 "$dir/kube-proxy.log" kube_proxy_synced

  local coredns_image
  coredns_image=$(ctr --address "$cdir/containerd.sock" -n k8s.io images ls -q | grep '^localhost/coredns:')
  sed -e "s|@IMAGE@|$coredns_image|" -e "s|@CLUSTER_DNS@|$cluster_dns|" "$root/conformance/node/coredns.yaml" \
    | kubectl --kubeconfig "$dir/kubeconfig" apply -f - >/dev/null
  # A watch on the Deployment's status (no polling), bounded.
  if ! kubectl --kubeconfig "$dir/kubeconfig" -n kube-system rollout status deployment/coredns --timeout=60s >/dev/null; then
    echo "test-cluster: CoreDNS did not become ready; its pod:" >&2
    kubectl --kubeconfig "$dir/kubeconfig" -n kube-system describe pods -l k8s-app=kube-dns >&2 || true
    stop; exit 1
  fi
  cat >>"$dir/cluster.env" <<EOF
NODE_NAME=$node_name
POD_CIDR=$pod_cidr
HOST_ADDRESS=$host_address
CLUSTER_DNS=$cluster_dns
CONTAINERD_ADDRESS=$cdir/containerd.sock
KUBELET_DIR=$nd/kubelet
EOF
}

# --- PKI -------------------------------------------------------------------
pki="$dir/pki"
mkdir -p "$pki"
ssl() { openssl "$@" 2>/dev/null; }
ec_key() { ssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
ec_key "$pki/ca.key"
ssl req -x509 -new -key "$pki/ca.key" -days 3650 -subj /CN=tuna-test-ca -out "$pki/ca.crt"
cert() { # name subject extensions
  ec_key "$pki/$1.key"
  ssl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr"
  ssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -out "$pki/$1.crt" -extfile <(printf '%s\n' "$3")
  rm -f "$pki/$1.csr"
}
sans="IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
if [ -n "$node" ]; then
  # In-cluster clients dial the `kubernetes` Service's cluster IP (the first
  # of the service CIDR) and verify it; kubelet and kube-proxy the bridge address.
  first_service_ip=$(python3 -c 'import ipaddress,sys; print(ipaddress.ip_network(sys.argv[1])[1])' "$service_cidr")
  sans+=",IP:$host_address,IP:$first_service_ip,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc.cluster.local"
fi
cert apiserver /CN=kube-apiserver "subjectAltName=$sans
extendedKeyUsage=serverAuth"
cert admin "/O=system:masters/CN=tuna-test-admin" "extendedKeyUsage=clientAuth"
cert controller-manager "/O=system:masters/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
if [ -n "$node" ]; then
  # The API server's client certificate for the kubelet (exec, logs, port-forward).
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
  cert kubelet-client "/O=system:nodes/CN=system:node:$node_name" "extendedKeyUsage=clientAuth"
  cert kubelet-serving "/O=system:nodes/CN=system:node:$node_name" "subjectAltName=IP:$host_address,DNS:$node_name
extendedKeyUsage=serverAuth"
fi
# The service-account signing key (TokenRequest, pod-bound tokens, TokenReview).
ssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key"
ssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

# --- ports -----------------------------------------------------------------
# Picked below the kernel's ephemeral range (ip_local_port_range), where no
# outgoing connection and no `bind(0)` of a test can take one between this
# pick and the component's own bind (seconds later, for the controller
# manager). Each is checked free now; nine distinct ones.
read -r etcd_port etcd_peer_port api_port kcm_port kubelet_port kubelet_healthz_port scheduler_port \
  proxy_healthz_port proxy_metrics_port < <(python3 -c '
import random, socket
elo, ehi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
lo, hi = (10000, elo - 1) if elo > 12000 else (ehi + 1, 65535)
held, ports = [], []
while len(ports) < 9:
    p = random.randint(lo, hi)
    if p in ports:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        continue
    held.append(s)
    ports.append(p)
print(*ports)')
if [ -n "$node" ]; then
  server="https://$host_address:$api_port"
else
  server="https://127.0.0.1:$api_port"
fi

kubeconfig() { # file user
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}
users:
- name: $2
  user: {client-certificate: "$pki/$2.crt", client-key: "$pki/$2.key"}
contexts:
- name: test
  context: {cluster: test, user: $2}
current-context: test
EOF
}
kubeconfig "$dir/kubeconfig" admin
kubeconfig "$dir/controller-manager.kubeconfig" controller-manager
[ -z "$node" ] || kubeconfig "$dir/kubelet.kubeconfig" kubelet-client

# Every request, at Metadata level (who, verb, resource, subresource, name,
# response code), once it is answered.
cat >"$dir/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
EOF

: >"$dir/pids"
spawn() { # name command...
  local name=$1; shift
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$dir/pids"
}

spawn etcd "$bin/etcd" --name test --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "test=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync --log-level warn
wait_for etcd 60 "$dir/etcd.log" curl -sf "http://127.0.0.1:$etcd_port/health"

issuer="$server"
if [ -n "$node" ]; then
  # Pods reach the API server on the bridge address: it is the `kubernetes`
  # Service's endpoint. The kubelet is dialled by its InternalIP.
  api_net=(--bind-address "$host_address" --advertise-address "$host_address"
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt"
    --kubelet-client-key "$pki/apiserver-kubelet-client.key"
    --kubelet-preferred-address-types InternalIP)
else
  api_net=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --endpoint-reconciler-type none)
fi
spawn kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --secure-port "$api_port" "${api_net[@]}" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --authorization-mode Node,RBAC \
  --service-cluster-ip-range "$service_cidr" \
  --service-account-issuer "$issuer" \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/audit.jsonl" \
  --audit-log-format json --audit-log-mode blocking \
  --cert-dir "$dir/apiserver-certs" --allow-privileged=true --profiling=false
api() { curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$server$1"; }
api_ok() { [ "$(api "$1")" = ok ]; }
wait_for kube-apiserver 120 "$dir/kube-apiserver.log" api_ok /readyz

spawn kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$dir/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --profiling=false
# Its controllers run once the `default` ServiceAccount exists (the
# serviceaccount controller), which pods need past ServiceAccount admission.
wait_for kube-controller-manager 120 "$dir/kube-controller-manager.log" \
  api /api/v1/namespaces/default/serviceaccounts/default

cat >"$dir/cluster.env" <<EOF
SERVER=$server
VERSION=$("$bin/kube-apiserver" --version | cut -d' ' -f2)
SERVICE_CIDR=$service_cidr
SERVICE_ACCOUNT_ISSUER=$issuer
EOF
[ -z "$node" ] || start_node
echo "test-cluster: $(sed -n 's/^VERSION=//p' "$dir/cluster.env") at $server (KUBECONFIG=$dir/kubeconfig)"
