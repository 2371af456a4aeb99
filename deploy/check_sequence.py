"""Walks the documented Kubernetes steps in order, as a cluster would take them.

    check_sequence.py KUBECTL K8S_VERSIONS DOC.md...              walk the docs' steps
    check_sequence.py --self-test KUBECTL K8S_VERSIONS DOC.md...  and prove it can fail

Run by deploy/check.sh in its venv (KUBECTL is the pinned kubectl, whose
built-in kustomize renders what `kubectl apply -k` would apply).

A walked block is a fenced shell block right after a marker line

    <!-- deploy-walk: NAME [given-crd=KIND.GROUP ...] -->

(given-crd: a CRD the prose around the block says must be installed first,
such as the Prometheus Operator's ServiceMonitor). Each block is walked on
its own, from an empty cluster (the namespaces default, kube-system,
kube-public and kube-node-lease; the built-in kinds of the Kubernetes
versions given, from kubernetes-validate's schemas), command by command:

- `kubectl create namespace NS`: NS must not exist yet.
- `kubectl [-n NS] create secret generic|tls NAME ...`: NS exists, NAME is
  not yet in it; its keys (--from-literal, --from-file, tls.crt and tls.key)
  are recorded.
- `kubectl [-n NS] apply -k DIR | -f FILE|DIR`: rendered (kubectl kustomize,
  or the files), then each object in order: its kind built in, or defined
  by a CRD applied in an earlier step (kubectl maps every kind before it
  applies any, so a CRD and its objects in one apply fail); a namespaced
  object's namespace (its own, else -n, else default) existing, or created
  earlier in the same apply, and agreeing with -n. Once the step is done,
  every Secret, ConfigMap and ServiceAccount a pod template refers to
  (volumes, projected volumes, env secretKeyRef/configMapKeyRef, envFrom,
  imagePullSecrets, serviceAccountName; not those marked optional) must
  exist, with every key it names: a pod would otherwise wait on it.
- `helm repo add NAME URL`; `helm upgrade --install | install RELEASE CHART
  [-n NS] [--create-namespace] [-f VALUES]`: the chart's repository added
  before, NS existing or created by --create-namespace, each VALUES file
  present. The chart is not rendered (it cannot be downloaded here), so
  what it creates is known only as "a Helm release in NS".
- `kubectl [-n NS] rollout status|wait|get|describe|exec|logs|port-forward`:
  NS exists; a TYPE/NAME it names (deploy/respcoord, statefulset/nats) was
  applied before, or NS holds a Helm release.
- Any other kubectl or helm subcommand fails (teach the walker what it
  does); other programs (docker, kind, nsc, ...) do not touch the cluster
  and are passed over.

Every fenced shell block of the given files that runs `kubectl apply`,
`kubectl create` or `helm install/upgrade` must carry a marker, deploy-walk
or `<!-- deploy-walk: skip REASON -->`, so that no documented step escapes.

--self-test then walks mutated copies of the real blocks and synthetic ones
(the Secret created before its namespace, as the README once had it; a
Secret nobody creates; a key the Secret lacks; a kind without its CRD; a
CRD and its objects in one apply; a Helm namespace nobody creates; an
unmarked block; ...) and fails unless each is rejected for the expected
reason, and unless the unmutated blocks pass.

Prints one line per block; on failure, every problem found, and exits 1.
"""

import functools
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import yaml
from kubernetes_validate import utils as kv

