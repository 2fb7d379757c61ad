#!/usr/bin/env python3
"""Checks the deployment files under deploy/ against the binaries they start.

Contract: every YAML file under deploy/ must parse (Kubernetes files may hold several
documents). Then, so that manifests cannot drift from the code:

  * Kubernetes (deploy/k8s, one unit per directory): every container that runs llm-scheduler
    or llm-worker passes only flags that the binary's `--help` lists, written --flag=value;
    gives --port explicitly; its containerPorts are exactly the ports it listens on (--port,
    and the scheduler's --rendezvous-port, which must be fixed); its startup, readiness and
    liveness probes exist and probe --port (readiness through gRPC health); it sets resource
    requests and limits. Every Service selects some pods and its targetPorts name their
    containerPorts. The worker StatefulSet's replicas equal the scheduler's
    --tensor-parallel-size and the number of its --worker-addresses, which list the
    StatefulSet's pod DNS names (<sts>-<rank>.<headless service>:<worker --port>) in rank
    order; each worker's --peer-host is its own pod DNS name ($(POD_NAME).<service>, POD_NAME
    from the downward API); --rendezvous-host (which the scheduler binds) is its pod IP
    ($(POD_IP) from the downward API) or a headless Service that selects it, exposes
    --rendezvous-port and publishes not-ready addresses; --model lies on a read-only volume
    mounted at the same path, from the same claim, in the scheduler and every worker; a
    NetworkPolicy guards the workers; kustomization.yaml lists every manifest of its
    directory.
  * Local cluster manifests (deploy/local, read by llm-cluster): each key k of `engine` is the
    llm-scheduler flag --k (underscores become dashes) and each key of `worker` an llm-worker
    flag; the flags llm-cluster derives from the fixed keys exist too; ports are in range.
  * Dockerfiles (deploy/docker): every COPY/ADD source exists in the build context (the
    repository root) and is not excluded by .dockerignore, or, with --from=<stage>, is made
    by a RUN of that stage or copied into it from the repository; every --target built is an
    executable of the CMake project; a CMD/ENTRYPOINT running llm-scheduler or llm-worker
    passes only their flags.

Every problem is printed as `<file>: document <n> (<kind> <name>)[, container <c>]: <what>`
and the exit status is 1; 0 when all is consistent; 2 for a usage error (a binary that does
not run, PyYAML missing).

Flags come from `<binary> --help` (common/flag_parser.h prints each as a line `  --name`).
--flags-from-spec uses the flag list of the distributed-system spec instead, for trees where
the binaries are not built yet.

--self-test proves that drift is caught: it checks tests/deploy/testdata/broken (a unit with
deliberate drift; each line of its EXPECTED file must appear among the problems), and then
applies mutations to the real manifests in memory (a misspelled flag, replicas off by one, a
wrong port, ...), each of which must produce its problem, naming the file and the flag.
"""

import argparse
import copy
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # pragma: no cover
    print("check_manifests: PyYAML is missing: install python3-yaml (`make deps`)",
          file=sys.stderr)
    sys.exit(2)

SCHEDULER = "llm-scheduler"
WORKER = "llm-worker"
BINARIES = (SCHEDULER, WORKER)

# The distributed-system spec's flags (used with --flags-from-spec only).
SPEC_FLAGS = {
    SCHEDULER: """model served-model-name host port port-file worker-addresses
        tensor-parallel-size device dtype block-size max-num-seqs max-num-batched-tokens
        max-model-len gpu-memory-utilization swap-space cpu-kv-cache-space
        num-gpu-blocks-override watermark enable-prefix-caching enable-chunked-prefill
        long-prefill-token-threshold preemption-mode scheduling-policy max-concurrent-requests
        max-logprobs max-n rendezvous-host rendezvous-port worker-timeout
        collective-timeout""".split(),
    WORKER: "host port port-file peer-host device threads".split(),
}

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
FLAG_LINE = re.compile(r"^ {0,4}--([A-Za-z0-9][A-Za-z0-9_-]*)")


# ---- flags ---------------------------------------------------------------------------------

def flags_from_help(binary):
    """The flag names `binary --help` lists; exits 2 when the binary does not run."""
    try:
        proc = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"check_manifests: cannot run `{binary} --help`: {e}", file=sys.stderr)
        sys.exit(2)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        print(f"check_manifests: `{binary} --help` exited {proc.returncode}:\n{out}",
              file=sys.stderr)
        sys.exit(2)
    flags = {m.group(1) for line in out.splitlines() for m in [FLAG_LINE.match(line)] if m}
    if "port" not in flags:
        print(f"check_manifests: `{binary} --help` lists no --port; is it {binary}?\n{out}",
              file=sys.stderr)
        sys.exit(2)
    return flags | {"help"}


