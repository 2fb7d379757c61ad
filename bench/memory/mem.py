"""bench/memory's helpers (run.sh calls them with SCRATCH/venv's python; not run by CI).

    mem.py model-info PATH            JSON: format, parameters, file bytes, torch dtype and the
                                      KV shape (layers, kv heads, head_dim) of an HF directory
                                      (config.json + safetensors headers) or a GGUF file
    mem.py snapshot SYSTEM PID        JSON: the resident memory of PID's process tree, by role
    mem.py watch SYSTEM PID OUT       samples the tree every --interval s (0.2) until SIGTERM,
                                      then writes each role's peak and the peak of the sum to OUT
    mem.py machine                    JSON: CPU model name and its avx2 / avx512* / amx flags
    mem.py ctx PATH KV_GIB NP         llama-server's -c for at most KV_GIB of f16 cache over NP
                                      slots, and that cache's bytes: tokens of layers x 2 x
                                      kv_heads x head_dim x 2 bytes each; llama.cpp pads each
                                      slot's context up to a multiple of 256 tokens, so -c is
                                      rounded down to a multiple of NP x 256
    mem.py cell OUT KEY=VALUE...      writes a JSON object (VALUE as JSON where it parses)
    mem.py report CELLS_DIR JSONL     the table of a run (CELLS_DIR/<model>.<system>/), and one
                                      JSON line per cell appended to JSONL

Roles: ours: llm-cluster's children llm-worker ("worker") and llm-scheduler ("scheduler"), and
llm-cluster itself ("cluster"); vllm: the `vllm serve` process ("api"), the process titled
VLLM::EngineCore ("engine"), the one with Worker in its title under it ("worker": vLLM 0.32's
multiprocessing executor, which holds the weights and the KV cache) and any other descendant
("other", e.g. multiprocessing's resource tracker); llamacpp: llama-server ("server"). Per process: VmRSS, RssAnon, RssFile, RssShmem and VmHWM from
/proc/PID/status. A role with several processes sums them.
"""
import glob
import json
import os
import re
import signal
import struct
import sys
import time

MIB = 2**20
GIB = 2**30
MB = 10**6
STATUS_KEYS = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem",
               "VmHWM": "hwm"}


# --- processes --------------------------------------------------------------------------------
def read_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key in STATUS_KEYS:
                    out[STATUS_KEYS[key]] = int(val.split()[0]) * 1024
    except OSError:
        return None
    return out if "rss" in out else None


def proc_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None, None
    return comm, cmd


