#!/usr/bin/env bash
# Validates everything under deploy/ without a cluster or a Docker engine:
#
#   1. hadolint lints deploy/Dockerfile; deploy/check_image.py checks that
#      it builds and ships both respcoord and respcoordctl, and that the
#      context its .dockerignore leaves holds a workspace cargo can load;
#   2. `kubectl kustomize` renders the base, the overlays (memory, nats,
#      nats-secured), the example compositions with the optional components
#      (TLS, auth tokens, NATS creds and TLS, the ServiceMonitor), and the
#      NATS cluster (deploy/kubernetes/nats-cluster);
#   3. deploy/check_manifests.py validates each rendering against the
#      Kubernetes schemas of $K8S_VERSIONS (strict: unknown fields fail), the
#      ServiceMonitor against the Prometheus Operator's CRD models, and the
#      deployment rules of deploy/README.md (one pod + Recreate for memory,
#      probes, security context, grace period, selectors and ports, ...);
#   4. deploy/check_dashboard.py checks that the Grafana dashboard is valid
#      JSON and queries only metrics the service exports;
#   5. the NATS cluster: nats-server.conf (with the auth.conf it includes)
#      passes the pinned nats-server's own config test (`nats-server -t`),
#      its manifests render and pass step 3's schemas and the cluster rules
#      (3 replicas, PVCs, routes, fsync always, lame-duck preStop, probes,
#      anti-affinity, PDB), and deploy/check_helm_values.py checks that the
#      Helm values use only keys of the official chart and make the same
#      choices;
#   6. deploy/check_sequence.py walks every `deploy-walk` command block of
#      README.md and deploy/README.md in order, as a cluster would take it,
#      and fails on a step that uses a namespace, CRD, Secret or Secret key
#      that no earlier step created (or on a cluster-changing block left
#      unmarked); then, with --self-test, proves it rejects broken copies of
#      those blocks (the Secret before its namespace, a missing CRD, ...).
#
# The tools come from PyPI at the versions pinned in
# deploy/check-requirements.txt, in a venv under target/deploy-check/ that is
# reused while the pins are unchanged. Needs python3 (and python3-venv on
# Debian, installed here when missing and running as root). Run by
# scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# Oldest and newest Kubernetes minor versions the manifests are checked
# against (kubernetes-validate 1.37.0 ships schemas for 1.25 to 1.37).
K8S_VERSIONS="1.30.0,1.37.0"
# The nats-server release the NATS cluster runs (its image tag) and whose
# config test checks nats-server.conf; installed by scripts/nats-server.sh.
NATS_SERVER_VERSION=2.14.6
export NATS_SERVER_VERSION

work=target/deploy-check
venv="$work/venv"
requirements=deploy/check-requirements.txt
stamp="$(cat "$requirements" <(python3 --version) | sha256sum | cut -c1-16)"
started=$SECONDS

mkdir -p "$work"
if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian's python3 lacks ensurepip until python3-venv is installed.
    rm -rf "$venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "deploy/check.sh: installing python3-venv"
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    else
      echo "deploy/check.sh: python3 -m venv failed; install python3-venv" >&2
      exit 1
    fi
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --no-compile \
    --requirement "$requirements"
  echo "$stamp" >"$venv/.stamp"
fi
bin="$venv/bin"

# 1. The Dockerfile: lint, then what the image ships (the server and
#    respcoordctl) and a build context cargo can load (deploy/check_image.py).
"$bin/hadolint" deploy/Dockerfile
echo "ok   deploy/Dockerfile: hadolint $("$bin/hadolint" --version | awk '{print $NF}'), no findings"
"$bin/python" deploy/check_image.py "$work/image"

# 2. Render every kustomization.
renders=()
for target in base overlays/memory overlays/nats overlays/nats-secured examples/memory-tls-auth examples/nats-tls-auth nats-cluster; do
  name="${target#*/}"
  out="$work/$name.yaml"
  "$bin/kubectl" kustomize "deploy/kubernetes/$target" >"$out"
  renders+=("$name=$out")
done

# 3. Schemas and deployment rules.
"$bin/python" deploy/check_manifests.py "$K8S_VERSIONS" "${renders[@]}"

# 4. The dashboard: valid JSON, and only metrics the README's "Metrics"
#    section (or src/metrics.rs's series table) lists. tests/deploy_dashboard.rs
#    checks the same names against a running server's /metrics.
"$bin/python" deploy/check_dashboard.py deploy/grafana/respcoord.json README.md src/metrics.rs

# 5. The NATS cluster's configuration, in nats-server's own test mode, as
#    the pod runs it: the ConfigMap's files side by side (auth.conf is
#    included relative to nats-server.conf) and the server name given by the
#    pod's --name argument. -t parses every option, include and value and
#    refuses unknown ones; it resolves no route DNS names and opens no
#    store, so those are checked by the rules of step 3.
nats_server=$(scripts/nats-server.sh "$NATS_SERVER_VERSION")
conf_dir="$work/nats-config"
rm -rf "$conf_dir" && mkdir -p "$conf_dir"
cp deploy/kubernetes/nats-cluster/nats-server.conf deploy/kubernetes/nats-cluster/auth.conf "$conf_dir/"
if ! out=$("$nats_server" -t -c "$conf_dir/nats-server.conf" --name=nats-0 2>&1); then
  echo "FAIL deploy/kubernetes/nats-cluster/nats-server.conf: $out" >&2
  exit 1
fi
echo "ok   deploy/kubernetes/nats-cluster/nats-server.conf: nats-server $NATS_SERVER_VERSION -t, valid"
"$bin/python" deploy/check_helm_values.py deploy/helm/nats-values.yaml "$work/nats-cluster.yaml"

# 6. The documented steps, walked in order (no cluster: each step's objects
#    are rendered with the kubectl above), and the walker's own negative tests.
"$bin/python" deploy/check_sequence.py --self-test "$bin/kubectl" "$K8S_VERSIONS" \
  README.md deploy/README.md docs/*.md clients/*/README.md

echo "deploy/check.sh: all checks passed in $((SECONDS - started))s" \
  "(kubectl $("$bin/kubectl" version --client -o json | "$bin/python" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])'))"