def parse_invocation(tokens):
    """(binary, [(flag, value|None, token)], [bad tokens]) for the first llm-* binary in
    `tokens` (a container's command + args, or a Dockerfile CMD), or None."""
    flat = []
    for t in tokens:
        t = str(t)
        if any(c.isspace() for c in t) and any(b in t for b in BINARIES):
            flat.extend(shlex.split(t))  # sh -c "exec llm-worker ..."
        else:
            flat.append(t)
    for i, t in enumerate(flat):
        base = os.path.basename(t)
        if base in BINARIES:
            flags, bad = [], []
            for tok in flat[i + 1:]:
                if tok in ("&&", ";", "|"):
                    break
                if not tok.startswith("--"):
                    bad.append(tok)
                    continue
                name, eq, value = tok[2:].partition("=")
                flags.append((name, value if eq else None, tok))
            return base, flags, bad
    return None


def flag_dict(flags):
    return {name: value for name, value, _ in flags}


def as_int(value):
    try:
        return int(str(value), 10)
    except (TypeError, ValueError):
        return None


# ---- problems ------------------------------------------------------------------------------

class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, message):
        self.items.append(f"{where}: {message}")


class Doc:
    """One YAML document of one file."""

    def __init__(self, path, rel, index, obj):
        self.path, self.rel, self.index, self.obj = path, rel, index, obj

    @property
    def kind(self):
        return self.obj.get("kind", "?") if isinstance(self.obj, dict) else "?"

    @property
    def name(self):
        if not isinstance(self.obj, dict):
            return "?"
        return (self.obj.get("metadata") or {}).get("name", "?")

    def where(self, container=None):
        w = f"{self.rel}: document {self.index} ({self.kind} {self.name})"
        return w + (f", container {container}" if container else "")


def load_yaml_file(path, rel, problems):
    try:
        with open(path, encoding="utf-8") as f:
            objs = list(yaml.safe_load_all(f))
    except yaml.YAMLError as e:
        problems.add(rel, f"does not parse as YAML: {e}")
        return []
    return [Doc(path, rel, i + 1, o) for i, o in enumerate(objs) if o is not None]


# ---- Kubernetes ----------------------------------------------------------------------------

def pod_template(doc):
    """(labels, pod spec) of a workload document, or None."""
    o = doc.obj
    if not isinstance(o, dict) or o.get("kind") not in WORKLOAD_KINDS:
        return None
    if o["kind"] == "Pod":
        return (o.get("metadata") or {}).get("labels") or {}, o.get("spec") or {}
    tmpl = (o.get("spec") or {}).get("template") or {}
    return (tmpl.get("metadata") or {}).get("labels") or {}, tmpl.get("spec") or {}


class Container:
    def __init__(self, doc, labels, pod_spec, c, inv):
        self.doc, self.labels, self.pod_spec, self.c = doc, labels, pod_spec, c
        self.binary, self.flags, self.bad_tokens = inv
        self.flag = flag_dict(self.flags)
        self.name = c.get("name", "?")

    def where(self):
        return self.doc.where(self.name)

    def ports(self):
        return [(p.get("name"), p.get("containerPort")) for p in self.c.get("ports") or []]

    def resolve_port(self, port):
        if isinstance(port, str) and as_int(port) is None:
            for name, number in self.ports():
                if name == port:
                    return number
            return None
        return as_int(port)


def llm_containers(docs):
    out = []
    for doc in docs:
        t = pod_template(doc)
        if t is None:
            continue
        labels, spec = t
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            inv = parse_invocation(list(c.get("command") or []) + list(c.get("args") or []))
            if inv:
                out.append(Container(doc, labels, spec, c, inv))
    return out


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_flags_known(where, binary, flags, bad_tokens, known, problems):
    for tok in bad_tokens:
        problems.add(where, f"{binary} takes only --flag=value arguments; got {tok!r}")
    for name, _, tok in flags:
        if name not in known[binary]:
            problems.add(where, f"--{name} is not a flag of {binary} (from {tok!r}; "
                                f"`{binary} --help` lists {len(known[binary])} flags)")


def check_container(ct, known, problems):
    where = ct.where()
    check_flags_known(where, ct.binary, ct.flags, ct.bad_tokens, known, problems)
    port = as_int(ct.flag.get("port"))
    if port is None:
        problems.add(where, f"--port must be given explicitly as a number (got "
                            f"{ct.flag.get('port')!r}) so that its ports can be checked")
        return
    listening = {port: "--port"}
    if ct.binary == SCHEDULER:
        rport = as_int(ct.flag.get("rendezvous-port"))
        if not rport:
            problems.add(where, "--rendezvous-port must be a fixed port (not 0 or absent): the "
                                "workers connect to it, and the containerPort and the "
                                "NetworkPolicy name it")
        else:
            listening[rport] = "--rendezvous-port"
    numbers = [n for _, n in ct.ports()]
    for name, number in ct.ports():
        if number not in listening:
            problems.add(where, f"containerPort {number} ({name}) is not a port {ct.binary} "
                                f"listens on (" + ", ".join(
                                    f"{f}={p}" for p, f in listening.items()) + ")")
    for p, f in listening.items():
        if p not in numbers:
            problems.add(where, f"{f}={p} has no containerPort")
    for probe_name in PROBES:
        probe = ct.c.get(probe_name)
        if not probe:
            problems.add(where, f"{probe_name} is missing")
            continue
        handler = next((h for h in ("grpc", "tcpSocket", "httpGet", "exec") if h in probe), None)
        if handler in (None, "exec"):
            problems.add(where, f"{probe_name} must probe --port (grpc or tcpSocket), "
                                f"has {handler}")
            continue
        if probe_name == "readinessProbe" and handler != "grpc":
            problems.add(where, "readinessProbe must use gRPC health (grpc: port:)")
        pport = ct.resolve_port(probe[handler].get("port"))
        if pport != port:
            problems.add(where, f"{probe_name} probes port {probe[handler].get('port')!r}, "
                                f"but --port={port}")
    res = ct.c.get("resources") or {}
    for section in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in (res.get(section) or {}):
                problems.add(where, f"resources.{section}.{r} is not set")