MARKER = re.compile(r"^<!--\s*deploy-walk:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```\s*(\w*)\s*$")
SHELL_LANGS = {"sh", "bash", "shell", "console", ""}
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# Built-in kinds that are not namespaced (the rest of the built-in kinds are).
CLUSTER_SCOPED = {
    "APIService", "CertificateSigningRequest", "ClusterRole", "ClusterRoleBinding", "ClusterTrustBundle",
    "ComponentStatus", "CSIDriver", "CSINode", "CustomResourceDefinition", "DeviceClass", "FlowSchema",
    "IngressClass", "IPAddress", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration", "Namespace", "Node", "PersistentVolume", "PriorityClass",
    "PriorityLevelConfiguration", "RuntimeClass", "SelfSubjectAccessReview", "SelfSubjectReview",
    "SelfSubjectRulesReview", "ServiceCIDR", "StorageClass", "StorageVersionMigration", "SubjectAccessReview",
    "TokenReview", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration", "VolumeAttachment", "VolumeAttributesClass",
}
# API groups of built-in kinds (apiVersion "v1" is the core group, "").
BUILTIN_GROUPS = {"", "apps", "batch", "autoscaling", "policy"}
# kubectl's names for the types a TYPE/NAME argument may use.
TYPE_NAMES = {
    "deploy": "Deployment", "deployment": "Deployment", "deployments": "Deployment",
    "sts": "StatefulSet", "statefulset": "StatefulSet", "statefulsets": "StatefulSet",
    "ds": "DaemonSet", "daemonset": "DaemonSet", "daemonsets": "DaemonSet",
    "svc": "Service", "service": "Service", "services": "Service",
    "job": "Job", "jobs": "Job", "cm": "ConfigMap", "configmap": "ConfigMap",
    "secret": "Secret", "secrets": "Secret",
}
# Flags (kubectl's and helm's) that take a value as the next word.
VALUE_FLAGS = {
    "-n", "--namespace", "-f", "--filename", "-k", "--kustomize", "--from-literal", "--from-file",
    "--from-env-file", "--cert", "--key", "--type", "--context", "--kubeconfig", "-o", "--output",
    "--field-manager", "--timeout", "-l", "--selector", "-c", "--container", "--for", "--version",
    "--values", "--set", "--set-string", "--set-file", "--kube-context", "--image",
}
READ_SUBCOMMANDS = {"get", "describe", "exec", "logs", "port-forward", "wait", "top"}
POD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template", "spec"), "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"), "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"), "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "Pod": ("spec",),
}


@dataclass
class Command:
    text: str  # the logical line (continuations joined)
    line: int  # where it starts in its file


@dataclass
class Block:
    path: str
    line: int  # the marker's line
    name: str
    given_crds: list
    commands: list
    skip: bool = False


@dataclass
class Cluster:
    namespaces: dict = field(default_factory=dict)  # name -> step (0: there from the start)
    crds: dict = field(default_factory=dict)  # (group, kind) -> namespaced?
    objects: dict = field(default_factory=dict)  # (kind, namespace, name) -> step
    data: dict = field(default_factory=dict)  # (kind, namespace, name) -> keys, for Secret and ConfigMap
    helm_namespaces: set = field(default_factory=set)
    repos: set = field(default_factory=set)


