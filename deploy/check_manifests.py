"""Validates rendered respcoord manifests; run by deploy/check.sh in its venv.

    check_manifests.py K8S_VERSION[,K8S_VERSION...] OVERLAY=RENDERED.yaml...

OVERLAY is memory or nats, optionally with the components it composes
(memory-tls-auth), or base (the base gets step 1 only). For each
rendering (`kubectl kustomize`):

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
   disruption budget, headless Service, NATS URL from a Secret).

Prints one line per overlay; on failure, every problem found, and exits 1.
"""

import functools
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
    # "memory", "nats", or a composition "memory-tls-auth": backend, features.
    overlay, *features = name.split("-")
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
    p.check(len(by_kind.get("ServiceMonitor", [])) == 1, "a ServiceMonitor is expected")

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
    else:
        p.check(False, f"unknown overlay {overlay!r}")


def main(argv):
    versions = argv[1].split(",")
    failed = False
    for arg in argv[2:]:
        overlay, path = arg.split("=", 1)
        with open(path) as f:
            objects = [o for o in yaml.safe_load_all(f) if o]
        p = Problems(overlay)
        schema_check(p, objects, versions)
        if overlay != "base":  # the base is incomplete on purpose: schemas only
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
            if overlay != "base":
                checks += ", deployment rules"
            print(f"ok   {overlay}: {len(objects)} objects ({', '.join(kinds)}); {checks}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