def check_services(services, containers_by_doc, problems):
    for svc in services:
        spec = svc.obj.get("spec") or {}
        selector = spec.get("selector") or {}
        selected = [cts for doc, cts in containers_by_doc
                    if selects(selector, (pod_template(doc) or ({}, {}))[0])]
        if not selected:
            problems.add(svc.where(), f"selector {selector} matches no workload in this "
                                      f"directory")
            continue
        cts = [ct for group in selected for ct in group]
        all_ports = [(n, p) for ct in cts for n, p in ct.ports()]
        if not cts:
            continue
        for sp in spec.get("ports") or []:
            target = sp.get("targetPort", sp.get("port"))
            ok = any(n == target for n, _ in all_ports) if as_int(target) is None \
                else any(p == as_int(target) for _, p in all_ports)
            if not ok:
                problems.add(svc.where(), f"port {sp.get('name', sp.get('port'))}: targetPort "
                                          f"{target!r} matches no containerPort of the pods it "
                                          f"selects ({all_ports})")


def env_field(ct, var):
    for e in ct.c.get("env") or []:
        if e.get("name") == var:
            return ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    return None


def model_mount(ct, path):
    """(mountPath, claimName, readOnly) of the volume holding `path`, or None."""
    best = None
    for m in ct.c.get("volumeMounts") or []:
        mp = m.get("mountPath", "").rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best.get("mountPath", "")):
                best = m
    if best is None:
        return None
    claim = None
    for v in ct.pod_spec.get("volumes") or []:
        if v.get("name") == best.get("name"):
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
    return best.get("mountPath", "").rstrip("/"), claim, bool(best.get("readOnly"))