def tree(root):
    """root and every descendant, from /proc/*/stat's parent ids."""
    parent = {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(path) as f:
                data = f.read()
        except OSError:
            continue
        # comm may contain spaces and parentheses: the fields after the last ')'.
        rest = data[data.rindex(")") + 2:].split()
        parent[int(path.split("/")[2])] = int(rest[1])
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [c for c, p in parent.items() if p == pid]
    return out


def role(system, root, pid):
    comm, cmd = proc_name(pid)
    if comm is None:
        return None
    if system == "ours":
        if comm.startswith("llm-worker"):
            return "worker"
        if comm.startswith("llm-scheduler"):
            return "scheduler"
        return "cluster" if pid == root else "other"
    if system == "vllm":
        if pid == root:
            return "api"
        if "EngineCore" in comm or "EngineCore" in cmd:
            return "engine"
        return "worker" if "Worker" in comm or "Worker" in cmd else "other"
    return "server" if pid == root else "other"


def sample(system, root):
    roles = {}
    for pid in tree(root):
        r = role(system, root, pid)
        st = read_status(pid) if r else None
        if st is None:
            continue
        acc = roles.setdefault(r, {"pids": []})
        acc["pids"].append(pid)
        for k, v in st.items():
            acc[k] = acc.get(k, 0) + v
    return {"roles": roles, "total": sum(r["rss"] for r in roles.values()), "samples": 1,
            "time": time.time()}


def watch(system, root, out, interval):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    peak = {"roles": {}, "total": 0, "samples": 0}
    last = None
    while not stop:
        s = sample(system, root)
        if s["roles"]:
            last = s
            peak["samples"] += 1
            peak["total"] = max(peak["total"], s["total"])
            for name, r in s["roles"].items():
                if r["rss"] > peak["roles"].get(name, {}).get("rss", -1):
                    peak["roles"][name] = dict(r)
        time.sleep(interval)
    if last:  # the kernel's own high-water marks, as they are at the end
        for name, r in last["roles"].items():
            if name in peak["roles"]:
                peak["roles"][name]["hwm"] = r.get("hwm")
    peak["time"] = time.time()
    with open(out, "w") as f:
        json.dump(peak, f)


# --- models -----------------------------------------------------------------------------------
def safetensors_params(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    params = 0
    for name, t in header.items():
        if name != "__metadata__":
            count = 1
            for d in t["shape"]:
                count *= d
            params += count
    return params


def model_info(path):
    if os.path.isdir(path):
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        heads = cfg["num_attention_heads"]
        return {
            "format": "hf",
            "architecture": cfg.get("architectures", ["?"])[0],
            "params": sum(safetensors_params(p) for p in files),
            "file_bytes": sum(os.path.getsize(p) for p in files),
            "torch_dtype": cfg.get("dtype") or cfg.get("torch_dtype") or "float32",
            "layers": cfg["num_hidden_layers"],
            "kv_heads": cfg.get("num_key_value_heads", heads),
            "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
            "vocab": cfg["vocab_size"],
        }
    from gguf import GGUFReader  # SCRATCH/venv has it (bench/peers/setup.sh)

    r = GGUFReader(path)

    def field(key):
        f = r.fields.get(key)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        return v.tobytes().decode() if f.types and f.types[0].name == "STRING" else v[0].item()

    arch = field("general.architecture")
    heads = field(f"{arch}.attention.head_count")
    kv = field(f"{arch}.attention.head_count_kv") or heads
    hd = field(f"{arch}.attention.key_length") or field(f"{arch}.embedding_length") // heads
    vocab = field(f"{arch}.vocab_size")
    if vocab is None:
        tok = r.fields.get("tokenizer.ggml.tokens")
        vocab = len(tok.data) if tok else None
    types = sorted({t.tensor_type.name for t in r.tensors})
    return {
        "format": "gguf",
        "architecture": arch,
        "params": sum(int(t.n_elements) for t in r.tensors),
        "file_bytes": os.path.getsize(path),
        "torch_dtype": "gguf:" + "+".join(types),
        "layers": field(f"{arch}.block_count"),
        "kv_heads": kv,
        "head_dim": hd,
        "vocab": vocab,
    }


def machine():
    name, flags = "?", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k.strip() == "model name" and name == "?":
                name = v.strip()
            if k.strip() == "flags" and not flags:
                flags = v.split()
    keep = sorted(f for f in flags if f == "avx2" or f.startswith("avx512") or f.startswith("amx"))
    return {"cpu": name, "flags": keep, "cores": os.cpu_count(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1)}


# --- our worker's stats -----------------------------------------------------------------------
def flatten(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else k)
    elif not isinstance(obj, list):
        yield prefix, obj


def stats_memory(text):
    """(fields, note): the memory-looking fields of `llm-client --json=true stats`'s output."""
    if not text.strip():
        return {}, "no stats output"
    try:
        obj = json.loads(text)
    except ValueError:
        m = re.search(r"\{.*\}", text, re.S)
        try:
            obj = json.loads(m.group(0)) if m else None
        except ValueError:
            obj = None
    if not isinstance(obj, dict):
        return {}, "stats printed no JSON (llm-client --json=true stats gave text)"
    scope = obj.get("worker", obj) if isinstance(obj.get("worker"), dict) else obj
    fields = {k: v for k, v in flatten(scope)
              if re.search(r"bytes|mem|rss", k, re.I) and isinstance(v, (int, float, str))}
    if not fields:
        return {}, "stats JSON has no memory fields (keys with bytes/mem/rss)"
    return fields, "from stats"


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def pick(fields, *patterns):
    for k, v in fields.items():
        if all(re.search(p, k, re.I) for p in patterns) and num(v) is not None:
            return k, num(v)
    return None, None


# --- the report -------------------------------------------------------------------------------
def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mib(b):
    return "—" if b is None else f"{b / MIB:.0f}"


def main_rss(system, phase):
    """The process that holds the weights and the KV cache: our worker, vLLM's worker (its
    engine core where it has none), llama-server."""
    if not phase:
        return None
    if system == "vllm":
        return phase["roles"].get("worker") or phase["roles"].get("engine")
    return phase["roles"].get({"ours": "worker", "llamacpp": "server"}[system])


def report(cells_dir, jsonl):
    run = load_json(os.path.join(cells_dir, "run.json")) or {}
    rows = []
    order = {s: i for i, s in enumerate(["ours", "vllm", "llamacpp"])}
    models = run.get("models", "").split()
    def key(d):
        model, _, system = os.path.basename(d.rstrip("/")).rpartition(".")
        return (models.index(model) if model in models else len(models), model,
                order.get(system, 9))
    for d in sorted(glob.glob(os.path.join(cells_dir, "*", "")), key=key):
        cell = load_json(os.path.join(d, "cell.json"))
        if not cell:
            continue
        for phase in ("idle", "loaded", "after"):
            ph = load_json(os.path.join(d, f"{phase}.json"))
            cell[phase] = ph if ph and ph.get("roles") else None  # None: the server was gone
        cell["load"] = load_json(os.path.join(d, "load.json"))
        if cell["system"] == "ours":
            try:
                with open(os.path.join(d, "stats.txt")) as f:
                    text = f.read()
            except OSError:
                text = ""
            cell["stats_memory"], cell["stats_note"] = stats_memory(text)
        rows.append(cell)
    m = run.get("machine", {})
    print(f"\nbench/memory: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
          f"{m.get('mem_gib', '?')} GiB; flags {' '.join(m.get('flags', [])) or 'none of avx2/avx512/amx'}")
    print(f"ours: /work/main at {run.get('commit', '?')} (binaries copied {run.get('bin_time', '?')});"
          f" {run.get('date', '?')}; KV budget {run.get('kv_gib')} GiB; load: "
          f"{run.get('load', '?')}")
    print("RSS in MiB (VmRSS). idle: after the server is up and one small request, then 5 s "
          "quiet; loaded: peak of 0.2 s samples during the load; after: 5 s after it.")
    print("main: the process holding weights and KV (our worker / vLLM's worker / llama-server); "
          "total: the whole process tree\n(ours: worker + scheduler + llm-cluster; vLLM: API "
          "server + engine core + worker + others); weights: computed (see below).\n")
    head = ["model", "system", "dtype", "weights", "main idle", "main loaded", "main after",
            "anon/file loaded", "total idle", "total loaded", "total after", "load", "split loaded"]
    table = [head]
    for c in rows:
        if c.get("skipped"):
            table.append([c["model"], c["system"], "—", "—", "skipped: " + c["skipped"]]
                         + [""] * (len(head) - 5))
            continue
        mains = [main_rss(c["system"], c.get(p)) for p in ("idle", "loaded", "after")]
        split = ""
        lp = c.get("loaded")
        if lp:
            split = " + ".join(f"{n} {mib(r['rss'])}" for n, r in sorted(lp["roles"].items()))
        table.append([
            c["model"], c["system"], c.get("dtype", "?"), mib(c.get("weight_bytes")),
            *[mib(x["rss"]) if x else "—" for x in mains],
            f"{mib(mains[1]['anon'])}/{mib(mains[1]['file'])}" if mains[1] else "—",
            *[mib(c[p]["total"]) if c.get(p) else "—" for p in ("idle", "loaded", "after")],
            f"{c['load']['duration_s']:.0f} s" if c.get("load") else "failed",
            split,
        ])
    widths = [max(len(str(r[i])) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    # Ours against the bound and against vLLM, per model.
    for c in rows:
        c["verdict"] = None
    by_model = {}
    for c in rows:
        by_model.setdefault(c["model"], {})[c["system"]] = c
    for model, cells in by_model.items():
        o = cells.get("ours")
        if not o or o.get("skipped"):
            continue
        fields = o.get("stats_memory") or {}
        # llm.v1.WorkerStats.memory (llm-client --json=true stats, protobuf field names).
        wk, wv = pick(fields, r"^memory\.weights$")
        tk, tv = pick(fields, r"^memory\.kv_cache_resident$")
        rk, rv = pick(fields, r"^memory\.kv_cache_reserved$")
        weights = wv if wv is not None else o.get("weight_bytes")
        wsrc = (f"stats {wk}" if wv is not None else
                f"computed: {o.get('params', 0) / 1e6:.1f} M parameters x {o.get('dtype_bytes')} "
                f"bytes ({o.get('dtype')})")
        kv = tv if tv is not None else o["kv_bytes"]
        ksrc = (f"stats {tk}" if tv is not None else
                f"the configured {o['kv_bytes'] / GIB:g} GiB (stats report no KV resident)")
        bound = 1.1 * (weights + kv) + 100 * MB
        print(f"{model}: ours' bound 1.1 x (weights {weights / MIB:.0f} MiB [{wsrc}] + KV "
              f"{kv / MIB:.0f} MiB [{ksrc}]) + 100 MB = {bound / MIB:.0f} MiB")
        if fields:
            print(f"  worker stats: " + ", ".join(f"{k}={v}" for k, v in fields.items()))
        else:
            print(f"  worker stats: {o.get('stats_note')}")
        verdict = {"bound_bytes": bound, "weights_bytes": weights, "weights_source": wsrc,
                   "kv_bytes": kv, "kv_source": ksrc, "kv_reserved_stats": rv}
        for p in ("idle", "loaded", "after"):
            w = main_rss("ours", o.get(p))
            if not w:
                continue
            ok = w["rss"] <= bound
            verdict[f"{p}_within_bound"] = ok
            line = (f"  {p}: worker {w['rss'] / MIB:.0f} MiB {'<=' if ok else '>'} bound "
                    f"({w['rss'] / bound:.2f}x)")
            v = cells.get("vllm")
            if v and not v.get("skipped") and v.get(p):
                ve = main_rss("vllm", v[p])
                vt = v[p]["total"]
                line += (f"; vs vLLM ({v.get('dtype')}): worker {w['rss'] / MIB:.0f} vs its "
                         f"worker {mib(ve['rss'] if ve else None)} "
                         f"({'not above' if ve and w['rss'] <= ve['rss'] else 'ABOVE'}), total "
                         f"{o[p]['total'] / MIB:.0f} vs {vt / MIB:.0f} MiB "
                         f"({'not above' if o[p]['total'] <= vt else 'ABOVE'})")
                verdict[f"{p}_worker_not_above_vllm_worker"] = bool(ve and w["rss"] <= ve["rss"])
                verdict[f"{p}_total_not_above_vllm"] = o[p]["total"] <= vt
            print(line)
        o["verdict"] = verdict
    for c in rows:
        if c.get("kv_log"):
            what = f"llama-server -c {c.get('ctx')}" if c["system"] == "llamacpp" else c["system"]
            print(f"{c['model']}: {what}: {c['kv_log']}")
        if c.get("system") == "llamacpp" and c.get("ctx") and not c.get("skipped"):
            print(f"{c['model']}: llama-server -c {c['ctx']} -np 32: f16 KV cache "
                  f"{c['kv_bytes'] / MIB:.0f} MiB (budget {run.get('kv_gib')} GiB; -c rounded "
                  "down to a multiple of 32 x 256 tokens, as llama.cpp pads each slot to 256)")
        if c.get("load_ok") is False:
            print(f"{c['model']}: {c['system']}: the load failed (loaded/after are partial)")
    with open(jsonl, "a") as f:
        for c in rows:
            f.write(json.dumps({**{k: v for k, v in run.items()}, **c}) + "\n")


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "model-info":
        print(json.dumps(model_info(sys.argv[2])))
    elif cmd == "snapshot":
        print(json.dumps(sample(sys.argv[2], int(sys.argv[3]))))
    elif cmd == "watch":
        interval = 0.2
        if "--interval" in sys.argv:
            interval = float(sys.argv[sys.argv.index("--interval") + 1])
        watch(sys.argv[2], int(sys.argv[3]), sys.argv[4], interval)
    elif cmd == "machine":
        print(json.dumps(machine()))
    elif cmd == "ctx":
        info = model_info(sys.argv[2])
        per_token = info["layers"] * 2 * info["kv_heads"] * info["head_dim"] * 2
        step = int(sys.argv[4]) * 256
        ctx = int(float(sys.argv[3]) * GIB // per_token) // step * step
        print(ctx, ctx * per_token)
    elif cmd == "cell":
        obj = {}
        for kv in sys.argv[3:]:
            k, _, v = kv.partition("=")
            try:
                obj[k] = json.loads(v)
            except ValueError:
                obj[k] = v
        with open(sys.argv[2], "w") as f:
            json.dump(obj, f)
    elif cmd == "report":
        report(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