class Walk:
    def __init__(self, kubectl, versions, block):
        self.kubectl = kubectl
        self.versions = versions
        self.block = block
        self.cluster = Cluster({ns: 0 for ns in INITIAL_NAMESPACES})
        for crd in block.given_crds:
            kind, _, group = crd.partition(".")
            self.cluster.crds[(group, kind)] = True
        self.problems = []  # (step, what is missing or wrong, the thing it needs or None)
        self.created = {}  # ("Namespace"|"Secret"|..., namespace, name) -> first step that created it
        self.steps = 0

    # -- what the walk records ------------------------------------------------

    def problem(self, step, message, needs=None):
        self.problems.append((step, message, needs))

    def create(self, step, kind, namespace, name, keys=None):
        key = (kind, namespace, name)
        self.cluster.objects[key] = step
        self.created.setdefault(key, step)
        if kind == "Namespace":
            self.cluster.namespaces.setdefault(name, step)
        if keys is not None:
            self.cluster.data[key] = set(keys)

    def namespace_exists(self, step, namespace, what):
        if namespace in self.cluster.namespaces:
            return True
        self.problem(step, f"{what}: namespace {namespace} does not exist", ("Namespace", None, namespace))
        return False

    def report(self):
        """The problems, each saying whether a later step creates what was missing."""
        out, seen = [], set()
        for step, found, needs in self.problems:
            if (step, found) in seen:
                continue  # one Secret referred to twice (a key and a volume) is one problem
            seen.add((step, found))
            message = found
            if needs is not None:
                later = self.created.get(needs)
                late = later is not None and later > step
                message += f" (created only later, by step {later})" if late else " (no step creates it)"
            cmd = self.block.commands[step - 1]
            text = " ".join(cmd.text.split())
            short = text if len(text) <= 90 else text[:87] + "..."
            out.append(f"{self.block.path}:{cmd.line}: step {step} `{short}`: {message}")
        return out

    # -- kinds -----------------------------------------------------------------

    def kind_info(self, api_version, kind):
        """(known, namespaced): built in, or defined by a CRD applied before."""
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        if (group in BUILTIN_GROUPS or group.endswith(".k8s.io")) and builtin(api_version, kind, self.versions):
            return True, kind not in CLUSTER_SCOPED
        if (group, kind) in self.cluster.crds:
            return True, self.cluster.crds[(group, kind)]
        return False, True

    # -- commands --------------------------------------------------------------

    def run(self):
        for step, cmd in enumerate(self.block.commands, start=1):
            self.steps = step
            try:
                words = split_commands(cmd.text)
            except ValueError as e:
                self.problem(step, f"cannot parse: {e}")
                continue
            for argv in words:
                self.command(step, argv)
        return self.report()

    def command(self, step, argv):
        if not argv:
            return
        if argv[0] == "kubectl":
            self.kubectl_command(step, argv[1:])
        elif argv[0] == "helm":
            self.helm_command(step, argv[1:])
        elif "<<" in argv or any(w.startswith("<<") for w in argv):
            self.problem(step, "the walker does not read here-documents")

    def kubectl_command(self, step, args):
        flags, pos = parse_flags(args)
        namespace = last(flags, "-n", "--namespace")
        if not pos:
            self.problem(step, "kubectl without a subcommand")
            return
        sub = pos[0]
        if sub == "create" and len(pos) >= 3 and pos[1] in ("namespace", "ns"):
            name = pos[2]
            if name in self.cluster.namespaces:
                self.problem(step, f"namespace {name} already exists (kubectl create fails: AlreadyExists)")
            self.create(step, "Namespace", None, name)
        elif sub == "create" and len(pos) >= 4 and pos[1] == "secret":
            self.create_secret(step, pos[2], pos[3], flags, namespace or "default")
        elif sub == "apply":
            self.apply(step, flags, namespace)
        elif sub == "rollout" and len(pos) >= 2 and pos[1] in ("status", "restart", "history", "undo"):
            self.read(step, pos[2:], namespace or "default", f"kubectl rollout {pos[1]}")
        elif sub in READ_SUBCOMMANDS:
            self.read(step, pos[1:2], namespace or "default", f"kubectl {sub}")
        elif sub in ("kustomize", "version", "config", "cluster-info", "api-resources", "explain"):
            pass  # reads nothing in a namespace, changes nothing
        else:
            self.problem(step, f"the walker does not know `kubectl {' '.join(pos[:2])}`: teach "
                               "deploy/check_sequence.py what it creates and needs")

    def create_secret(self, step, kind, name, flags, namespace):
        if kind == "generic":
            keys = [lit.split("=", 1)[0] for lit in flags.get("--from-literal", [])]
            for spec in flags.get("--from-file", []):
                key, eq, _ = spec.partition("=")
                keys.append(key if eq else os.path.basename(spec))
        elif kind == "tls":
            keys = ["tls.crt", "tls.key"]
        elif kind == "docker-registry":
            keys = [".dockerconfigjson"]
        else:
            self.problem(step, f"the walker does not know `kubectl create secret {kind}`")
            return
        if not self.namespace_exists(step, namespace, f"Secret {name}"):
            return
        if ("Secret", namespace, name) in self.cluster.objects:
            self.problem(step, f"Secret {namespace}/{name} already exists (kubectl create fails: AlreadyExists)")
        self.create(step, "Secret", namespace, name, keys)

    def apply(self, step, flags, namespace):
        if "--dry-run" in flags and flags["--dry-run"][-1] not in ("none",):
            return
        objects = []
        for target in flags.get("-k", []) + flags.get("--kustomize", []):
            if not os.path.isdir(target):
                self.problem(step, f"{target}: no such directory")
                continue
            code, out, err = kustomize(self.kubectl, target)
            if code != 0:
                self.problem(step, f"kubectl kustomize {target} failed: {err.strip()}")
                continue
            objects += [o for o in yaml.safe_load_all(out) if o]
        for target in flags.get("-f", []) + flags.get("--filename", []):
            if target == "-" or "://" in target:
                self.problem(step, f"-f {target}: the walker reads only files in this repository")
                continue
            if os.path.isdir(target):
                paths = sorted(os.path.join(target, f) for f in os.listdir(target)
                               if f.endswith((".yaml", ".yml", ".json")))
            else:
                paths = [target]
            for path in paths:
                if not os.path.isfile(path):
                    self.problem(step, f"{path}: no such file")
                    continue
                with open(path) as f:
                    objects += [o for o in yaml.safe_load_all(f) if o]
        if not objects:
            self.problem(step, "kubectl apply of nothing (neither -k nor -f rendered an object)")
            return
        new_crds, applied = {}, []
        for obj in objects:
            kind, meta = obj.get("kind", "?"), obj.get("metadata", {})
            name = meta.get("name", "?")
            known, namespaced = self.kind_info(obj.get("apiVersion", ""), kind)
            if not known:
                self.problem(step, f"{kind}/{name}: kind {kind} ({obj.get('apiVersion')}) is not built in and "
                                   "no earlier step installs its CRD", ("CustomResourceDefinition", None, kind))
                continue
            ns = None
            if namespaced:
                ns = meta.get("namespace") or namespace or "default"
                if namespace and meta.get("namespace") and meta["namespace"] != namespace:
                    self.problem(step, f"{kind}/{name}: its namespace {meta['namespace']} does not match "
                                       f"-n {namespace} (kubectl refuses)")
                    continue
                if not self.namespace_exists(step, ns, f"{kind}/{name}"):
                    continue
            keys = None
            if kind == "Secret":
                keys = set(obj.get("data", {}) or {}) | set(obj.get("stringData", {}) or {})
            elif kind == "ConfigMap":
                keys = set(obj.get("data", {}) or {}) | set(obj.get("binaryData", {}) or {})
            self.create(step, kind, ns, name, keys)
            applied.append((obj, ns))
            if kind == "CustomResourceDefinition":
                spec = obj.get("spec", {})
                new_crds[(spec.get("group"), spec.get("names", {}).get("kind"))] = spec.get("scope") != "Cluster"
                self.created.setdefault(("CustomResourceDefinition", None, spec.get("names", {}).get("kind")), step)
        # After the step: what its pods need exists.
        for obj, ns in applied:
            for ref_kind, ref_name, key in pod_references(obj):
                label = f"{obj['kind']}/{obj['metadata']['name']}"
                # Every namespace has the ServiceAccount "default".
                have = (ref_kind, ns, ref_name) in self.cluster.objects or (
                    (ref_kind, ref_name) == ("ServiceAccount", "default") and ns in self.cluster.namespaces)
                if not have:
                    self.problem(step, f"{label} refers to {ref_kind} {ns}/{ref_name}, which does not exist",
                                 (ref_kind, ns, ref_name))
                elif key is not None and self.cluster.data.get((ref_kind, ns, ref_name)) is not None \
                        and key not in self.cluster.data[(ref_kind, ns, ref_name)]:
                    self.problem(step, f"{label} needs key {key} of {ref_kind} {ns}/{ref_name}, which has only "
                                       f"{', '.join(sorted(self.cluster.data[(ref_kind, ns, ref_name)])) or 'none'}")
        self.cluster.crds.update(new_crds)

    def read(self, step, targets, namespace, what):
        if not self.namespace_exists(step, namespace, what):
            return
        for target in targets:
            type_name, slash, name = target.partition("/")
            kind = TYPE_NAMES.get(type_name.lower())
            if not slash or kind is None or namespace in self.cluster.helm_namespaces:
                continue
            if (kind, namespace, name) not in self.cluster.objects:
                self.problem(step, f"{what} {target}: no {kind} {namespace}/{name} was applied before",
                             (kind, namespace, name))

    def helm_command(self, step, args):
        flags, pos = parse_flags(args)
        if pos[:2] in (["repo", "add"],) and len(pos) >= 3:
            self.cluster.repos.add(pos[2])
            return
        if pos[:2] in (["repo", "update"],) or pos[:1] in (["version"], ["template"], ["show"], ["pull"]):
            return
        installs = pos[:1] == ["install"] or (pos[:1] == ["upgrade"] and ("--install" in flags or "-i" in flags))
        if installs and len(pos) >= 3:
            release, chart = pos[1], pos[2]
        else:
            self.problem(step, f"the walker does not know `helm {' '.join(pos[:2])}`")
            return
        repo = chart.split("/", 1)[0]
        if "/" in chart and not chart.startswith((".", "/", "oci:")) and "://" not in chart \
                and repo not in self.cluster.repos:
            self.problem(step, f"chart {chart}: no earlier step adds the Helm repository {repo} (helm repo add)")
        for values in flags.get("-f", []) + flags.get("--values", []):
            if not os.path.isfile(values):
                self.problem(step, f"values file {values}: no such file")
        namespace = last(flags, "-n", "--namespace") or "default"
        if "--create-namespace" in flags:
            if namespace not in self.cluster.namespaces:
                self.create(step, "Namespace", None, namespace)
        elif not self.namespace_exists(step, namespace, f"Helm release {release}"):
            return
        self.cluster.helm_namespaces.add(namespace)