def check_group(docs, containers, problems):
    """The scheduler <-> workers wiring of one directory."""
    schedulers = [ct for ct in containers if ct.binary == SCHEDULER]
    workers = [ct for ct in containers if ct.binary == WORKER]
    services = {d.name: d for d in docs if d.kind == "Service"}
    for sch in schedulers:
        w = sch.where()
        tp_text = sch.flag.get("tensor-parallel-size", "1")
        tp = as_int(tp_text)
        addrs = [a for a in (sch.flag.get("worker-addresses") or "").split(",") if a]
        if tp is None:
            problems.add(w, f"--tensor-parallel-size={tp_text!r} is not a number")
            continue
        if len(addrs) != tp:
            problems.add(w, f"--worker-addresses lists {len(addrs)} workers but "
                            f"--tensor-parallel-size={tp}")
        sts_workers = [ct for ct in workers if ct.doc.kind == "StatefulSet"]
        if not sts_workers:
            problems.add(w, "no StatefulSet in this directory runs llm-worker")
        replicas = 0
        for wk in sts_workers:
            replicas += as_int((wk.doc.obj.get("spec") or {}).get("replicas", 1)) or 0
        if sts_workers and replicas != tp:
            problems.add(sts_workers[0].doc.where(),
                         f"replicas is {replicas} but the scheduler "
                         f"({sch.doc.rel}) has --tensor-parallel-size={tp}")
        # Rank r of a StatefulSet is <sts>-<r>.<serviceName>.
        expected = []
        for wk in sts_workers:
            spec = wk.doc.obj.get("spec") or {}
            svc_name = spec.get("serviceName")
            port = wk.flag.get("port")
            for r in range(as_int(spec.get("replicas", 1)) or 0):
                expected.append((f"{wk.doc.name}-{r}.{svc_name}", port))
        for rank, addr in enumerate(addrs):
            host, _, port = addr.rpartition(":")
            if rank >= len(expected):
                problems.add(w, f"--worker-addresses rank {rank} ({addr}) has no worker pod")
                continue
            eh, ep = expected[rank]
            if not (host == eh or host.startswith(eh + ".")) or port != str(ep):
                problems.add(w, f"--worker-addresses rank {rank} is {addr}, expected "
                                f"{eh}:{ep} (the StatefulSet pod of that rank and its --port)")
        # Rendezvous: the scheduler binds its store to --rendezvous-host and sends that
        # address to the workers, so it must be the pod's own IP or a name that resolves to
        # it: a headless Service that publishes not-ready addresses.
        rhost_full = sch.flag.get("rendezvous-host") or ""
        rport = as_int(sch.flag.get("rendezvous-port"))
        rsvc = services.get(rhost_full.split(".")[0])
        if rhost_full == "$(POD_IP)":
            if env_field(sch, "POD_IP") != "status.podIP":
                problems.add(w, "--rendezvous-host uses $(POD_IP) but env POD_IP is not the "
                                "downward API's status.podIP")
        elif rsvc is None:
            problems.add(w, f"--rendezvous-host={rhost_full!r} must be $(POD_IP) or name a "
                            f"headless Service of this directory that selects the scheduler "
                            f"(the scheduler binds it and the workers connect to it)")
        else:
            spec = rsvc.obj.get("spec") or {}
            if not selects(spec.get("selector") or {}, sch.labels):
                problems.add(rsvc.where(), "--rendezvous-host names this Service, but it does "
                                           "not select the scheduler's pods")
            if spec.get("clusterIP") != "None":
                problems.add(rsvc.where(), "--rendezvous-host names this Service, so it must be "
                                           "headless (clusterIP: None): the scheduler binds the "
                                           "address its name resolves to")
            if not any(sch.resolve_port(p.get("targetPort", p.get("port"))) == rport
                       for p in spec.get("ports") or []):
                problems.add(rsvc.where(), f"exposes no port with targetPort --rendezvous-port="
                                           f"{rport}")
            if not spec.get("publishNotReadyAddresses"):
                problems.add(rsvc.where(), "must set publishNotReadyAddresses: the scheduler is "
                                           "not Ready before the workers have joined the "
                                           "rendezvous")
        # The model: one read-only volume, same path and claim everywhere.
        model = (sch.flag.get("model") or "").rstrip("/")
        smount = model_mount(sch, model) if model else None
        if not model:
            problems.add(w, "--model is not given")
        elif smount is None:
            problems.add(w, f"--model={model} is on no volumeMount")
        else:
            if not smount[2]:
                problems.add(w, f"the volume holding --model={model} is not mounted readOnly")
            for wk in workers:
                wm = model_mount(wk, model)
                if wm is None or wm[0] != smount[0] or wm[1] != smount[1]:
                    problems.add(wk.where(), f"must mount claim {smount[1]} at {smount[0]} like "
                                             f"the scheduler (its --model={model} is sent to "
                                             f"the workers), has {wm}")
                elif not wm[2]:
                    problems.add(wk.where(), f"the model volume at {wm[0]} is not readOnly")
    for wk in workers:
        if wk.doc.kind != "StatefulSet":
            continue
        svc_name = (wk.doc.obj.get("spec") or {}).get("serviceName")
        svc = services.get(svc_name)
        if svc is None:
            problems.add(wk.doc.where(), f"serviceName {svc_name!r} is no Service in this "
                                         f"directory")
        else:
            if (svc.obj.get("spec") or {}).get("clusterIP") != "None":
                problems.add(svc.where(), "the StatefulSet's governing Service must be headless "
                                          "(clusterIP: None) for per-pod DNS names")
        peer = wk.flag.get("peer-host") or ""
        if not (peer == f"$(POD_NAME).{svc_name}" or
                peer.startswith(f"$(POD_NAME).{svc_name}.")):
            problems.add(wk.where(), f"--peer-host={peer!r} must be this pod's DNS name, "
                                     f"$(POD_NAME).{svc_name}")
        elif env_field(wk, "POD_NAME") != "metadata.name":
            problems.add(wk.where(), "--peer-host uses $(POD_NAME) but env POD_NAME is not the "
                                     "downward API's metadata.name")
    if workers:
        policies = [d for d in docs if d.kind == "NetworkPolicy"]
        guarded = any(selects(((p.obj.get("spec") or {}).get("podSelector") or {})
                              .get("matchLabels") or {}, wk.labels)
                      for p in policies for wk in workers)
        if not guarded:
            problems.add(workers[0].doc.where(), "no NetworkPolicy selects the worker pods")


def check_kustomization(directory, rel_dir, yaml_files, problems):
    path = os.path.join(directory, "kustomization.yaml")
    if not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            k = yaml.safe_load(f) or {}
    except yaml.YAMLError:
        return  # reported by the parse check
    listed = k.get("resources") or []
    for r in listed:
        if not os.path.exists(os.path.join(directory, r)):
            problems.add(f"{rel_dir}/kustomization.yaml", f"resource {r} does not exist")
    for f in yaml_files:
        base = os.path.basename(f)
        if base != "kustomization.yaml" and base not in listed:
            problems.add(f"{rel_dir}/kustomization.yaml", f"{base} is not listed in resources "
                                                          f"(it would not be applied)")


def check_k8s_dir(directory, rel_dir, yaml_files, root, known, problems, docs_override=None):
    docs = []
    for f in yaml_files:
        rel = os.path.relpath(f, root)
        if docs_override is not None and rel in docs_override:
            docs.extend(docs_override[rel])
        else:
            docs.extend(load_yaml_file(f, rel, problems))
    docs = [d for d in docs if isinstance(d.obj, dict) and d.obj.get("kind") != "Kustomization"]
    containers = llm_containers(docs)
    for ct in containers:
        check_container(ct, known, problems)
    by_doc = []
    for d in docs:
        if pod_template(d) is not None:
            by_doc.append((d, [ct for ct in containers if ct.doc is d]))
    check_services([d for d in docs if d.kind == "Service"], by_doc, problems)
    check_group(docs, containers, problems)
    check_kustomization(directory, rel_dir, yaml_files, problems)
    return len(containers)


