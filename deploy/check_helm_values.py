"""Checks deploy/helm/nats-values.yaml; run by deploy/check.sh in its venv.

    check_helm_values.py VALUES.yaml RENDERED-NATS-CLUSTER.yaml

The official NATS chart cannot be downloaded here (nor rendered), so:

1. The file parses as YAML, and every key it sets is one the chart's
   values.yaml has (CHART_PATHS, read from nats-io/k8s, chart "nats"
   2.14.2, commit 957650fb): a misspelt key, which Helm would silently
   ignore, fails. Under the chart's free-form maps (merge, env, resources,
   topologySpreadConstraints, ...) anything goes.
2. It makes the same choices as the plain manifests
   (deploy/kubernetes/nats-cluster, rendered): replicas, image release, PVC
   size, sync_interval, lame-duck timings and the hard anti-affinity.

Prints one line; on failure, every problem found, and exits 1.
"""

import re
import sys

import yaml

# Leaf keys of the chart's values.yaml that this file may set. A path
# ending in ".*" is a map the chart passes through (merged into nats.conf
# or a Kubernetes object): any key below it is accepted.
CHART_PATHS = """
global.image.pullPolicy global.image.pullSecretNames global.image.registry global.labels.*
nameOverride fullnameOverride namespaceOverride
tlsCA.enabled tlsCA.configMapName tlsCA.secretName tlsCA.dir tlsCA.key
config.cluster.enabled config.cluster.port config.cluster.replicas config.cluster.noAdvertise
config.cluster.routeURLs.user config.cluster.routeURLs.password config.cluster.routeURLs.useFQDN
config.cluster.routeURLs.k8sClusterDomain
config.cluster.tls.enabled config.cluster.tls.secretName config.cluster.tls.dir config.cluster.tls.cert
config.cluster.tls.key config.cluster.tls.merge.* config.cluster.tls.patch
config.cluster.merge.* config.cluster.patch
config.jetstream.enabled
config.jetstream.fileStore.enabled config.jetstream.fileStore.dir config.jetstream.fileStore.maxSize
config.jetstream.fileStore.pvc.enabled config.jetstream.fileStore.pvc.size
config.jetstream.fileStore.pvc.storageClassName config.jetstream.fileStore.pvc.merge.*
config.jetstream.fileStore.pvc.patch config.jetstream.fileStore.pvc.name
config.jetstream.memoryStore.enabled config.jetstream.memoryStore.maxSize
config.jetstream.merge.* config.jetstream.patch
config.nats.port config.nats.tls.enabled config.nats.tls.secretName config.nats.tls.dir config.nats.tls.cert
config.nats.tls.key config.nats.tls.merge.* config.nats.tls.patch
config.monitor.enabled config.monitor.port config.monitor.tls.enabled
config.profiling.enabled config.profiling.port
config.resolver.enabled config.resolver.dir config.resolver.pvc.enabled config.resolver.pvc.size
config.resolver.pvc.storageClassName config.resolver.pvc.merge.* config.resolver.pvc.patch
config.resolver.pvc.name config.resolver.merge.* config.resolver.patch
config.serverNamePrefix config.merge.* config.patch
container.image.repository container.image.tag container.image.pullPolicy container.image.registry
container.image.digest container.image.fullImageName
container.ports.* container.env.* container.merge.* container.patch container.resources.*
reloader.enabled reloader.image.* reloader.env.* reloader.natsVolumeMountPrefixes reloader.merge.* reloader.patch
promExporter.enabled promExporter.image.* promExporter.port promExporter.monitorDomain promExporter.env.*
promExporter.merge.* promExporter.patch promExporter.podMonitor.enabled promExporter.podMonitor.merge.*
promExporter.podMonitor.patch promExporter.podMonitor.name
service.enabled service.ports.* service.merge.* service.patch service.name
statefulSet.merge.* statefulSet.patch statefulSet.name
podTemplate.configChecksumAnnotation podTemplate.topologySpreadConstraints.* podTemplate.merge.* podTemplate.patch
headlessService.merge.* headlessService.patch headlessService.name
configMap.merge.* configMap.patch configMap.name
podDisruptionBudget.enabled podDisruptionBudget.merge.* podDisruptionBudget.patch podDisruptionBudget.name
serviceAccount.enabled serviceAccount.merge.* serviceAccount.patch serviceAccount.name
natsBox.enabled natsBox.contexts.* natsBox.defaultContextName natsBox.container.*
natsBox.deployment.* natsBox.podTemplate.* natsBox.contextsSecret.* natsBox.contentsSecret.*
natsBox.serviceAccount.*
extraResources
""".split()


def leaves(value, path=""):
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from leaves(sub, f"{path}.{key}" if path else str(key))
    else:
        yield path


def allowed(path):
    for known in CHART_PATHS:
        if known.endswith(".*"):
            if path.startswith(known[:-1]) or path == known[:-2]:
                return True
        elif path == known:
            return True
    return False


def get(values, path, default=None):
    for key in path.split("."):
        if not isinstance(values, dict) or key not in values:
            return default
        values = values[key]
    return values


def main(values_path, rendered_path):
    problems = []
    with open(values_path) as f:
        values = yaml.safe_load(f)
    if not isinstance(values, dict):
        print(f"FAIL {values_path}: not a YAML mapping")
        return 1
    paths = list(leaves(values))
    problems += [f"{path}: not a key of the chart's values.yaml" for path in paths if not allowed(path)]

    with open(rendered_path) as f:
        objects = [o for o in yaml.safe_load_all(f) if o]
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    conf = next(o for o in objects if o["kind"] == "ConfigMap")["data"]["nats-server.conf"]
    container = sts["spec"]["template"]["spec"]["containers"][0]

    def same(what, chart, plain):
        if str(chart) != str(plain):
            problems.append(f"{what}: the chart gets {chart!r}, the plain manifests {plain!r}")

    same("replicas", get(values, "config.cluster.replicas"), sts["spec"]["replicas"])
    for flag in ("config.cluster.enabled", "config.jetstream.enabled", "config.jetstream.fileStore.pvc.enabled",
                 "config.monitor.enabled", "podDisruptionBudget.enabled"):
        same(flag, get(values, flag), True)
    same("image release", get(values, "container.image.tag"), container["image"].rsplit(":", 1)[1])
    same("PVC size", get(values, "config.jetstream.fileStore.pvc.size"),
         sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"])
    same("jetstream sync_interval", get(values, "config.jetstream.merge.sync_interval"), "always")
    for key in ("lame_duck_duration", "lame_duck_grace_period"):
        m = re.search(rf"^{key}:\s*(\S+)", conf, re.M)
        same(key, get(values, f"config.merge.{key}"), m.group(1) if m else None)
    anti = get(values, "podTemplate.merge.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution", [])
    if not any(t.get("topologyKey") == "kubernetes.io/hostname" for t in anti):
        problems.append("podTemplate: hard podAntiAffinity on kubernetes.io/hostname, as in the plain manifests")

    if problems:
        print(f"FAIL {values_path}:")
        for item in problems:
            print(f"  - {item}")
        return 1
    print(f"ok   {values_path}: {len(paths)} keys, all in the nats chart 2.14.2's values.yaml; "
          "same choices as deploy/kubernetes/nats-cluster")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