@functools.cache
def kustomize(kubectl, target):
    """(exit code, stdout, stderr) of `kubectl kustomize TARGET`: once per directory and run."""
    rendered = subprocess.run([kubectl, "kustomize", target], check=False, capture_output=True, text=True)
    return rendered.returncode, rendered.stdout, rendered.stderr


@functools.cache
def builtin(api_version, kind, versions):
    """Whether kubernetes-validate has a schema for the kind in every version."""
    for version in versions:
        try:
            kv.validate({"apiVersion": api_version, "kind": kind}, version, strict=True)
        except kv.SchemaNotFoundError:
            return False
        except kv.ValidationError:
            pass  # a schema exists; the stub is merely invalid
    return True


def pod_references(obj):
    """(kind, name, key or None) of every Secret, ConfigMap and ServiceAccount a pod template needs."""
    path = POD_TEMPLATE_PATHS.get(obj.get("kind"))
    if path is None:
        return []
    pod = obj
    for part in path:
        pod = (pod or {}).get(part) or {}
    refs = [("ServiceAccount", pod.get("serviceAccountName") or pod.get("serviceAccount") or "default", None)]

    def source(kind, ref, name_field):
        if ref and not ref.get("optional"):
            items = ref.get("items") or [{}]
            refs.extend((kind, ref.get(name_field), item.get("key")) for item in items)

    for volume in pod.get("volumes", []) or []:
        source("Secret", volume.get("secret"), "secretName")
        source("ConfigMap", volume.get("configMap"), "name")
        for projected in (volume.get("projected") or {}).get("sources", []) or []:
            source("Secret", projected.get("secret"), "name")
            source("ConfigMap", projected.get("configMap"), "name")
    for container in (pod.get("containers") or []) + (pod.get("initContainers") or []):
        for env in container.get("env", []) or []:
            value_from = env.get("valueFrom") or {}
            for kind, ref_field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                ref = value_from.get(ref_field)
                if ref and not ref.get("optional"):
                    refs.append((kind, ref.get("name"), ref.get("key")))
        for env_from in container.get("envFrom", []) or []:
            for kind, ref_field in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
                ref = env_from.get(ref_field)
                if ref and not ref.get("optional"):
                    refs.append((kind, ref.get("name"), None))
    refs.extend(("Secret", s.get("name"), None) for s in pod.get("imagePullSecrets", []) or [])
    return refs