# ---- local cluster manifests ---------------------------------------------------------------

LOCAL_FIXED = {  # key -> (binary, flag) that llm-cluster passes for it
    "model": (SCHEDULER, "model"),
    "tensor_parallel_size": (SCHEDULER, "tensor-parallel-size"),
    "device": (SCHEDULER, "device"),
}


def check_local(doc, root, known, problems):
    o = doc.obj
    where = f"{doc.rel}: document {doc.index}"
    if not isinstance(o, dict):
        problems.add(where, "a cluster manifest must be a mapping")
        return
    model = o.get("model")
    # llm-cluster runs from the repository root; relative model paths are relative to it. A
    # model fetched at run time (tools/models/fetch_smollm2.sh, into build/models) is not in a
    # clean checkout: it must be a .gguf under build/models, which make run passes as --model.
    if isinstance(model, str) and model.startswith("build/models/") and model.endswith(".gguf"):
        pass
    elif not isinstance(model, str) or not os.path.isdir(os.path.join(root, model)):
        problems.add(where, f"model {model!r} is no directory of the repository")
    for key, (binary, flag) in LOCAL_FIXED.items():
        if key in o and flag not in known[binary]:
            problems.add(where, f"key {key} becomes --{flag}, which is not a flag of {binary}")
    for section, binary in (("engine", SCHEDULER), ("worker", WORKER)):
        block = o.get(section) or {}
        if not isinstance(block, dict):
            problems.add(where, f"{section} must be a mapping")
            continue
        for key in block:
            flag = str(key).replace("_", "-")
            if flag not in known[binary]:
                problems.add(where, f"{section}.{key} becomes --{flag}, which is not a flag of "
                                    f"{binary}")
    sch = o.get("scheduler") or {}
    wk = o.get("workers") or {}
    tp = as_int(o.get("tensor_parallel_size", 1)) or 1
    sport = as_int(sch.get("port", 50051))
    base = as_int(wk.get("base_port", 50061))
    if sport is None or not 0 <= sport <= 65535:
        problems.add(where, f"scheduler.port {sch.get('port')!r} is not a port")
    if base is None or not 0 <= base <= 65535 - tp + 1:
        problems.add(where, f"workers.base_port {wk.get('base_port')!r} is not a port for "
                            f"{tp} ranks")
    elif sport and base and base <= sport < base + tp:
        problems.add(where, f"scheduler.port {sport} collides with a worker port "
                            f"({base}..{base + tp - 1})")


# ---- Dockerfiles ---------------------------------------------------------------------------

def dockerfile_instructions(text):
    """[(line number, INSTRUCTION, rest)] with continuations joined and comments dropped."""
    out, buf, start = [], "", None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if start is None:
            start = n
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        instr, _, rest = buf.strip().partition(" ")
        out.append((start, instr.upper(), rest.strip()))
        buf, start = "", None
    return out


def dockerignore_patterns(root):
    path = os.path.join(root, ".dockerignore")
    if not os.path.exists(path):
        return []
    pats = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if s and not s.startswith("#"):
                neg = s.startswith("!")
                pats.append((neg, os.path.normpath(s.lstrip("!").lstrip("/"))))
    return pats


def _pattern_regex(p):
    r = ""
    i = 0
    while i < len(p):
        if p.startswith("**", i):
            r += ".*"
            i += 2
            if i < len(p) and p[i] == "/":
                r = r[:-2] + "(.*/)?"
                i += 1
        elif p[i] == "*":
            r += "[^/]*"
            i += 1
        elif p[i] == "?":
            r += "[^/]"
            i += 1
        else:
            r += re.escape(p[i])
            i += 1
    return re.compile(r + "$")


