#!/usr/bin/env bash
# A real Kubernetes control plane for tests: etcd, kube-apiserver and
# kube-controller-manager (built by conformance/k8s/build.sh), on free
# 127.0.0.1 ports, with their own PKI, service-account keys and audit log.
#
#   scripts/test-cluster.sh start --version 1.37 --dir DIR
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
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  echo "usage: scripts/test-cluster.sh start --version MINOR --dir DIR [--service-cidr CIDR]" >&2
  echo "       scripts/test-cluster.sh stop --dir DIR" >&2
  exit 2
}

cmd=${1:-}; [ -n "$cmd" ] || usage; shift
version=1.37 dir="" service_cidr=127.16.0.0/12
while [ $# -gt 0 ]; do
  case $1 in
    --version) version=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --service-cidr) service_cidr=$2; shift 2 ;;
    *) usage ;;
  esac
done
[ -n "$dir" ] || usage
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

# Kills what `start` wrote into DIR/pids with SIGKILL (a test cluster's state
# is thrown away: a graceful kube-apiserver shutdown takes ~9 s) and waits
# until each is gone. A pid is only killed while its command line still names
# DIR (no stranger that reused the number).
stop() {
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

case $cmd in
  stop) stop; exit 0 ;;
  start) ;;
  *) usage ;;
esac

bin="$root/.tools/k8s/$version"
if [ ! -x "$bin/kube-apiserver" ] || [ ! -x "$bin/kube-controller-manager" ] || [ ! -x "$bin/etcd" ]; then
  "$root/conformance/k8s/build.sh" "$version"
fi
if [ -f "$dir/pids" ]; then
  echo "test-cluster: $dir already has a running cluster (scripts/test-cluster.sh stop --dir $dir)" >&2
  exit 1
fi

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
cert apiserver /CN=kube-apiserver \
  "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth"
cert admin "/O=system:masters/CN=tuna-test-admin" "extendedKeyUsage=clientAuth"
cert controller-manager "/O=system:masters/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
# The service-account signing key (TokenRequest, pod-bound tokens, TokenReview).
ssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key"
ssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

# --- ports -----------------------------------------------------------------
# Bound together and released together, so the four are distinct.
read -r etcd_port etcd_peer_port api_port kcm_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(4)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
server="https://127.0.0.1:$api_port"

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
spawn kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --secure-port "$api_port" --advertise-address 127.0.0.1 \
  --endpoint-reconciler-type none \
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
echo "test-cluster: $(sed -n 's/^VERSION=//p' "$dir/cluster.env") at $server (KUBECONFIG=$dir/kubeconfig)"