def parse_flags(args):
    """({flag: [values]}, positionals) for kubectl's and helm's command lines."""
    flags, pos = {}, []
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("-") and word != "-":
            name, eq, value = word.partition("=")
            if not eq and name in VALUE_FLAGS and i + 1 < len(args):
                value = args[i + 1]
                i += 1
            flags.setdefault(name, []).append(value if (eq or name in VALUE_FLAGS) else True)
        else:
            pos.append(word)
        i += 1
    return flags, pos


def last(flags, *names):
    values = [v for n in names for v in flags.get(n, [])]
    return values[-1] if values else None


def split_commands(text):
    """The simple commands of a logical line: words, split at && ; || | &."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in ("&&", ";", "||", "|", "&"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    # Leading VAR=value assignments are not the program.
    out = []
    for words in commands:
        first = 0
        while first < len(words) and re.match(r"^\w+=", words[first]):
            first += 1
        if words[first:]:
            out.append(words[first:])
    return out


def shell_commands(lines, first_line):
    """Logical lines of a shell block (continuations joined, `$ ` prompts and blank lines dropped)."""
    out, buf, start = [], "", None
    for offset, raw in enumerate(lines):
        line = raw.rstrip()
        if start is None:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = first_line + offset
            line = re.sub(r"^\s*\$ ", "", line)
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        out.append(Command(buf.strip(), start))
        buf, start = "", None
    if buf:
        out.append(Command(buf.strip(), start))
    return out


def read_blocks(path, text=None):
    """(marked blocks, unmarked shell blocks that run cluster commands) of a Markdown file."""
    if text is None:
        with open(path) as f:
            text = f.read()
    lines = text.splitlines()
    blocks, unmarked = [], []
    marker, marker_line = None, None
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            marker, marker_line = m.group(1), i + 1
            i += 1
            continue
        fence = FENCE.match(lines[i])
        if not fence:
            if lines[i].strip():
                marker = None
            i += 1
            continue
        lang, start = fence.group(2), i + 1
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = lines[i + 1:j]
        if lang in SHELL_LANGS:
            commands = shell_commands(body, start + 1)
            if marker is not None:
                words = marker.split()
                name = words[0] if words else ""
                given = [w.split("=", 1)[1] for w in words[1:] if w.startswith("given-crd=")]
                blocks.append(Block(path, marker_line, name, given, commands, skip=(name == "skip")))
            elif any(changes_cluster(c.text) for c in commands):
                unmarked.append((path, start))
        marker = None
        i = j + 1
    return blocks, unmarked


def changes_cluster(text):
    try:
        commands = split_commands(text)
    except ValueError:
        return False
    for argv in commands:
        _, pos = parse_flags(argv[1:])
        if argv[:1] == ["kubectl"] and pos[:1] in (["apply"], ["create"]):
            return True
        if argv[:1] == ["helm"] and pos[:1] in (["install"], ["upgrade"]):
            return True
    return False


def walk_docs(kubectl, versions, docs, texts=None):
    """Every problem in the docs' walked blocks, and one line per block walked."""
    problems, lines = [], []
    for path in docs:
        blocks, unmarked = read_blocks(path, (texts or {}).get(path))
        for upath, uline in unmarked:
            problems.append(f"{upath}:{uline}: a shell block runs kubectl apply/create or helm install but has no "
                            "<!-- deploy-walk: NAME --> marker (or <!-- deploy-walk: skip REASON -->)")
        for block in blocks:
            if block.skip:
                continue
            found = walk_block(kubectl, versions, block)
            problems += found
            if not found:
                lines.append(f"ok   {block.path}:{block.line} deploy-walk {block.name}: {len(block.commands)} steps, "
                             "every namespace, CRD, Secret and key there before it is used")
    return problems, lines