def dockerignored(rel, patterns):
    """Whether .dockerignore excludes `rel` (or a directory above it); last match wins."""
    parts = rel.split("/")
    excluded = False
    for neg, pat in patterns:
        rx = _pattern_regex(pat)
        if any(rx.match("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            excluded = not neg
    return excluded


def cmake_executables(root):
    names = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and
                       not d.startswith("build")]
        if "CMakeLists.txt" in filenames:
            with open(os.path.join(dirpath, "CMakeLists.txt"), encoding="utf-8") as f:
                names.update(re.findall(r"add_executable\(\s*([A-Za-z0-9_.+-]+)", f.read()))
    return names


def split_copy(rest):
    flags, args = {}, []
    rest = rest.strip()
    tokens = shlex.split(rest) if not rest.lstrip().startswith("[") else None
    if tokens is None:
        return flags, json.loads(rest)
    for t in tokens:
        if t.startswith("--") and not args:
            k, _, v = t[2:].partition("=")
            flags[k] = v
        else:
            args.append(t)
    return flags, args


def check_dockerfile(path, rel, root, known, executables, problems):
    with open(path, encoding="utf-8") as f:
        instrs = dockerfile_instructions(f.read())
    patterns = dockerignore_patterns(root)
    stages = []  # dicts: name, workdir, runs, copied_repo_to
    for line, instr, rest in instrs:
        where = f"{rel}: line {line} ({instr})"
        if instr == "FROM":
            m = re.search(r"\s+AS\s+(\S+)\s*$", rest, re.I)
            stages.append({"name": m.group(1) if m else str(len(stages)), "workdir": "/",
                           "runs": [], "repo_dirs": []})
            continue
        if not stages:
            continue
        st = stages[-1]
        if instr == "WORKDIR":
            st["workdir"] = os.path.normpath(os.path.join(st["workdir"], rest))
        elif instr == "RUN":
            st["runs"].append(rest)
            for target_list in re.findall(r"--target((?:\s+[A-Za-z0-9_.+-]+)+)", rest):
                for t in target_list.split():
                    if executables is not None and t not in executables:
                        problems.add(where, f"builds --target {t}, which is no add_executable "
                                            f"of the CMake project")
        elif instr in ("COPY", "ADD"):
            flags, args = split_copy(rest)
            if len(args) < 2:
                problems.add(where, f"{instr} needs a source and a destination")
                continue
            srcs, dest = args[:-1], args[-1]
            frm = flags.get("from")
            if frm is None:
                dest_abs = os.path.normpath(os.path.join(st["workdir"], dest))
                for src in srcs:
                    norm = os.path.normpath(src.lstrip("/"))
                    if norm == ".":
                        st["repo_dirs"].append((dest_abs, ""))
                        continue
                    # Where the stage now holds it: dest/<name> when dest is a directory.
                    into_dir = dest.endswith("/") or dest in (".", "./") or len(srcs) > 1
                    st["repo_dirs"].append(
                        (os.path.join(dest_abs, os.path.basename(norm)) if into_dir
                         else dest_abs, norm))
                    hits = glob.glob(os.path.join(root, norm))
                    if not hits:
                        problems.add(where, f"source {src} does not exist in the build context "
                                            f"(the repository root)")
                    elif dockerignored(norm, patterns):
                        problems.add(where, f"source {src} is excluded by .dockerignore")
                continue
            source_stage = next((s for s in stages[:-1] if s["name"] == frm), None)
            if source_stage is None:
                continue  # an external image
            for src in srcs:
                p = os.path.normpath(src)
                made = any(re.search(re.escape(p) + r"(?![A-Za-z0-9_.-])", r)
                           for r in source_stage["runs"])
                from_repo = False
                for d, repo_rel in source_stage["repo_dirs"]:
                    if p == d or p.startswith(d + "/"):
                        relp = os.path.normpath(os.path.join(repo_rel, os.path.relpath(p, d)))
                        from_repo = os.path.exists(os.path.join(root, relp)) and \
                            not dockerignored(relp, patterns)
                if not (made or from_repo):
                    problems.add(where, f"--from={frm} source {src} is made by no RUN of stage "
                                        f"{frm} and not copied into it from the repository")
        elif instr in ("CMD", "ENTRYPOINT"):
            try:
                tokens = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            except ValueError:
                problems.add(where, f"cannot parse {instr}")
                continue
            inv = parse_invocation(tokens)
            if inv:
                check_flags_known(where, inv[0], inv[1], inv[2], known, problems)
    return len(stages)


# ---- driver --------------------------------------------------------------------------------

def yaml_files_under(directory):
    out = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for f in sorted(filenames):
            if f.endswith((".yaml", ".yml")):
                out.append(os.path.join(dirpath, f))
    return out


def check_tree(root, deploy_dir, known, docs_override=None):
    """Checks everything under deploy_dir (files named relative to root). Returns (problems,
    summary)."""
    problems = Problems()
    files = yaml_files_under(deploy_dir)
    counts = {"files": len(files), "containers": 0, "local": 0, "dockerfiles": 0}
    by_dir = {}
    for f in files:
        by_dir.setdefault(os.path.dirname(f), []).append(f)
    for directory, dir_files in sorted(by_dir.items()):
        rel_dir = os.path.relpath(directory, root)
        parts = os.path.relpath(directory, deploy_dir).split(os.sep)
        if parts[0] == "local":
            for f in dir_files:
                rel = os.path.relpath(f, root)
                docs = (docs_override or {}).get(rel) or load_yaml_file(f, rel, problems)
                for d in docs:
                    check_local(d, root, known, problems)
                    counts["local"] += 1
        else:
            counts["containers"] += check_k8s_dir(directory, rel_dir, dir_files, root, known,
                                                  problems, docs_override)
    # Without built binaries (--flags-from-spec) their targets may not exist yet either.
    executables = None if known.get("from_spec") else cmake_executables(root)
    for dirpath, _, filenames in os.walk(deploy_dir):
        for f in sorted(filenames):
            if f.startswith("Dockerfile") and not f.endswith(".dockerignore"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                if docs_override and rel in docs_override:
                    path = docs_override[rel]
                check_dockerfile(path, rel, root, known, executables, problems)
                counts["dockerfiles"] += 1
    return problems, counts


# ---- self-test -----------------------------------------------------------------------------

def _find(docs_by_file, pred):
    for rel, docs in docs_by_file.items():
        for d in docs:
            if isinstance(d.obj, dict) and pred(d):
                return rel, d
    return None, None


def _runs(binary):
    def pred(d):
        t = pod_template(d)
        if t is None:
            return False
        for c in t[1].get("containers") or []:
            inv = parse_invocation(list(c.get("command") or []) + list(c.get("args") or []))
            if inv and inv[0] == binary:
                return True
        return False
    return pred


def _container(d):
    for c in pod_template(d)[1]["containers"]:
        if parse_invocation(list(c.get("command") or []) + list(c.get("args") or [])):
            return c
    raise AssertionError("no llm container")


def _replace_arg(c, flag, new):
    for key in ("args", "command"):
        lst = c.get(key) or []
        for i, a in enumerate(lst):
            if str(a).startswith(f"--{flag}=") or a == f"--{flag}":
                lst[i] = new
                return
    raise AssertionError(f"--{flag} not found")


def mutations():
    """(description, function(docs_by_file, tmpdir) -> file, expected substrings)."""
    def flag_typo(docs, _):
        rel, d = _find(docs, _runs(SCHEDULER))
        _replace_arg(_container(d), "max-num-seqs", "--max-num-seq=256")
        return rel, ["--max-num-seq is not a flag of llm-scheduler", "container llm-scheduler"]

    def worker_flag_typo(docs, _):
        rel, d = _find(docs, _runs(WORKER))
        _container(d)["args"].append("--thread=4")
        return rel, ["--thread is not a flag of llm-worker"]

    def space_separated(docs, _):
        rel, d = _find(docs, _runs(WORKER))
        _replace_arg(_container(d), "port", "--port")
        _container(d)["args"].append("50061")
        return rel, ["only --flag=value arguments; got '50061'"]

    def replicas(docs, _):
        rel, d = _find(docs, lambda d: d.kind == "StatefulSet" and _runs(WORKER)(d))
        d.obj["spec"]["replicas"] += 1
        return rel, ["replicas is", "--tensor-parallel-size="]

    def tp_size(docs, _):
        rel, d = _find(docs, _runs(SCHEDULER))
        c = _container(d)
        _replace_arg(c, "tensor-parallel-size", "--tensor-parallel-size=7")
        return rel, ["--worker-addresses lists", "--tensor-parallel-size=7"]

    def address_order(docs, _):
        rel, d = _find(docs, _runs(SCHEDULER))
        c = _container(d)
        addrs = parse_invocation(c["command"] + c["args"])
        value = flag_dict(addrs[1])["worker-addresses"].split(",")
        _replace_arg(c, "worker-addresses", "--worker-addresses=" + ",".join(value[::-1]))
        return rel, ["--worker-addresses rank 0 is"]

    def container_port(docs, _):
        rel, d = _find(docs, _runs(WORKER))
        _container(d)["ports"][0]["containerPort"] += 1
        return rel, ["is not a port llm-worker listens on", "--port=", "has no containerPort"]

    def probe_port(docs, _):
        rel, d = _find(docs, _runs(SCHEDULER))
        probe = _container(d)["readinessProbe"]
        probe["grpc"]["port"] = 50999
        return rel, ["readinessProbe probes port 50999, but --port="]

    def service_target(docs, _):
        rel, d = _find(docs, lambda d: d.kind == "Service" and d.name == "llm-worker")
        d.obj["spec"]["ports"][0]["targetPort"] = 50999
        return rel, ["targetPort 50999 matches no containerPort"]

    def peer_host(docs, _):
        rel, d = _find(docs, _runs(WORKER))
        _replace_arg(_container(d), "peer-host", "--peer-host=127.0.0.1")
        return rel, ["--peer-host='127.0.0.1' must be this pod's DNS name"]

    def rendezvous(docs, _):
        rel, d = _find(docs, _runs(SCHEDULER))
        _replace_arg(_container(d), "rendezvous-port", "--rendezvous-port=0")
        return rel, ["--rendezvous-port must be a fixed port"]

    def rendezvous_service(docs, _):
        rel, d = _find(docs, _runs(SCHEDULER))
        _replace_arg(_container(d), "rendezvous-host", "--rendezvous-host=llm-scheduler")
        return rel, ["(Service llm-scheduler): --rendezvous-host names this Service, so it must "
                     "be headless"]

    def model_path(docs, _):
        rel, d = _find(docs, _runs(WORKER))
        for m in _container(d)["volumeMounts"]:
            if m["name"] == "model":
                m["mountPath"] = "/elsewhere"
        return rel, ["must mount claim", "like the scheduler"]

    def dockerfile_copy(docs, tmp):
        rel = next(r for r in docs if os.path.basename(r) == "Dockerfile")
        with open(os.path.join(tmp.root, rel), encoding="utf-8") as f:
            text = f.read()
        text = text.replace("COPY Makefile ./", "COPY Makefile.missing ./", 1)
        text = text.replace("/out/models/ /opt/llm/models/", "/out/weights/ /opt/llm/models/")
        path = os.path.join(tmp.dir, "Dockerfile")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        docs[rel] = path
        return rel, ["source Makefile.missing does not exist in the build context",
                     "--from=build source /out/weights/ is made by no RUN"]

    def local_key(docs, _):
        rel = next((r for r in docs if "/local/" in r and docs[r]), None)
        if rel is None:
            return None, []
        d = docs[rel][0]
        d.obj.setdefault("engine", {})["max_num_seq"] = 8
        d.obj.setdefault("worker", {})["thread"] = 1
        return rel, ["engine.max_num_seq becomes --max-num-seq, which is not a flag of "
                     "llm-scheduler", "worker.thread becomes --thread"]

    return [flag_typo, worker_flag_typo, space_separated, replicas, tp_size, address_order,
            container_port, probe_port, service_target, peer_host, rendezvous,
            rendezvous_service, model_path,
            dockerfile_copy, local_key]


class _Tmp:
    def __init__(self, root, directory):
        self.root, self.dir = root, directory


def self_test(root, known):
    failures = []
    # 1. The committed broken fixture.
    broken = os.path.join(root, "tests/deploy/testdata/broken")
    problems, _ = check_tree(broken, broken, known)
    with open(os.path.join(broken, "EXPECTED"), encoding="utf-8") as f:
        expected = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#")]
    if known.get("from_spec"):
        expected = [e for e in expected if not e.startswith("[built] ")]
    expected = [e[len("[built] "):] if e.startswith("[built] ") else e for e in expected]
    text = "\n".join(problems.items)
    for e in expected:
        if e not in text:
            failures.append(f"testdata/broken: expected a problem containing {e!r}")
    print(f"self-test: testdata/broken gives {len(problems.items)} problems; "
          f"{len(expected)} expected lines checked")
    # 2. Mutations of the real tree, one at a time.
    deploy = os.path.join(root, "deploy")
    base_problems, _ = check_tree(root, deploy, known)
    if base_problems.items:
        failures.append("the real deploy/ tree is not clean, so mutations prove nothing:\n  "
                        + "\n  ".join(base_problems.items))
    originals = {}
    for f in yaml_files_under(deploy):
        rel = os.path.relpath(f, root)
        originals[rel] = load_yaml_file(f, rel, Problems())
    for dirpath, _, filenames in os.walk(deploy):
        for f in filenames:
            if f.startswith("Dockerfile"):
                originals[os.path.relpath(os.path.join(dirpath, f), root)] = \
                    os.path.join(dirpath, f)
    with tempfile.TemporaryDirectory() as tmp:
        for mutate in mutations():
            docs = copy.deepcopy(originals)
            rel, wants = mutate(docs, _Tmp(root, tmp))
            if rel is None:
                print(f"self-test: {mutate.__name__}: skipped (no such manifest yet)")
                continue
            problems, _ = check_tree(root, deploy, known, docs_override=docs)
            mine = [p for p in problems.items if p.startswith(rel)]
            missing = [w for w in wants if not any(w in p for p in mine)]
            if missing:
                failures.append(f"mutation {mutate.__name__} of {rel}: no problem naming the "
                                f"file contains {missing}; got:\n  " + "\n  ".join(
                                    problems.items))
            else:
                print(f"self-test: {mutate.__name__}: caught: {mine[0]}")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "../.."),
                    help="repository root")
    ap.add_argument("--scheduler", help="path to the built llm-scheduler")
    ap.add_argument("--worker", help="path to the built llm-worker")
    ap.add_argument("--flags-from-spec", action="store_true",
                    help="use the spec's flag lists instead of running the binaries")
    ap.add_argument("--self-test", action="store_true",
                    help="prove that drift is caught (testdata/broken and mutations)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    if args.flags_from_spec:
        known = {b: set(f) | {"help"} for b, f in SPEC_FLAGS.items()}
        known["from_spec"] = True
        source = "the spec's flag lists (binaries not built)"
    else:
        if not args.scheduler or not args.worker:
            ap.error("give --scheduler and --worker (or --flags-from-spec)")
        known = {SCHEDULER: flags_from_help(args.scheduler), WORKER: flags_from_help(args.worker)}
        source = f"`{args.scheduler} --help` and `{args.worker} --help`"
    print(f"flags from {source}: {SCHEDULER} {len(known[SCHEDULER])}, "
          f"{WORKER} {len(known[WORKER])}")
    if args.self_test:
        failures = self_test(root, known)
        for f in failures:
            print(f"SELF-TEST FAILURE: {f}")
        print("self-test: " + ("FAILED" if failures else "every drift was caught"))
        return 1 if failures else 0
    problems, counts = check_tree(root, os.path.join(root, "deploy"), known)
    for p in problems.items:
        print(p)
    print(f"checked {counts['files']} YAML files ({counts['containers']} llm containers, "
          f"{counts['local']} local manifests) and {counts['dockerfiles']} Dockerfiles: "
          f"{len(problems.items)} problems")
    return 1 if problems.items else 0


if __name__ == "__main__":
    sys.exit(main())
