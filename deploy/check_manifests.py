"""Validates rendered respcoord manifests; run by deploy/check.sh in its venv.

    check_manifests.py K8S_VERSION[,K8S_VERSION...] OVERLAY=RENDERED.yaml...

OVERLAY is one of RENDERS below (an overlay or example, with the backend
and the components it composes), base (the base gets step 1 only), or
nats-cluster (the NATS cluster of deploy/kubernetes/nats-cluster: step 1
and the cluster rules of step 3). For each rendering (`kubectl kustomize`):

1. Every core object validates against the Kubernetes JSON schemas of each
   given version, strictly (unknown fields are errors), with
   kubernetes-validate. A kind without a core schema is an error, except the
   ServiceMonitor, which is validated against models generated from the
   Prometheus Operator's CRDs (cloudcoil-models-prometheus-operator), also
   strictly: a field the model does not know is an error.
2. The objects agree with each other and with the deployment rules in
   deploy/README.md: selectors select the pods, named ports exist, probes
   are the gRPC health probes, the security context is the restricted one,
   termination grace covers the drain, and each backend's invariants hold
   (memory: one pod, Recreate, no autoscaler; nats: autoscaled, rolling,
   disruption budget, headless Service, NATS URL from a Secret, R3 bucket,
   a bucket age limit above idle + tombstone TTL, NATS creds and TLS files
   under read-only Secret mounts), and each composes exactly the components
   RENDERS says: no NATS credentials in overlays/nats (the shipped NATS
   cluster has no client authentication), a ServiceMonitor only where the
   servicemonitor component is composed (it needs the operator's CRDs).
3. nats-cluster: a 3-replica StatefulSet started in parallel, with a PVC
   template holding jetstream.store_dir; nats-server.conf (read from the
   ConfigMap the pod mounts) with `sync_interval: always`, routes to every
   pod by its headless-Service DNS name, ports matching the container's;
   a preStop that signals lame-duck mode through the conf's pid file, and
   a termination grace period covering lame_duck_duration; /healthz probes
   on the monitoring port; required anti-affinity per node; a PDB of one;
   the restricted security context; the image at the release whose
   `nats-server -t` check.sh ran ($NATS_SERVER_VERSION); auth.conf
   configures no client authentication, as overlays/nats expects.

Prints one line per overlay; on failure, every problem found, and exits 1.
"""

import functools
import os
import re
import sys

import yaml
from kubernetes_validate import utils as kv

# kubernetes-validate re-reads the (large) definitions file for every object;
# the files never change during a run.
kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)

NAME = "respcoord"
GRPC_PORT = 50051
METRICS_PORT = 9464
SERVICE = "respcoord.v1.ResponseCoordinator"
CLIENT_LABEL = ("respcoord.io/client", "true")
# Margin between the drain (preStop + shutdown grace) and the kubelet's SIGKILL.
MIN_MARGIN_SECONDS = 1
# The binary's defaults (src/config.rs), for RESPCOORD_NATS_MAX_AGE's rule.
DEFAULT_IDLE_TTL = "1h"
DEFAULT_TOMBSTONE_TTL = "10m"
# How far the bucket's age limit must exceed idle TTL + tombstone TTL: a
# touch interval, sweeps, a lease handover and expiry delayed by an outage.
MAX_AGE_MARGIN_SECONDS = 600
# Flags of the nats backend that name files (src/config.rs).
# The NATS cluster (deploy/kubernetes/nats-cluster).
NATS_NAMESPACE = "nats"
# Room after lame_duck_duration for the server to flush and exit.
LAME_DUCK_MARGIN_SECONDS = 20
# What each rendering is: its backend and the features it composes. "creds"
# is components/nats-creds, "servicemonitor" components/servicemonitor.
RENDERS = {
    "memory": ("memory", set()),
    "nats": ("nats", set()),
    "nats-secured": ("nats", {"creds"}),
    "memory-tls-auth": ("memory", {"tls", "auth", "servicemonitor"}),
    "nats-tls-auth": ("nats", {"tls", "auth", "creds", "nats-tls", "nats-mtls", "servicemonitor"}),
}
NATS_FILE_VARS = ("RESPCOORD_NATS_CREDS", "RESPCOORD_NATS_NKEY_SEED_FILE", "RESPCOORD_NATS_PASSWORD_FILE",
                  "RESPCOORD_NATS_TOKEN_FILE", "RESPCOORD_NATS_TLS_CA", "RESPCOORD_NATS_TLS_CERT",
                  "RESPCOORD_NATS_TLS_KEY")