def walk_block(kubectl, versions, block):
    return Walk(kubectl, versions, block).run()


# -- self-test -------------------------------------------------------------------


class SelfTest:
    def __init__(self, kubectl, versions, docs):
        self.kubectl, self.versions = kubectl, versions
        self.blocks = {}
        for path in docs:
            for block in read_blocks(path)[0]:
                if not block.skip:
                    self.blocks[block.name] = block
        self.failures, self.passed = [], 0

    def block(self, name):
        if name not in self.blocks:
            raise KeyError(f"no deploy-walk block named {name!r} in the docs: update the self-test")
        return self.blocks[name]

    def expect(self, description, block, fragment):
        """The block must fail with a problem containing fragment (None: must pass)."""
        problems = walk_block(self.kubectl, self.versions, block)
        ok = not problems if fragment is None else any(fragment in p for p in problems)
        if ok:
            self.passed += 1
        else:
            got = "; ".join(problems) or "no problem"
            self.failures.append(f"{description}: expected {'a pass' if fragment is None else repr(fragment)}, "
                                 f"got: {got}")

    def mutate(self, name, *edits, given=None):
        """A copy of a real block with edits applied: ("drop", s), ("swap", a, b), ("replace", old, new)."""
        block = self.block(name)
        commands = [Command(c.text, c.line) for c in block.commands]

        def find(s):
            hits = [i for i, c in enumerate(commands) if s in c.text]
            if len(hits) != 1:
                raise ValueError(f"block {name}: {len(hits)} commands contain {s!r}: update the self-test")
            return hits[0]

        for edit in edits:
            if edit[0] == "drop":
                del commands[find(edit[1])]
            elif edit[0] == "swap":
                a, b = find(edit[1]), find(edit[2])
                commands[a], commands[b] = commands[b], commands[a]
            elif edit[0] == "replace":
                i = find(edit[1])
                commands[i] = Command(commands[i].text.replace(edit[1], edit[2]), commands[i].line)
        return Block(block.path, block.line, f"{name} (mutated)", block.given_crds if given is None else given,
                     commands)

    def synthetic(self, *texts, given=()):
        return Block("<self-test>", 0, "synthetic", list(given), [Command(t, i + 1) for i, t in enumerate(texts)])

    def run(self, workdir):
        ns_file = "deploy/kubernetes/base/namespace.yaml"
        secret = "create secret generic respcoord-nats"
        # The real blocks pass.
        for name in self.blocks:
            self.expect(f"{name} as documented", self.block(name), None)
        # The README's order before issue 45: the Secret before anything made its namespace.
        self.expect("nats: Secret before the namespace", self.mutate("nats", ("drop", ns_file)),
                    "namespace respcoord does not exist (created only later, by step")
        self.expect("nats: namespace step after the Secret", self.mutate("nats", ("swap", ns_file, secret)),
                    "namespace respcoord does not exist (created only later, by step")
        self.expect("nats: no Secret", self.mutate("nats", ("drop", secret)),
                    "refers to Secret respcoord/respcoord-nats, which does not exist (no step creates it)")
        self.expect("nats: the Secret after the overlay", self.mutate("nats", ("swap", secret, "overlays/nats")),
                    "refers to Secret respcoord/respcoord-nats, which does not exist (created only later")
        self.expect("nats: the secured overlay with the unsecured Secret",
                    self.mutate("nats", ("replace", "overlays/nats", "overlays/nats-secured")),
                    "needs key nats.creds of Secret respcoord/respcoord-nats")
        self.expect("nats: no NATS cluster before its rollout status",
                    self.mutate("nats", ("drop", "apply -k deploy/kubernetes/nats-cluster")),
                    "namespace nats does not exist")
        self.expect("nats-helm: without --create-namespace",
                    self.mutate("nats-helm", ("replace", "--create-namespace", "")),
                    "Helm release nats: namespace nats does not exist")
        self.expect("nats-helm: without helm repo add", self.mutate("nats-helm", ("drop", "helm repo add")),
                    "no earlier step adds the Helm repository nats")
        self.expect("nats-helm: a values file that is not there",
                    self.mutate("nats-helm", ("replace", "nats-values.yaml", "nats-valuez.yaml")),
                    "values file deploy/helm/nats-valuez.yaml: no such file")
        self.expect("nats-tls-auth: the ServiceMonitor without the operator's CRD",
                    self.mutate("nats-tls-auth", given=[]),
                    "kind ServiceMonitor (monitoring.coreos.com/v1) is not built in and no earlier step installs")
        self.expect("nats-tls-auth: no NATS TLS Secret",
                    self.mutate("nats-tls-auth", ("drop", "respcoord-nats-tls")),
                    "refers to Secret respcoord/respcoord-nats-tls, which does not exist")
        self.expect("nats-secured: the Secret made twice",
                    self.mutate("nats-secured", ("replace", ns_file, ns_file + " && kubectl -n respcoord "
                                                 "create secret generic respcoord-nats --from-literal=url=x")),
                    "already exists")
        # Synthetic: CRDs, namespaces given by -n, unknown commands, unmarked blocks.
        crd = os.path.join(workdir, "crd.yaml")
        widget = os.path.join(workdir, "widget.yaml")
        with open(crd, "w") as f:
            yaml.safe_dump({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                            "metadata": {"name": "widgets.example.com"},
                            "spec": {"group": "example.com", "scope": "Namespaced",
                                     "names": {"kind": "Widget", "plural": "widgets"},
                                     "versions": [{"name": "v1", "served": True, "storage": True}]}}, f)
        with open(widget, "w") as f:
            yaml.safe_dump({"apiVersion": "example.com/v1", "kind": "Widget",
                            "metadata": {"name": "w", "namespace": "default"}}, f)
        self.expect("a CRD, then its object", self.synthetic(f"kubectl apply -f {crd}", f"kubectl apply -f {widget}"),
                    None)
        self.expect("a CRD and its object in one apply", self.synthetic(f"kubectl apply -f {crd} -f {widget}"),
                    "kind Widget (example.com/v1) is not built in and no earlier step installs its CRD")
        self.expect("an object whose CRD nothing installs", self.synthetic(f"kubectl apply -f {widget}"),
                    "no earlier step installs its CRD")
        self.expect("an example with a ServiceMonitor on a bare cluster",
                    self.synthetic("kubectl apply -k deploy/kubernetes/examples/memory-tls-auth"),
                    "kind ServiceMonitor")
        self.expect("an object into another namespace than -n",
                    self.synthetic("kubectl -n elsewhere apply -k deploy/kubernetes/overlays/memory"),
                    "does not match -n elsewhere")
        self.expect("a namespaced file into a namespace nothing made",
                    self.synthetic("kubectl -n nats apply -f deploy/kubernetes/nats-cluster/networkpolicy.yaml"),
                    "NetworkPolicy/nats: namespace nats does not exist (no step creates it)")
        self.expect("kubectl create namespace twice",
                    self.synthetic("kubectl create namespace x", "kubectl create namespace x"), "already exists")
        self.expect("a kubectl subcommand the walker does not know",
                    self.synthetic("kubectl delete namespace respcoord"), "the walker does not know `kubectl delete")
        self.expect("rollout status of something never applied",
                    self.synthetic("kubectl -n kube-system rollout status deploy/respcoord"),
                    "no Deployment kube-system/respcoord was applied before")
        doc = os.path.join(workdir, "doc.md")
        text = "Steps:\n\n```sh\nkubectl apply -k deploy/kubernetes/overlays/memory\n```\n"
        problems, _ = walk_docs(self.kubectl, self.versions, [doc], {doc: text})
        if any("has no <!-- deploy-walk: NAME --> marker" in p for p in problems):
            self.passed += 1
        else:
            self.failures.append(f"an unmarked block with kubectl apply: expected a failure, got: {problems}")
        return self.failures


def main(argv):
    self_test = "--self-test" in argv
    args = [a for a in argv[1:] if a != "--self-test"]
    kubectl, versions, docs = args[0], tuple(args[1].split(",")), args[2:]
    problems, lines = walk_docs(kubectl, versions, docs)
    for line in lines:
        print(line)
    if problems:
        print("FAIL the documented Kubernetes steps, walked in order:")
        for p in problems:
            print(f"  - {p}")
        return 1
    if self_test:
        with tempfile.TemporaryDirectory() as workdir:
            test = SelfTest(kubectl, versions, docs)
            try:
                failures = test.run(workdir)
            except (KeyError, ValueError) as e:
                failures = [str(e)]
        if failures:
            print("FAIL deploy/check_sequence.py --self-test: the walker let a broken sequence through:")
            for f in failures:
                print(f"  - {f}")
            return 1
        print(f"ok   deploy/check_sequence.py --self-test: {test.passed} cases, every broken sequence "
              "rejected for its reason and every documented one passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