class Problems:
    def __init__(self, overlay):
        self.overlay = overlay
        self.items = []

    def check(self, ok, message):
        if not ok:
            self.items.append(message)
        return ok


def duration_seconds(text):
    """`10s`, `1m30s`, `500ms` (the binary's humantime subset we use)."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+)(ms|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"cannot parse duration {text!r}")
    return sum(int(n) * units[u] for n, u in parts)


def selects(selector, labels):
    match = (selector or {}).get("matchLabels", selector or {})
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def schema_check(p, objects, versions):
    for obj in objects:
        kind, name = obj.get("kind"), obj.get("metadata", {}).get("name")
        if kind == "ServiceMonitor":
            servicemonitor_schema_check(p, obj)
            continue
        for version in versions:
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as e:
                path = ".".join(str(x) for x in e.path)
                p.check(False, f"{kind}/{name}: Kubernetes {version} schema: {path}: {e.message}")
            except kv.SchemaNotFoundError as e:
                p.check(False, f"{kind}/{name}: {e.message}")


def servicemonitor_schema_check(p, obj):
    from cloudcoil.models.prometheus_operator import v1 as promv1

    name = obj["metadata"]["name"]
    try:
        model = promv1.ServiceMonitor.model_validate(obj)
    except Exception as e:  # pydantic.ValidationError
        p.check(False, f"ServiceMonitor/{name}: CRD model: {e}")
        return
    # The models ignore unknown fields: a field that does not survive the
    # round trip is one the CRD does not have (a typo would be silently
    # dropped by the API server's pruning).
    dumped = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    for path in unknown_paths(obj, dumped):
        p.check(False, f"ServiceMonitor/{name}: field not in the CRD: {path}")


def unknown_paths(given, known, path=""):
    if isinstance(given, dict):
        if not isinstance(known, dict):
            return [path or "."]
        out = []
        for key, value in given.items():
            if key not in known:
                out.append(f"{path}.{key}")
            else:
                out += unknown_paths(value, known[key], f"{path}.{key}")
        return out
    if isinstance(given, list) and isinstance(known, list):
        out = []
        for i, (g, k) in enumerate(zip(given, known)):
            out += unknown_paths(g, k, f"{path}[{i}]")
        return out
    return []


def one(p, objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    p.check(len(found) == 1, f"expected exactly one {kind} {name or ''}, found {len(found)}")
    return found[0] if found else None


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def policy_check(p, name, objects):
    if not p.check(name in RENDERS, f"unknown rendering {name!r} (not in check_manifests.RENDERS)"):
        return
    overlay, features = RENDERS[name]
    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)

    ns = one(p, objects, "Namespace", NAME)
    if ns:
        p.check(ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") == "restricted",
                "Namespace must enforce the restricted Pod Security Standard")
    for obj in objects:
        if obj["kind"] != "Namespace":
            p.check(obj["metadata"].get("namespace") == NAME,
                    f"{obj['kind']}/{obj['metadata']['name']} is not in namespace {NAME}")

    deploy = one(p, objects, "Deployment", NAME)
    if not deploy:
        return
    spec = deploy["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    p.check(selects(spec["selector"], pod_labels), "Deployment selector does not select its own pods")
    p.check(pod.get("enableServiceLinks") is False,
            "enableServiceLinks must be false (service links inject RESPCOORD_* variables)")
    p.check(pod.get("automountServiceAccountToken") is False, "the service account token must not be mounted")
    sa = pod.get("serviceAccountName")
    p.check(any(o["kind"] == "ServiceAccount" and o["metadata"]["name"] == sa for o in objects),
            f"ServiceAccount {sa!r} is not in the rendering")

    psc = pod.get("securityContext", {})
    p.check(psc.get("runAsNonRoot") is True, "pod securityContext.runAsNonRoot must be true")
    p.check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "pod seccompProfile must be RuntimeDefault")

    containers = pod["containers"]
    p.check(len(containers) == 1, "one container expected")
    c = containers[0]
    image = c["image"]
    p.check(re.search(r":[\w][\w.-]*$|@sha256:[0-9a-f]{64}$", image) is not None and not image.endswith(":latest"),
            f"image {image!r} must carry a version tag or digest (not :latest)")
    sc = c.get("securityContext", {})
    p.check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    p.check(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    p.check(sc.get("runAsNonRoot") is True, "container runAsNonRoot must be true")
    p.check(sc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities must drop ALL")
    p.check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "container seccompProfile must be RuntimeDefault")

    ports = {port["name"]: port["containerPort"] for port in c.get("ports", [])}
    p.check(ports.get("grpc") == GRPC_PORT, f"container port grpc must be {GRPC_PORT}")
    p.check(ports.get("metrics") == METRICS_PORT, f"container port metrics must be {METRICS_PORT}")
    env = env_of(c)
    for var, port in (("RESPCOORD_LISTEN", GRPC_PORT), ("RESPCOORD_METRICS_LISTEN", METRICS_PORT)):
        value = env.get(var, {}).get("value", "")
        p.check(value.endswith(f":{port}"), f"{var}={value!r} does not listen on the container port {port}")

    ready, live = c.get("readinessProbe", {}), c.get("livenessProbe", {})
    if "tls" in features:
        # The kubelet's gRPC probe is plaintext: under TLS the probes use
        # the metrics port's HTTP endpoints.
        for probe, name, path in ((ready, "readinessProbe", "/readyz"), (live, "livenessProbe", "/healthz")):
            get = probe.get("httpGet", {})
            p.check("grpc" not in probe and get.get("path") == path
                    and ports.get(get.get("port"), get.get("port")) == METRICS_PORT,
                    f"tls: {name} must be httpGet {path} on the metrics port, got {probe}")
    else:
        p.check(ready.get("grpc") == {"port": GRPC_PORT, "service": SERVICE},
                f"readinessProbe must be grpc {{port: {GRPC_PORT}, service: {SERVICE}}}, got {ready.get('grpc')}")
        p.check(live.get("grpc", {}).get("port") == GRPC_PORT and live.get("grpc", {}).get("service", "") == "",
                f"livenessProbe must be grpc {{port: {GRPC_PORT}, service: \"\"}}, got {live.get('grpc')}")

    # Files: only read-only Secret mounts, readable by the container's user.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    for m in mounts.values():
        v = volumes.get(m["name"], {})
        p.check(m.get("readOnly") is True, f"volumeMount {m['mountPath']} must be readOnly")
        p.check("secret" in v, f"volume {m['name']} must be a Secret (nothing else is mounted)")
        mode = v.get("secret", {}).get("defaultMode", 0o644)
        p.check(mode & 0o004 or (mode & 0o040 and psc.get("fsGroup") == 65532),
                f"volume {m['name']}: mode {mode:o} is unreadable by uid 65532 without fsGroup 65532")

    def mounted_file(var, feature):
        path = env.get(var, {}).get("value", "")
        p.check(any(path.startswith(mp.rstrip("/") + "/") for mp in mounts),
                f"{feature}: {var}={path!r} is not under a mounted Secret")

    if "tls" in features:
        mounted_file("RESPCOORD_TLS_CERT", "tls")
        mounted_file("RESPCOORD_TLS_KEY", "tls")
    else:
        p.check("RESPCOORD_TLS_CERT" not in env, "TLS is set but the probes are gRPC (plaintext only)")
    if "auth" in features:
        mounted_file("RESPCOORD_AUTH_TOKENS", "auth")
    # NATS credentials and TLS (components/nats-creds, nats-tls, nats-mtls):
    # whichever is set is a file under a mounted Secret; secrets never sit
    # in the manifest as plain values.
    for var in NATS_FILE_VARS:
        if var in env:
            mounted_file(var, "nats")
    p.check(("RESPCOORD_NATS_TLS_CERT" in env) == ("RESPCOORD_NATS_TLS_KEY" in env),
            "nats: RESPCOORD_NATS_TLS_CERT and RESPCOORD_NATS_TLS_KEY go together")
    for var in ("RESPCOORD_NATS_PASSWORD", "RESPCOORD_NATS_TOKEN"):
        p.check("value" not in env.get(var, {}), f"{var} must come from a Secret, not a plain value")

    res = c.get("resources", {})
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            p.check(r in res.get(kind, {}), f"resources.{kind}.{r} must be set")
    p.check(res.get("requests", {}).get("memory") == res.get("limits", {}).get("memory"),
            "memory request must equal the limit (no memory overcommit)")

    # The drain fits in the termination grace period.
    try:
        grace = duration_seconds(env["RESPCOORD_SHUTDOWN_GRACE"]["value"])
    except (KeyError, ValueError) as e:
        p.check(False, f"RESPCOORD_SHUTDOWN_GRACE must be set to a duration: {e}")
        grace = 10
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    p.check(c.get("lifecycle", {}).get("preStop", {}).keys() <= {"sleep"},
            "preStop may only be the kubelet's sleep (the image has no shell)")
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    p.check(tgps >= pre_stop + grace + MIN_MARGIN_SECONDS,
            f"terminationGracePeriodSeconds {tgps} < preStop {pre_stop}s + RESPCOORD_SHUTDOWN_GRACE {grace}s + margin")
    p.check(tgps <= pre_stop + grace + 30, f"terminationGracePeriodSeconds {tgps} is far beyond the drain period")

    # Services select the pods and target real ports.
    services = by_kind.get("Service", [])
    for svc in services:
        sname = svc["metadata"]["name"]
        p.check(selects(svc["spec"].get("selector"), pod_labels), f"Service/{sname} does not select the pods")
        for sp in svc["spec"]["ports"]:
            target = sp.get("targetPort", sp["port"])
            p.check(target in ports or target in ports.values(),
                    f"Service/{sname} port {sp['name']} targets {target!r}, which the container does not expose")
    main = one(p, objects, "Service", NAME)
    if main:
        p.check(main["spec"].get("type", "ClusterIP") == "ClusterIP" and main["spec"].get("clusterIP") != "None",
                "Service respcoord must be a ClusterIP Service")

    # NetworkPolicy: only gateways on gRPC, only Prometheus on metrics.
    np = one(p, objects, "NetworkPolicy", NAME)
    if np:
        p.check(selects(np["spec"]["podSelector"], pod_labels), "NetworkPolicy does not select the pods")
        p.check("Ingress" in np["spec"].get("policyTypes", []), "NetworkPolicy must restrict Ingress")
        admitted = {}
        for rule in np["spec"].get("ingress", []):
            p.check(bool(rule.get("from")) and bool(rule.get("ports")),
                    "every NetworkPolicy ingress rule must name its peers and ports (no allow-all)")
            for port in rule.get("ports", []):
                number = ports.get(port["port"], port["port"])
                p.check(number in ports.values(), f"NetworkPolicy admits port {port['port']}, which is not exposed")
                admitted.setdefault(number, []).extend(rule.get("from", []))
        p.check(any(peer.get("podSelector", {}).get("matchLabels", {}).get(CLIENT_LABEL[0]) == CLIENT_LABEL[1]
                    for peer in admitted.get(GRPC_PORT, [])),
                f"NetworkPolicy must admit pods labelled {CLIENT_LABEL[0]}={CLIENT_LABEL[1]} on {GRPC_PORT}")
        p.check(all(peer.get("podSelector", {}).get("matchLabels") for peer in admitted.get(GRPC_PORT, [])),
                f"every peer admitted on {GRPC_PORT} must be selected by pod labels")
        p.check(bool(admitted.get(METRICS_PORT)), f"NetworkPolicy must admit the scraper on {METRICS_PORT}")

    # ServiceMonitor: exactly one Service, with the named metrics port.
    for sm in by_kind.get("ServiceMonitor", []):
        chosen = [s for s in services
                  if selects(sm["spec"]["selector"], s["metadata"].get("labels", {}))]
        p.check(len(chosen) == 1,
                f"ServiceMonitor selects {len(chosen)} Services; exactly one, or every pod is scraped twice")
        for ep in sm["spec"]["endpoints"]:
            p.check(all(ep.get("port") in [sp["name"] for sp in s["spec"]["ports"]] for s in chosen),
                    f"ServiceMonitor endpoint port {ep.get('port')!r} is not a port of the selected Service")
    if "servicemonitor" in features:
        p.check(len(by_kind.get("ServiceMonitor", [])) == 1, "a ServiceMonitor is expected")
    else:
        p.check("ServiceMonitor" not in by_kind,
                "no ServiceMonitor without components/servicemonitor (a cluster without the Prometheus "
                "Operator has no such kind, and the apply fails)")

    kinds = set(by_kind)
    if overlay == "memory":
        p.check(spec.get("replicas") == 1, "memory: exactly one replica (two pods would be two authorities)")
        p.check(spec.get("strategy", {}).get("type") == "Recreate",
                "memory: strategy must be Recreate (old and new pod never run together)")
        p.check("HorizontalPodAutoscaler" not in kinds, "memory: no autoscaler (one pod only)")
        p.check("PodDisruptionBudget" not in kinds, "memory: no PodDisruptionBudget (it would block every drain)")
        p.check(all(s["spec"].get("clusterIP") != "None" for s in services), "memory: no headless Service")
        p.check("RESPCOORD_NATS_URL" not in env and not c.get("args"), "memory: no backend flags")
    elif overlay == "nats":
        p.check("replicas" not in spec, "nats: replicas belong to the HorizontalPodAutoscaler")
        strategy = spec.get("strategy", {})
        p.check(strategy.get("type") == "RollingUpdate" and strategy.get("rollingUpdate", {}).get("maxUnavailable") == 0,
                "nats: RollingUpdate with maxUnavailable 0")
        hpa = one(p, objects, "HorizontalPodAutoscaler", NAME)
        if hpa:
            ref = hpa["spec"]["scaleTargetRef"]
            p.check((ref["kind"], ref["name"]) == ("Deployment", NAME), "nats: HPA must scale the Deployment")
            p.check(hpa["spec"].get("minReplicas", 1) >= 2, "nats: HPA minReplicas must be at least 2")
            p.check(any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"]),
                    "nats: HPA must scale on CPU")
        pdb = one(p, objects, "PodDisruptionBudget", NAME)
        if pdb:
            p.check(selects(pdb["spec"]["selector"], pod_labels), "nats: PodDisruptionBudget does not select the pods")
        tsc = pod.get("topologySpreadConstraints", [])
        p.check(any(t["topologyKey"] == "kubernetes.io/hostname" and selects(t["labelSelector"], pod_labels)
                    for t in tsc), "nats: pods must be spread over nodes")
        headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
        p.check(len(headless) == 1, "nats: one headless Service for client-side balancing")
        url = env.get("RESPCOORD_NATS_URL", {}).get("valueFrom", {}).get("secretKeyRef")
        p.check(bool(url and url.get("name") and url.get("key")), "nats: RESPCOORD_NATS_URL must come from a Secret")
        p.check("--backend=nats" in c.get("args", []),
                "nats: --backend=nats must be an argument (a binary without it then fails instead of serving memory)")
        p.check(env.get("RESPCOORD_NATS_REPLICAS", {}).get("value") == "3",
                "nats: RESPCOORD_NATS_REPLICAS must be 3 (the bucket survives one NATS node lost)")
        if "creds" in features:
            p.check("RESPCOORD_NATS_CREDS" in env, "nats: NATS credentials from a creds file (components/nats-creds)")
        else:
            creds = [v for v in NATS_FILE_VARS + ("RESPCOORD_NATS_USER", "RESPCOORD_NATS_PASSWORD",
                                                  "RESPCOORD_NATS_TOKEN")
                     if v in env and "TLS" not in v]
            p.check(not creds, f"nats: no NATS credentials ({', '.join(creds)}) in an overlay for the shipped "
                               "NATS cluster, which has none (overlays/nats-secured adds them)")
        nats_max_age_check(p, env)
    else:
        p.check(False, f"unknown overlay {overlay!r}")


def conf_text(text):
    """nats-server.conf without its comments (# and // to the end of a line)."""
    return "\n".join(re.sub(r"(^|\s)(#|//).*$", "", line) for line in text.splitlines())


def conf_value(conf, key):
    m = re.search(rf"^\s*{re.escape(key)}\s*[:=]?\s*\"?([^\"\s,]+)\"?\s*$", conf, re.M)
    return m.group(1) if m else None


def conf_block(conf, name):
    """The text inside `name { ... }` (no nested braces in our file)."""
    m = re.search(rf"^\s*{re.escape(name)}\s*[:=]?\s*{{([^}}]*)}}", conf, re.M)
    return m.group(1) if m else ""


def nats_cluster_check(p, objects):
    """The NATS cluster of deploy/kubernetes/nats-cluster (deploy/README.md)."""
    ns_name = NATS_NAMESPACE
    ns = one(p, objects, "Namespace", ns_name)
    if ns:
        p.check(ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") == "restricted",
                "Namespace nats must enforce the restricted Pod Security Standard")
    for obj in objects:
        if obj["kind"] != "Namespace":
            p.check(obj["metadata"].get("namespace") == ns_name,
                    f"{obj['kind']}/{obj['metadata']['name']} is not in namespace {ns_name}")

    sts = one(p, objects, "StatefulSet", "nats")
    if not sts:
        return
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    p.check(selects(spec["selector"], pod_labels), "StatefulSet selector does not select its own pods")
    replicas = spec.get("replicas", 1)
    p.check(replicas == 3, f"StatefulSet: 3 replicas (an R3 stream keeps its quorum with one node away), got {replicas}")
    p.check(spec.get("podManagementPolicy") == "Parallel",
            "StatefulSet: podManagementPolicy Parallel (one node alone never becomes ready)")
    p.check(pod.get("enableServiceLinks") is False, "enableServiceLinks must be false")
    p.check(pod.get("automountServiceAccountToken") is False, "the service account token must not be mounted")

    # Security: the restricted profile.
    psc = pod.get("securityContext", {})
    p.check(psc.get("runAsNonRoot") is True, "pod securityContext.runAsNonRoot must be true")
    p.check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "pod seccompProfile must be RuntimeDefault")
    p.check(bool(psc.get("fsGroup")), "pod fsGroup must be set (the store volume must be writable)")
    containers = pod["containers"]
    p.check(len(containers) == 1, "one container expected")
    c = containers[0]
    sc = c.get("securityContext", {})
    p.check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    p.check(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    p.check(sc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities must drop ALL")

    # The image: a pinned release, the one nats-server.conf is tested with.
    image = c["image"]
    m = re.search(r":v?(\d+)\.(\d+)\.(\d+)(-[\w.]+)?$", image)
    p.check(bool(m) and (int(m.group(1)), int(m.group(2))) >= (2, 10),
            f"image {image!r} must carry a nats-server release tag, 2.10 or newer")
    tested = os.environ.get("NATS_SERVER_VERSION")
    if m and tested:
        p.check(".".join(m.group(1, 2, 3)) == tested,
                f"image {image!r} is not the release nats-server.conf was tested with ({tested})")

    ports = {port["name"]: port["containerPort"] for port in c.get("ports", [])}
    for name in ("nats", "cluster", "monitor"):
        p.check(name in ports, f"container port {name!r} missing")

    # Server names: the pod name, stable across restarts.
    args = c.get("args", [])
    env = env_of(c)
    p.check("--name=$(POD_NAME)" in args
            and env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name",
            "the server name must be the pod name (--name=$(POD_NAME) from metadata.name)")

    # Volumes: the configuration, the pid file, and the JetStream store.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts", [])}

    def volume_at(path):
        """(mount path, volume name) of the mount holding a file path."""
        best = max((mp for mp in mounts if path.startswith(mp + "/")), key=len, default=None)
        return (best, mounts[best]["name"]) if best else (None, None)

    config_arg = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    conf = ""
    if p.check(bool(config_arg), "nats-server must be started with --config=FILE"):
        mp, vname = volume_at(config_arg)
        cm_name = volumes.get(vname, {}).get("configMap", {}).get("name")
        cms = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == cm_name]
        key = config_arg[len(mp) + 1:] if mp else None
        if p.check(bool(cms) and key in cms[0].get("data", {}),
                   f"--config={config_arg} is not a key of a ConfigMap in the rendering"):
            data = cms[0]["data"]
            conf = conf_text(data[key])
            for inc in re.findall(r"^\s*include\s+\"?([^\"\s;]+)", conf, re.M):
                p.check(inc in data, f"nats-server.conf includes {inc!r}, which is not in the ConfigMap")
            # overlays/nats connects without credentials: the cluster as
            # shipped must not ask for any (overlays/nats-secured is the
            # variant for a NATS that does).
            auth = conf_text(data.get("auth.conf", "")).strip()
            p.check(not auth, "auth.conf as shipped must configure no client authentication (overlays/nats "
                              f"has no credentials; use overlays/nats-secured with authentication): {auth[:80]!r}")

    top = re.sub(r"\{[^{}]*\}", "", conf)  # top-level options only
    for option, port in (("port", "nats"), ("http_port", "monitor")):
        p.check(conf_value(top, option) == str(ports.get(port)),
                f"nats-server.conf {option} must be the container port {port!r} ({ports.get(port)})")

    # JetStream: fsync before acknowledging, the store on the PVC.
    js = conf_block(conf, "jetstream")
    p.check(conf_value(js, "sync_interval") == "always",
            "jetstream.sync_interval must be `always` (fsync before acknowledging; deploy/README.md)")
    store = conf_value(js, "store_dir") or ""
    claims = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates", [])}
    mp, vname = volume_at(store + "/")
    p.check(bool(store) and vname in claims,
            f"jetstream.store_dir {store!r} must be on a volumeClaimTemplates volume (one PVC per node)")
    for name, claim in claims.items():
        p.check(bool(claim["spec"].get("resources", {}).get("requests", {}).get("storage")),
                f"volumeClaimTemplate {name} must request storage")

    # Cluster routes: every pod of the StatefulSet, by its stable DNS name.
    cluster = conf_block(conf, "cluster")
    p.check(conf_value(cluster, "port") == str(ports.get("cluster")),
            f"cluster.port must be the container port 'cluster' ({ports.get('cluster')})")
    headless_name = spec.get("serviceName")
    routes = re.findall(r"nats://([^\s,\]]+)", cluster)
    expected = {f"{sts['metadata']['name']}-{i}.{headless_name}.{ns_name}.svc.cluster.local:{ports.get('cluster')}"
                for i in range(replicas)}
    p.check(set(routes) == expected, f"cluster routes must be {sorted(expected)}, got {routes}")
    headless = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == headless_name]
    if p.check(len(headless) == 1, f"serviceName {headless_name!r} is not a Service in the rendering"):
        h = headless[0]["spec"]
        p.check(h.get("clusterIP") == "None", f"Service {headless_name} must be headless")
        p.check(h.get("publishNotReadyAddresses") is True,
                f"Service {headless_name} must publish not-ready pods (routes connect before readiness)")

    # Lame duck: the preStop signal, and the time to finish it.
    pid_file = conf_value(top, "pid_file")
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    signal = " ".join(pre_stop)
    p.check(bool(pid_file) and re.search(rf"(--signal|-sl)[ =]ldm={re.escape(pid_file or '')}$", signal) is not None
            and pre_stop[:1] == ["nats-server"],
            f"preStop must put the server in lame-duck mode: nats-server --signal ldm={pid_file}, got {pre_stop}")
    p.check(bool(pid_file) and volume_at(pid_file)[0] is not None and "emptyDir" in volumes.get(volume_at(pid_file)[1], {}),
            f"pid_file {pid_file!r} must be on an emptyDir volume (the root filesystem is read-only)")
    try:
        ldm = duration_seconds(conf_value(top, "lame_duck_duration") or "")
        grace = duration_seconds(conf_value(top, "lame_duck_grace_period") or "")
        p.check(grace < ldm, "lame_duck_grace_period must be shorter than lame_duck_duration")
        tgps = pod.get("terminationGracePeriodSeconds", 30)
        p.check(tgps >= ldm + LAME_DUCK_MARGIN_SECONDS,
                f"terminationGracePeriodSeconds {tgps} < lame_duck_duration {ldm}s + {LAME_DUCK_MARGIN_SECONDS}s")
    except ValueError as e:
        p.check(False, f"lame_duck_duration and lame_duck_grace_period must be set: {e}")

    # Probes on the monitoring port's /healthz.
    probes = {name: c.get(name, {}).get("httpGet", {}) for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    for name, get in probes.items():
        p.check(ports.get(get.get("port"), get.get("port")) == ports.get("monitor")
                and get.get("path", "").startswith("/healthz"),
                f"{name} must be httpGet /healthz... on the monitoring port, got {get}")
    p.check(probes["livenessProbe"].get("path") == "/healthz?js-enabled-only=true",
            "livenessProbe must be /healthz?js-enabled-only=true (a lagging stream is no reason to restart)")
    p.check(probes["startupProbe"].get("path") == "/healthz",
            "startupProbe must be the full /healthz (a restarted node catches up before the next one rolls)")

    # One node per Kubernetes node, one disruption at a time.
    anti = pod.get("affinity", {}).get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])
    p.check(any(t.get("topologyKey") == "kubernetes.io/hostname" and selects(t.get("labelSelector"), pod_labels)
                for t in anti), "required podAntiAffinity on kubernetes.io/hostname selecting the NATS pods")
    pdb = one(p, objects, "PodDisruptionBudget", "nats")
    if pdb:
        p.check(selects(pdb["spec"]["selector"], pod_labels), "PodDisruptionBudget does not select the pods")
        p.check(pdb["spec"].get("maxUnavailable") == 1, "PodDisruptionBudget: maxUnavailable 1")

    for svc in (o for o in objects if o["kind"] == "Service"):
        sname = svc["metadata"]["name"]
        p.check(selects(svc["spec"].get("selector"), pod_labels), f"Service/{sname} does not select the pods")
        for sp in svc["spec"]["ports"]:
            target = sp.get("targetPort", sp["port"])
            p.check(target in ports or target in ports.values(),
                    f"Service/{sname} port {sp['name']} targets {target!r}, which the container does not expose")

    np = one(p, objects, "NetworkPolicy", "nats")
    if np:
        p.check(selects(np["spec"]["podSelector"], pod_labels), "NetworkPolicy does not select the pods")
        admitted = {}
        for rule in np["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                admitted.setdefault(ports.get(port["port"], port["port"]), []).extend(rule.get("from", []))
        p.check(any(peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == NAME
                    for peer in admitted.get(ports.get("nats"), [])),
                "NetworkPolicy must admit respcoord's pods on the client port")
        p.check(any(selects(peer.get("podSelector"), pod_labels) for peer in admitted.get(ports.get("cluster"), [])),
                "NetworkPolicy must admit the NATS pods on the route port")


def env_duration(p, env, var, default):
    try:
        return duration_seconds(env.get(var, {}).get("value", default))
    except ValueError as e:
        p.check(False, f"{var}: {e}")
        return duration_seconds(default)


def nats_max_age_check(p, env):
    """The bucket's age limit outlasts every remembered session's newest entry."""
    if not p.check("value" in env.get("RESPCOORD_NATS_MAX_AGE", {}),
                   "nats: RESPCOORD_NATS_MAX_AGE must be set (else purge markers pile up forever)"):
        return
    max_age = env_duration(p, env, "RESPCOORD_NATS_MAX_AGE", "0s")
    idle = env_duration(p, env, "RESPCOORD_SESSION_IDLE_TTL", DEFAULT_IDLE_TTL)
    tombstone = env_duration(p, env, "RESPCOORD_TOMBSTONE_TTL", DEFAULT_TOMBSTONE_TTL)
    p.check(max_age >= idle + tombstone + MAX_AGE_MARGIN_SECONDS,
            f"nats: RESPCOORD_NATS_MAX_AGE ({max_age}s) must exceed the idle TTL ({idle}s) + tombstone TTL "
            f"({tombstone}s) by at least {MAX_AGE_MARGIN_SECONDS}s, or live sessions age out of the bucket")


def main(argv):
    versions = argv[1].split(",")
    failed = False
    for arg in argv[2:]:
        overlay, path = arg.split("=", 1)
        with open(path) as f:
            objects = [o for o in yaml.safe_load_all(f) if o]
        p = Problems(overlay)
        schema_check(p, objects, versions)
        if overlay == "nats-cluster":
            nats_cluster_check(p, objects)
        elif overlay != "base":  # the base is incomplete on purpose: schemas only
            policy_check(p, overlay, objects)
        kinds = sorted({o["kind"] for o in objects})
        if p.items:
            failed = True
            print(f"FAIL {overlay}:")
            for item in p.items:
                print(f"  - {item}")
        else:
            checks = "schemas " + "+".join(versions) + " strict"
            if "ServiceMonitor" in kinds:
                checks += ", ServiceMonitor vs operator CRD model"
            if overlay == "nats-cluster":
                checks += ", NATS cluster rules"
            elif overlay != "base":
                checks += ", deployment rules"
            print(f"ok   {overlay}: {len(objects)} objects ({', '.join(kinds)}); {checks}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
