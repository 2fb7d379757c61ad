#!/usr/bin/env python3
"""Static checks of the device code: what ptxas and the SASS say about each CUDA kernel.

For every kernels/cuda/*.cu in the nvcc build (its compile_commands.json), each source is
compiled again with the build's own command, changed only to write one cubin per
architecture (`-cubin -arch=sm_XX --resource-usage`, the architectures the build targets).
The cubins are cached under <build>/sass/<arch>/ with nvcc's dependency file, so a second run
compiles only what changed. Per kernel (the demangled name without namespaces and parameters,
e.g. `PagedAttentionKernel<__nv_bfloat16, 128, false>`) it reports:

  regs, stack, spills, smem   from ptxas (`--resource-usage`, the same lines as `ptxas -v`):
                              registers per thread, stack frame bytes (local memory), spill
                              store / load bytes, static shared memory bytes.
  global loads                from `cuobjdump -sass`: the count of LDG per width in bits
                              (8/16 for LDG.E.U8/U16 and signed forms, 32 for LDG.E, 64,
                              128); LDGSTS (cp.async) counts as a global load of its width,
                              UTMALDG (TMA) as `tma`.
  tensor                      the tensor-core opcodes used: HMMA, HGMMA, IMMA, IGMMA, QGMMA,
                              DMMA, BMMA (none: `-`).
  B/inst                      bytes of global data per warp-instruction in the kernel's
                              streaming loops (below); `-` where it has none.

The streaming loops and B/inst (the static roofline)
----------------------------------------------------
  * Reachable code: the instructions a converged warp can reach from the entry, following
    BRA (both ways when predicated), with BRA.DIV taken as not diverging. BRA.DIV's
    out-of-line fallback (after EXIT, with a BRA back into the loop) is thus not reachable,
    and neither is the BRA-to-itself that ends the code.
  * A loop is a reachable backward branch: a `BRA` at address b whose target h <= b; its
    body is every reachable instruction at addresses h..b, both ends included. Back edges
    to the same head are one loop (the largest b). A loop is innermost when no other loop
    lies inside it.
  * The body is counted statically: every instruction in it once. Both arms of a branch
    inside the body count; in the attention kernels these are the guards against a bad
    block id (a few instructions that the hot path also runs, or skips).
  * An index load is an LDG whose result reaches the address of another global load of the
    body (followed through the registers written by the instructions after it, around the
    loop once; a write from an instruction that does not read a tainted register ends the
    taint). The block-table load `table[pos / block_size]` is one. A data load is any other
    global load whose result reaches floating-point arithmetic (FFMA, HADD2, HMMA, ...) or
    the data operand of a store, the same way: a K or V row slice in the attention kernels
    (bf16 becomes f32 by an integer shift, then an FFMA). Loads that only steer compares and
    branches (the binary search of query_start_loc) are neither, and not counted.
  * A streaming loop is an innermost loop with a data load. Per iteration a warp reads
    B = sum over its data loads of width/8 x 32 lanes bytes (all lanes active: the guards are
    warp-uniform) and runs I = the number of instructions of the body. Unrolling changes
    both alike.
  * A kernel's B/inst combines its streaming loops as n / sum_i(I_i / B_i): each loop streams
    the same bytes per unit of work (the decode kernel: the scores loop reads one K row and
    the values loop one V row of a position, head_size x sizeof(cache) bytes each), so per
    byte a warp runs sum_i I_i / B_i / n instructions. Today's decode kernel (sm_90): scores
    189 instructions and values 163 per iteration, each iteration two positions (8 x
    LDG.E.U16 = 512 B): 2 / (189/512 + 163/512) = 2.91 B/inst. The issue quoted ~0.72; that
    is 512 / (4 x 176), as if all 4 warps of a block ran each position (each warp takes
    every fourth position). For kernels whose loops read unequal
    amounts this is only indicative; each loop's figure is printed with --loops.

The decode figure (the roofline) counts each K/V byte once per GQA group: attention reads
the group's K/V rows once for all its query heads at best, so a kernel that loads them once
per query head spends its instructions on the same unique bytes several times. Per kernel,
loads = how many times it loads each K/V byte of one group of --roofline-group query heads
(default 4: Llama-3-8B's 32 query heads over 8 KV heads): DecodeAttentionKernel<T, D, kGroup>
(one CTA per sequence, KV head and split serving kGroup query heads) ceil(group / kGroup);
PagedAttentionKernel (the fp32 path's row kernels, one block per query head) group; else 1.
The roofline figure is B/inst / loads. The decode kernel is --roofline-kernel, by default
DecodeAttentionKernel<__nv_bfloat16, 128, 4>: bf16 cache, head size 128, 4 query heads per
CTA; its main loop (the full tiles; the masked last tile runs once per CTA) loads 4 K and 4 V
row slices per key group, 8 x LDG.E.128 = 4096 B per warp-iteration, used by all 4 heads. It
has two copies of that loop, alternatives (one block-table lookup per tile for power-of-two
block sizes, one per position else): its figure is the worse of the two, not combined.
The fp32 path's PagedAttentionKernel<__nv_bfloat16, 128, false> is 2.91 / 4 = 0.73 (the issue
quoted ~0.72). The target: an H100 SXM issues at most 132 SMs x 4 schedulers x 1.755 GHz =
0.93 T warp-instructions/s; to read K/V at 80% of 3.35 TB/s while issuing at 80% of that peak a
loop needs 0.8 x 3.35e12 / (0.8 x 0.93e12) = 3.6 bytes per warp-instruction. B/inst x 0.93e12
is the bandwidth at which the loop saturates the issue slots: a static upper bound, blind to
latency, barriers and the softmax between the loops.

Checks (exit status 1 when one fails; each failure is printed):
  --budgets FILE          every kernel is in FILE (kernels/cuda/sass_budgets.json) with its
                          registers, smem and stack ceilings, on every architecture; spill
                          bytes are 0 except where FILE's known_spills pins a figure.
  --expect-ldg128 RE      each kernel matching RE has a streaming loop and all its data loads
                          in them are 128-bit (LDG.E.128, LDGSTS .128) or TMA.
  --expect-hmma RE        each kernel matching RE uses HMMA or HGMMA.
  --min-bytes-per-inst X  the --roofline-kernel (the decode kernel) has a roofline figure (B/inst
                          per unique K/V byte of a GQA group, above) >= X.
  Each RE must match some kernel.

The disassembler: cuobjdump and nvdisasm from $CUOBJDUMP (nvdisasm beside it), PATH, the
toolkit beside nvcc, or <build>/sass-tools; with --install-tools, missing ones are installed
there from tools/cuda/requirements-sass.txt (PyPI's nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm) by `python3 -m pip install --target`. When it cannot be had, the SASS
checks exit 77 with the reason (ctest's skip); --no-sass reports ptxas' figures only.

Usage (from the repository root, after configuring the nvcc build in build/):
  tools/cuda/sass_report.py --build-dir build --install-tools --loops
  tools/cuda/sass_report.py --build-dir build --no-sass --budgets kernels/cuda/sass_budgets.json
  tools/cuda/sass_report.py --build-dir build --markdown          # the table in docs/performance
  tools/cuda/sass_report.py --build-dir build --write-budgets kernels/cuda/sass_budgets.json
  tools/cuda/sass_report.py --self-test                           # no toolkit needed
Exit status: 0 all checks hold, 1 a check failed, 2 a usage or toolchain error, 77 the
disassembler cannot be obtained.
"""
import argparse
import concurrent.futures
import dataclasses
import fcntl
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO_ROOT / "tools" / "cuda" / "requirements-sass.txt"
EXIT_SKIP = 77

ISSUE_RATE = 132 * 4 * 1.755e9  # H100 SXM warp-instructions per second at boost clock
HBM_BYTES_PER_S = 3.35e12  # H100 SXM HBM3
TARGET_BYTES_PER_INST = 0.8 * HBM_BYTES_PER_S / (0.8 * ISSUE_RATE)  # = 3.6
DECODE_KERNEL = "DecodeAttentionKernel<__nv_bfloat16, 128, 4>"
ROOFLINE_GROUP = 4  # Llama-3-8B: 32 query heads over 8 KV heads

TENSOR_OPS = ("HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA", "DMMA", "BMMA")
GLOBAL_LOADS = ("LDG", "LDGSTS", "UTMALDG")


class ToolError(Exception):
    """A usage or toolchain problem (exit 2)."""


class Unavailable(Exception):
    """The disassembler cannot be obtained (exit 77)."""


# ---------------------------------------------------------------------------------------------
# Names


def short_name(demangled):
    """`void ns::(anonymous namespace)::K<T, 1>(ns::P)` -> `K<T, 1>`."""
    depth, cut = 0, len(demangled)
    for i, c in enumerate(demangled):  # the parameter list: the first '(' outside <>
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and not demangled.startswith("(anonymous", i):
            cut = i
            break
    name = demangled[:cut].strip()
    if name.startswith("void "):
        name = name[len("void "):]
    depth, start = 0, 0  # drop the qualifiers: up to the last '::' outside <>
    for i in range(len(name)):
        c = name[i]
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif depth == 0 and name.startswith("::", i):
            start = i + 2
    return name[start:]


def demangle(names):
    names = sorted(set(names))
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return {n: short_name(d) for n, d in zip(names, out)}


# ---------------------------------------------------------------------------------------------
# ptxas


@dataclasses.dataclass
class Resources:
    registers: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem_bytes: int = 0


def parse_ptxas(text):
    """ptxas' --resource-usage lines -> {mangled entry name: Resources}."""
    entries, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = entries.setdefault(m.group(1), Resources())
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:  # also printed for non-entry functions, which are not kernels
            current = entries.get(m.group(1))
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            current.stack_bytes, current.spill_stores, current.spill_loads = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current.registers = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current.smem_bytes = int(s.group(1)) if s else 0
    return entries


# ---------------------------------------------------------------------------------------------
# SASS


@dataclasses.dataclass
class Inst:
    addr: int
    pred: str  # the guard, "@!P0", or ""
    opcode: str  # with modifiers: LDG.E.U16
    operands: list

    @property
    def base(self):
        return self.opcode.split(".")[0]


INST_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def split_operands(text):
    ops, depth, cur = [], 0, ""
    for c in text:
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        if c == "," and depth == 0:
            ops.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        ops.append(cur.strip())
    return ops


def parse_sass(text):
    """`cuobjdump -sass` output -> {mangled function name: [Inst]}."""
    functions, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        if current is None:
            continue
        m = INST_RE.search(line)
        if m:
            current.append(Inst(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3),
                                split_operands(m.group(4))))
    return functions


def load_width(inst):
    """The bits one lane reads with a global load; 'tma' for a bulk tensor copy."""
    if inst.base == "UTMALDG":
        return "tma"
    mods = inst.opcode.split(".")[1:]
    for mod, bits in (("128", 128), ("64", 64), ("U16", 16), ("S16", 16), ("U8", 8), ("S8", 8)):
        if mod in mods:
            return bits
    return 32


REG_RE = re.compile(r"\bR(\d+)(\.64)?\b")


def regs_in(operand, pair_if_64=True):
    regs = set()
    for m in REG_RE.finditer(operand):
        n = int(m.group(1))
        regs.add(n)
        if m.group(2) and pair_if_64:
            regs.add(n + 1)
    return regs


def dest_operand(inst):
    """The index of the operand that names the R register an instruction writes, or None."""
    ops = inst.operands
    if ops and re.fullmatch(r"R\d+", ops[0]):
        return 0
    if len(ops) > 1 and re.fullmatch(r"!?U?P[T0-9]+", ops[0]) and re.fullmatch(r"R\d+", ops[1]):
        return 1  # SHFL PT, R42, ...
    return None


def dest_regs(inst):
    """The R registers an instruction writes (an approximation sufficient for taint)."""
    i = dest_operand(inst)
    if i is None:
        return set()
    n = int(inst.operands[i][1:])
    mods = inst.opcode.split(".")
    count = 1
    if "WIDE" in mods or "64" in mods:
        count = 2
    if "128" in mods:
        count = 4
    return set(range(n, n + count))


def src_regs(inst):
    skip = dest_operand(inst)
    regs = set()
    for i, op in enumerate(inst.operands):
        if i != skip:
            regs |= regs_in(op)
    return regs


def is_global_load(inst):
    return inst.base in GLOBAL_LOADS


def address_regs(inst):
    """Registers of the address of a load: the last bracketed part of the operand."""
    for op in inst.operands:
        parts = re.findall(r"\[([^\]]*)\]", op)
        if parts:
            return regs_in(parts[-1])
    return set()


FP_OPS = {"FADD", "FFMA", "FMUL", "FMNMX", "FSEL", "FSET", "FSETP", "FCHK", "FSWZADD", "F2F",
          "F2FP", "MUFU", "HADD2", "HFMA2", "HMUL2", "HMNMX2", "HSET2", "HSETP2", "DADD", "DFMA",
          "DMUL", "DSETP"} | set(TENSOR_OPS)


def reaches(body, k, hit):
    """Whether the value loaded by body[k] reaches an instruction for which hit(inst, tainted)
    holds, following the registers written from it through the rest of the body and around
    the loop back to k."""
    tainted = dest_regs(body[k])
    n = len(body)
    for step in range(1, n + 1):
        inst = body[(k + step) % n]
        if hit(inst, tainted):
            return True
        dests = dest_regs(inst)
        if src_regs(inst) & tainted:
            tainted |= dests
        else:
            tainted -= dests
        if not tainted:
            return False
    return False


def is_index_load(body, k):
    """Whether the result of load body[k] reaches the address of another global load."""
    return reaches(body, k, lambda inst, t: is_global_load(inst) and bool(address_regs(inst) & t))


STORE_OPS = {"STG", "STS", "ST", "STL", "RED", "REDG", "ATOM", "ATOMG", "ATOMS"}


def is_data_load(body, k):
    """Whether the result of load body[k] reaches floating-point arithmetic or the data of a
    store (a load that only steers compares and branches, as a binary search's, is not)."""

    def hit(inst, t):
        if inst.base in FP_OPS:
            return bool(src_regs(inst) & t)
        if inst.base in STORE_OPS:
            return bool((src_regs(inst) - address_regs(inst)) & t)
        return False

    return reaches(body, k, hit)


@dataclasses.dataclass
class Loop:
    head: int
    tail: int
    insts: int
    data_loads: list  # widths in bits
    index_loads: int

    @property
    def bytes(self):
        return sum(w // 8 * 32 for w in self.data_loads if w != "tma")

    @property
    def bytes_per_inst(self):
        return self.bytes / self.insts


def branch_target(inst):
    m = re.fullmatch(r"0x([0-9a-f]+)", inst.operands[-1]) if inst.operands else None
    return int(m.group(1), 16) if m else None


def reachable(insts):
    """Indices of the instructions a converged warp can reach from the entry: BRA.DIV is
    taken as not diverging, so its out-of-line fallback (and the BRA back from it) is not."""
    index = {inst.addr: k for k, inst in enumerate(insts)}
    seen, stack = set(), [0]
    while stack:
        k = stack.pop()
        if k in seen or k >= len(insts):
            continue
        seen.add(k)
        inst = insts[k]
        conditional = bool(inst.pred) or any(re.fullmatch(r"!?U?P\d", op) for op in inst.operands)
        if inst.base in ("BRA", "CALL") and ".DIV" not in inst.opcode:
            target = branch_target(inst)
            if target in index:
                stack.append(index[target])
            if conditional or inst.base == "CALL":
                stack.append(k + 1)
        elif inst.base in ("EXIT", "RET"):
            if conditional:
                stack.append(k + 1)
        else:
            stack.append(k + 1)
    return seen


def streaming_loops(insts):
    live = reachable(insts)
    heads = {}
    for k, inst in enumerate(insts):
        if k not in live or inst.base != "BRA" or ".DIV" in inst.opcode:
            continue
        target = branch_target(inst)
        if target is not None and target <= inst.addr:
            heads[target] = max(heads.get(target, 0), inst.addr)
    spans = sorted(heads.items())
    innermost = [(h, t) for h, t in spans
                 if not any((h2, t2) != (h, t) and h <= h2 and t2 <= t for h2, t2 in spans)]
    loops = []
    for h, t in innermost:
        body = [inst for k, inst in enumerate(insts) if k in live and h <= inst.addr <= t]
        loads = [k for k, i in enumerate(body) if is_global_load(i)]
        index = [k for k in loads if is_index_load(body, k)]
        data = [load_width(body[k]) for k in loads
                if k not in index and is_data_load(body, k)]
        if data:
            loops.append(Loop(h, t, len(body), data, len(index)))
    return loops


@dataclasses.dataclass
class Kernel:
    name: str
    arch: str
    res: Resources
    loads: dict = None  # width -> count
    tensor: list = None
    loops: list = None

    @property
    def bytes_per_inst(self):
        loops = [lp for lp in (self.loops or []) if lp.bytes > 0]
        if not loops:
            return None
        return len(loops) / sum(lp.insts / lp.bytes for lp in loops)

    def widths_text(self):
        if self.loads is None:
            return "?"
        if not self.loads:
            return "-"
        order = sorted(self.loads, key=lambda w: (isinstance(w, str), w), reverse=True)
        return " ".join(f"{w}x{self.loads[w]}" for w in order)


def group_loads(name, group):
    """How many times kernel `name` loads each K/V byte of one GQA group of `group` query
    heads (see the module docstring)."""
    m = re.fullmatch(r"DecodeAttentionKernel<.*, (\d+)>", name)
    if m:
        return -(-group // int(m.group(1)))
    if name.startswith("PagedAttentionKernel<"):
        return group
    return 1


def alternative_loops(name):
    """Whether the kernel's streaming loops are alternatives, each reading K and V (the decode
    kernel's copies of its main loop: one page lookup per tile, or one per position), rather
    than successive loops that each read one of them per position."""
    return name.startswith("DecodeAttentionKernel<")


def loaded_bytes_per_inst(k):
    """B/inst as the kernel loads: alternative loops by the worst of them, else combined."""
    loops = [lp for lp in (k.loops or []) if lp.bytes > 0]
    if loops and alternative_loops(k.name):
        return min(lp.bytes_per_inst for lp in loops)
    return k.bytes_per_inst


def roofline_bytes_per_inst(k, group):
    """B/inst counting each K/V byte once per GQA group; None without a streaming loop."""
    bpi = loaded_bytes_per_inst(k)
    return None if bpi is None else bpi / group_loads(k.name, group)


def analyze_sass(insts):
    loads = {}
    for inst in insts:
        if is_global_load(inst):
            w = load_width(inst)
            loads[w] = loads.get(w, 0) + 1
    tensor = sorted({i.base for i in insts if i.base in TENSOR_OPS})
    return loads, tensor, streaming_loops(insts)


# ---------------------------------------------------------------------------------------------
# Building the cubins


def kernel_sources(build_dir):
    db = build_dir / "compile_commands.json"
    if not db.exists():
        raise ToolError(f"{db} not found: configure the nvcc build first (cmake -S . -B build)")
    entries = []
    for e in json.loads(db.read_text()):
        f = Path(e["file"])
        if f.suffix == ".cu" and f.parent.name == "cuda" and f.parent.parent.name == "kernels":
            args = e.get("arguments") or shlex.split(e["command"])
            if "nvcc" in Path(args[0]).name or any("nvcc" in Path(a).name for a in args[:2]):
                entries.append((f, args, e["directory"]))
    if not entries:
        raise ToolError(f"{db} has no nvcc-compiled kernels/cuda/*.cu: is the CUDA backend on?")
    return sorted(entries)


def build_archs(args):
    archs = set()
    for a in args:
        for m in re.finditer(r"code=\[?[^\]]*?sm_(\d+)", a):
            archs.add(f"sm_{m.group(1)}")
        m = re.fullmatch(r"-arch=sm_(\d+)", a)
        if m:
            archs.add(f"sm_{m.group(1)}")
    return sorted(archs)


def cubin_command(args, arch, out, dep):
    cmd, skip = [], False
    if "nvcc" not in Path(args[0]).name:  # a compiler launcher (ccache) first
        args = args[1:]
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-c", "-MD", "-MMD"):
            continue
        if a in ("-o", "-MF", "-MT", "-gencode", "--generate-code", "-arch", "-code"):
            skip = True
            continue
        if a.startswith(("--generate-code=", "-gencode=", "-arch=", "-code=", "-o")):
            continue
        cmd.append(a)
    return cmd + ["-cubin", f"-arch={arch}", "--resource-usage", "-o", str(out), "-MD", "-MF",
                  str(dep)]


def deps_of(dep_file, directory):
    text = dep_file.read_text().replace("\\\n", " ")
    _, _, rest = text.partition(": ")
    paths = re.split(r"(?<!\\)\s+", rest.strip())
    return [Path(directory, p.replace("\\ ", " ")) for p in paths if p]


def compile_cubin(src, args, directory, arch, cache):
    out_dir = cache / arch
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = src.stem
    cubin, log, dep, cmd_file = (out_dir / f"{stem}{ext}" for ext in (".cubin", ".ptxas.txt",
                                                                         ".d", ".cmd"))
    cmd = cubin_command(args, arch, cubin, dep)
    cmd_text = shlex.join(cmd)
    if all(p.exists() for p in (cubin, log, dep, cmd_file)) and cmd_file.read_text() == cmd_text:
        newest = max((p.stat().st_mtime for p in deps_of(dep, directory) if p.exists()),
                     default=math.inf)
        if newest < cubin.stat().st_mtime:
            return cubin, log.read_text()
    r = subprocess.run(cmd, cwd=directory, capture_output=True, text=True)
    if r.returncode != 0:
        raise ToolError(f"compiling {src} for {arch} failed:\n{shlex.join(cmd)}\n{r.stderr}")
    text = r.stdout + r.stderr
    log.write_text(text)
    cmd_file.write_text(cmd_text)
    return cubin, text


# ---------------------------------------------------------------------------------------------
# The disassembler


def find_disassembler(build_dir, nvcc, install):
    candidates = []
    if os.environ.get("CUOBJDUMP"):
        candidates.append(Path(os.environ["CUOBJDUMP"]))
    if shutil.which("cuobjdump"):
        candidates.append(Path(shutil.which("cuobjdump")))
    candidates.append(Path(nvcc).resolve().parent / "cuobjdump")
    tools = build_dir / "sass-tools"
    candidates += sorted(tools.glob("nvidia/cu*/bin/cuobjdump"))

    def usable(c):
        nvdisasm = c.parent / "nvdisasm"
        if c.is_file() and nvdisasm.is_file():
            return c
        if c.is_file() and shutil.which("nvdisasm"):
            return c
        return None

    for c in candidates:
        if usable(c):
            return usable(c)
    if not install:
        raise Unavailable("cuobjdump and nvdisasm not found (PATH, CUOBJDUMP, the toolkit, "
                          f"{tools}); --install-tools installs them from {REQUIREMENTS}")
    tools.mkdir(parents=True, exist_ok=True)
    with open(tools / ".lock", "w") as lock:  # ctest -j: one installer at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(tools.glob("nvidia/cu*/bin/cuobjdump"))
        if not (found and usable(found[0])):
            cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   "--no-deps", "--upgrade", "--target", str(tools), "-r", str(REQUIREMENTS)]
            print("installing the disassembler:", shlex.join(cmd), flush=True)
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise Unavailable(f"`{shlex.join(cmd)}` failed (no pip, or PyPI unreachable):\n"
                                  f"{r.stderr.strip()[-2000:]}")
            found = sorted(tools.glob("nvidia/cu*/bin/cuobjdump"))
    for c in found:
        for exe in (c, c.parent / "nvdisasm"):
            if exe.exists():
                exe.chmod(exe.stat().st_mode | 0o111)
        if usable(c):
            return c
    raise Unavailable(f"{REQUIREMENTS} installed into {tools} but no cuobjdump + nvdisasm there")


def disassemble(cuobjdump, cubin):
    env = dict(os.environ)
    env["PATH"] = f"{cuobjdump.parent}{os.pathsep}{env.get('PATH', '')}"
    r = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        raise ToolError(f"{cuobjdump} -sass {cubin} failed:\n{r.stderr}")
    return r.stdout


# ---------------------------------------------------------------------------------------------
# Collecting, checking, printing


def collect(build_dir, archs, jobs, cuobjdump):
    sources = kernel_sources(build_dir)
    nvcc = sources[0][1][0] if "nvcc" in Path(sources[0][1][0]).name else sources[0][1][1]
    if not archs:
        archs = build_archs(sources[0][1])
    if not archs:
        raise ToolError("no sm_XX architecture in the build's nvcc command; pass --arch")
    cache = build_dir / "sass"
    cache.mkdir(parents=True, exist_ok=True)
    jobs_list = [(src, args, d, arch) for src, args, d in sources for arch in archs]
    with open(cache / ".lock", "w") as lock:  # ctest -j: the tests share the cache
        fcntl.flock(lock, fcntl.LOCK_EX)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(pool.map(lambda j: (j[3], compile_cubin(j[0], j[1], j[2], j[3], cache)),
                                    jobs_list))
    kernels = []
    for arch, (cubin, log) in results:
        res = parse_ptxas(log)
        sass = parse_sass(disassemble(cuobjdump, cubin)) if cuobjdump else {}
        names = demangle(list(res) + list(sass))
        for mangled, r in res.items():
            k = Kernel(names[mangled], arch, r)
            if cuobjdump:
                if mangled not in sass:
                    raise ToolError(f"{cubin}: ptxas compiled {mangled} but the SASS lacks it")
                k.loads, k.tensor, k.loops = analyze_sass(sass[mangled])
            kernels.append(k)
    seen = {}
    for k in kernels:
        if (k.name, k.arch) in seen:
            raise ToolError(f"two kernels are named {k.name} on {k.arch}: the budgets need "
                            "distinct names")
        seen[(k.name, k.arch)] = k
    return sorted(kernels, key=lambda k: (k.arch, k.name)), archs


def budget_failures(kernels, budgets):
    fails = []
    table = budgets.get("kernels", {})
    known = budgets.get("known_spills", {})
    for k in kernels:
        b = table.get(k.name)
        if b is None:
            fails.append(f"{k.arch} {k.name}: no budget; add it to the budgets file "
                         "(--write-budgets prints today's figures with headroom)")
            continue
        allowed = known.get(k.arch, {}).get(k.name, {}).get("spill_bytes", 0)
        spills = max(k.res.spill_stores, k.res.spill_loads)
        if spills > allowed:
            fails.append(f"{k.arch} {k.name}: spills {k.res.spill_stores} B stored, "
                         f"{k.res.spill_loads} B loaded; allowed {allowed}")
        for field, value in (("registers", k.res.registers), ("smem_bytes", k.res.smem_bytes),
                             ("stack_bytes", k.res.stack_bytes)):
            if value > b[field]:
                fails.append(f"{k.arch} {k.name}: {field} {value} > budget {b[field]}")
    names = {k.name for k in kernels}
    for name in table:
        if name not in names:
            fails.append(f"budget for {name}, which no longer exists: remove it")
    return fails


def matching(kernels, pattern, what):
    found = [k for k in kernels if re.search(pattern, k.name)]
    if not found:
        return [], [f"{what} {pattern!r}: matches no kernel"]
    return found, []


def expectation_failures(kernels, args):
    fails = []
    for pattern in args.expect_ldg128:
        found, f = matching(kernels, pattern, "--expect-ldg128")
        fails += f
        for k in found:
            widths = [w for lp in k.loops or [] for w in lp.data_loads]
            if not widths or any(w not in (128, "tma") for w in widths):
                counts = {w: widths.count(w) for w in widths}
                text = ", ".join(f"{n} x {w}-bit" for w, n in counts.items()) or "none"
                fails.append(f"{k.arch} {k.name}: data loads in its streaming loops: {text}; "
                             "expected 128-bit")
    for pattern in args.expect_hmma:
        found, f = matching(kernels, pattern, "--expect-hmma")
        fails += f
        for k in found:
            if not {"HMMA", "HGMMA"} & set(k.tensor or []):
                fails.append(f"{k.arch} {k.name}: no HMMA or HGMMA (tensor: {k.tensor or '-'})")
    if args.min_bytes_per_inst is not None:
        found, f = matching(kernels, re.escape(args.roofline_kernel) + "$", "--roofline-kernel")
        fails += f
        group = getattr(args, "roofline_group", ROOFLINE_GROUP)
        for k in found:
            bpi = roofline_bytes_per_inst(k, group)
            if bpi is None or bpi < args.min_bytes_per_inst:
                fails.append(f"{k.arch} {k.name}: {bpi or 0:.2f} bytes per warp-instruction "
                             f"(each K/V byte once per group of {group} query heads) "
                             f"< {args.min_bytes_per_inst}")
    return fails


def fmt_table(kernels, markdown):
    head = ["kernel", "arch", "regs", "spill st/ld", "stack", "smem", "LDG widths (bits x n)",
            "tensor", "B/inst"]
    rows = []
    for k in kernels:
        bpi = loaded_bytes_per_inst(k)
        rows.append([k.name, k.arch, str(k.res.registers),
                     f"{k.res.spill_stores}/{k.res.spill_loads}", str(k.res.stack_bytes),
                     str(k.res.smem_bytes), k.widths_text(),
                     ("?" if k.tensor is None else " ".join(k.tensor) or "-"),
                     "-" if bpi is None else f"{bpi:.2f}"])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [head] + rows)


def fmt_loops(k):
    lines = []
    for lp in k.loops or []:
        widths = {}
        for w in lp.data_loads:
            widths[w] = widths.get(w, 0) + 1
        w_text = ", ".join(f"{n} x {w}-bit" for w, n in widths.items())
        lines.append(f"  loop 0x{lp.head:x}..0x{lp.tail:x}: {lp.insts} warp-instructions, "
                     f"data loads {w_text} = {lp.bytes} B per iteration, {lp.index_loads} "
                     f"index load(s) -> {lp.bytes_per_inst:.2f} B/inst")
    return lines


def fmt_roofline(k, group=ROOFLINE_GROUP):
    loaded = loaded_bytes_per_inst(k)
    if loaded is None:
        return [f"decode roofline: {k.name} ({k.arch}) has no streaming loop"]
    loads = group_loads(k.name, group)
    bpi = loaded / loads
    lines = [f"decode attention inner loops: {k.name} ({k.arch})"] + fmt_loops(k)
    if alternative_loops(k.name):
        lines.append(f"  the worst of the alternative main loops (each streams K and V): "
                     f"{loaded:.2f} bytes loaded per warp-instruction")
    else:
        lines.append(f"  combined (each loop streams one row, K or V, per position): "
                     f"{loaded:.2f} bytes loaded per warp-instruction")
    lines.append(f"  each K/V byte of a GQA group of {group} query heads loaded {loads} time(s): "
                 f"{bpi:.2f} bytes per warp-instruction")
    bound = bpi * ISSUE_RATE
    lines.append(f"  issue-bound bandwidth {bpi:.2f} x {ISSUE_RATE / 1e12:.2f} T warp-inst/s = "
                 f"{bound / 1e12:.2f} TB/s ({bound / HBM_BYTES_PER_S:.0%} of 3.35 TB/s); target "
                 f"{TARGET_BYTES_PER_INST:.1f} B/inst (80% of 3.35 TB/s at 80% issue): "
                 f"{bpi / TARGET_BYTES_PER_INST:.2f} of it")
    return lines


def headroom_budgets(kernels, old):
    """Today's figures with headroom: registers +10% rounded up to 8, smem up to 1 KiB."""
    table = {}
    for k in kernels:
        b = table.setdefault(k.name, {"registers": 0, "smem_bytes": 0, "stack_bytes": 0})
        b["registers"] = max(b["registers"], math.ceil(k.res.registers * 1.1 / 8) * 8)
        b["smem_bytes"] = max(b["smem_bytes"], math.ceil(k.res.smem_bytes / 1024) * 1024)
        b["stack_bytes"] = max(b["stack_bytes"], k.res.stack_bytes)
    known = {}
    for k in kernels:
        spills = max(k.res.spill_stores, k.res.spill_loads)
        if spills:
            reason = old.get("known_spills", {}).get(k.arch, {}).get(k.name, {}).get(
                "reason", "known spill at the time the budgets were written")
            known.setdefault(k.arch, {})[k.name] = {"spill_bytes": spills, "reason": reason}
    return {"about": old.get("about", ""), "kernels": dict(sorted(table.items())),
            "known_spills": known}


def budgets_json(b):
    """The budgets file, one kernel a line so that it reads as a table."""

    def rows(table):
        return ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items())

    known = ",\n".join(f"    {json.dumps(arch)}: {{\n" + rows(t).replace("\n", "\n  ")
                       .replace("    ", "      ", 1) + "\n    }" for arch, t in b["known_spills"].items())
    return (f'{{\n  "about": {json.dumps(b["about"])},\n  "kernels": {{\n{rows(b["kernels"])}\n  }},\n'
            f'  "known_spills": {{\n{known}\n  }}\n}}\n')


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the header of this file for the definitions.")
    p.add_argument("--build-dir", type=Path, default=Path("build"))
    p.add_argument("--arch", action="append", default=[],
                   help="sm_XX to check (repeatable); default: the build's architectures")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--no-sass", action="store_true", help="ptxas figures only")
    p.add_argument("--install-tools", action="store_true",
                   help="pip-install the disassembler into <build>/sass-tools when missing")
    p.add_argument("--budgets", type=Path, help="check the kernels against this budgets file")
    p.add_argument("--write-budgets", type=Path, help="write today's figures with headroom")
    p.add_argument("--expect-ldg128", action="append", default=[], metavar="RE")
    p.add_argument("--expect-hmma", action="append", default=[], metavar="RE")
    p.add_argument("--min-bytes-per-inst", type=float)
    p.add_argument("--roofline-kernel", default=DECODE_KERNEL)
    p.add_argument("--roofline-group", type=int, default=ROOFLINE_GROUP,
                   help="query heads per KV head at the roofline's shape")
    p.add_argument("--loops", action="store_true", help="print every kernel's streaming loops")
    p.add_argument("--markdown", action="store_true", help="the table in Markdown")
    p.add_argument("--json", type=Path, help="write the figures as JSON")
    p.add_argument("--self-test", action="store_true",
                   help="check the parsers on built-in samples; needs no toolkit")
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    build_dir = args.build_dir.resolve()
    needs_sass = not args.no_sass or args.expect_ldg128 or args.expect_hmma or (
        args.min_bytes_per_inst is not None)
    try:
        cuobjdump = None
        if needs_sass:
            sources = kernel_sources(build_dir)
            args0 = sources[0][1]
            nvcc = args0[0] if "nvcc" in Path(args0[0]).name else args0[1]
            cuobjdump = find_disassembler(build_dir, nvcc, args.install_tools)
        kernels, archs = collect(build_dir, args.arch, args.jobs, cuobjdump)
    except Unavailable as e:
        print(f"SKIP: the SASS checks need the disassembler: {e}")
        return EXIT_SKIP
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(fmt_table(kernels, args.markdown))
    print()
    if cuobjdump:
        if args.loops:
            for k in kernels:
                if k.loops:
                    print(f"{k.name} ({k.arch})")
                    print("\n".join(fmt_loops(k)))
            print()
        for k in kernels:
            if k.name == args.roofline_kernel:
                print("\n".join(fmt_roofline(k, args.roofline_group)))
        print()
    if args.json:
        args.json.write_text(json.dumps([{
            "kernel": k.name, "arch": k.arch, **dataclasses.asdict(k.res),
            "global_loads": {str(w): n for w, n in (k.loads or {}).items()},
            "tensor": k.tensor, "bytes_per_warp_inst": loaded_bytes_per_inst(k),
        } for k in kernels], indent=1) + "\n")
    if args.write_budgets:
        old = json.loads(args.write_budgets.read_text()) if args.write_budgets.exists() else {}
        args.write_budgets.write_text(budgets_json(headroom_budgets(kernels, old)))
        print(f"wrote {args.write_budgets}")
    fails = []
    if args.budgets:
        fails += budget_failures(kernels, json.loads(args.budgets.read_text()))
    fails += expectation_failures(kernels, args)
    for f in fails:
        print(f"FAIL: {f}")
    checked = ", ".join(filter(None, [
        args.budgets and f"budgets ({args.budgets.name})",
        args.expect_ldg128 and "--expect-ldg128", args.expect_hmma and "--expect-hmma",
        args.min_bytes_per_inst is not None and "--min-bytes-per-inst"]))
    print(f"{len(kernels)} kernels on {', '.join(archs)}; "
          f"{'checked: ' + checked + '; ' if checked else ''}{len(fails)} failure(s)")
    return 1 if fails else 0


# ---------------------------------------------------------------------------------------------
# Self-test: the parsers and checks on samples in today's formats (nvcc 13.0, cuobjdump 13.5).

SAMPLE_PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6Decodev' for 'sm_90'
ptxas info    : Function properties for _Z6Decodev
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 48 registers, used 1 barriers, 4224 bytes smem, 656 bytes cmem[0]
ptxas info    : Function properties for _Z6helperv
    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function '_Z5Spillv' for 'sm_90'
ptxas info    : Function properties for _Z5Spillv
    16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 480 bytes cmem[0]
"""

# First a binary search (its loads feed compares only: not streaming); then a decode-like loop
# (today's scores loop, shortened): the block-table load feeds the address of four 16-bit K
# loads, which feed FFMAs; a warp sum with a BRA.DIV fallback out of line, which loads and
# branches back into the loop (unreachable for a converged warp).
SAMPLE_SASS = """\
\t\tFunction : _Z6Decodev
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R7, desc[UR12][R2.64] ;
        /*0020*/                   ISETP.GT.AND P0, PT, R7, R5, PT ;
        /*0030*/                   SEL R6, R6, R7, P0 ;
        /*0040*/              @!P0 BRA 0x10 ;
        /*0050*/                   IMAD.WIDE R22, R18, R43, R22 ;
        /*0060*/                   LEA R24, P0, R22, R20, 0x2 ;
        /*0070*/                   LEA.HI.X R25, R22, R21, R23, 0x2, P0 ;
        /*0080*/                   LDG.E R40, desc[UR12][R24.64] ;
        /*0090*/                   ISETP.GE.U32.AND P0, PT, R40, R22, PT ;
        /*00a0*/                   IMAD.WIDE.U32 R26, R40, R34, RZ ;
        /*00b0*/               @P0 LEA R24, P3, R26, R24, 0x1 ;
        /*00c0*/               @P0 LEA.HI.X R25, R26, R25, R27, 0x1, P3 ;
        /*00d0*/               @P0 LDG.E.U16 R40, desc[UR12][R24.64] ;
        /*00e0*/               @P0 LDG.E.U16 R42, desc[UR12][R24.64+0x40] ;
        /*00f0*/               @P0 LDG.E.U16 R38, desc[UR12][R24.64+0x80] ;
        /*0100*/               @P0 LDG.E.U16 R39, desc[UR12][R24.64+0xc0] ;
        /*0110*/               @P0 SHF.L.U32 R41, R40, 0x10, RZ ;
        /*0120*/               @P0 IMAD.U32 R42, R42, 0x10000, RZ ;
        /*0130*/               @P0 FFMA R40, R0, R41, RZ ;
        /*0140*/               @P0 IMAD.U32 R38, R38, 0x10000, RZ ;
        /*0150*/               @P0 FFMA R41, R11, R42, R40 ;
        /*0160*/               @P0 IMAD.U32 R39, R39, 0x10000, RZ ;
        /*0170*/               @P0 FFMA R38, R10, R38, R41 ;
        /*0180*/               @P0 FFMA R41, R9, R39, R38 ;
        /*0190*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*01a0*/                   BRA.DIV UR7, 0x210 ;
        /*01b0*/                   SHFL.BFLY PT, R42, R41, 0x10, 0x1f ;
        /*01c0*/                   FADD R41, R42, R41 ;
        /*01d0*/              @!P0 BRA 0x50 ;
        /*01e0*/                   LDG.E.128 R4, desc[UR12][R2.64] ;
        /*01f0*/                   EXIT ;
        /*0200*/                   BRA 0x200;
        /*0210*/                   LDG.E.64 R6, desc[UR12][R6.64] ;
        /*0220*/                   FADD R41, R6, R41 ;
        /*0230*/                   BRA 0x1b0 ;
\t\tFunction : _Z5Spillv
        /*0000*/                   LDG.E.64 R4, desc[UR12][R2.64] ;
        /*0010*/                   EXIT ;
"""


def self_test():
    fails = []

    def expect(what, got, want):
        if got != want:
            fails.append(f"{what}: got {got!r}, want {want!r}")

    expect("short_name", short_name(
        "void llm::ops::cuda::(anonymous namespace)::PagedAttentionKernel<__nv_bfloat16, 128, "
        "false>(llm::ops::cuda::(anonymous namespace)::Params)"),
        "PagedAttentionKernel<__nv_bfloat16, 128, false>")
    expect("group loads: decode, one CTA per group",
           group_loads("DecodeAttentionKernel<__nv_bfloat16, 128, 4>", 4), 1)
    expect("group loads: decode, head chunks",
           group_loads("DecodeAttentionKernel<__half, 64, 8>", 32), 4)
    expect("group loads: a block per query head",
           group_loads("PagedAttentionKernel<__nv_bfloat16, 128, false>", 4), 4)
    expect("group loads: other", group_loads("RmsNormKernel", 4), 1)
    alt = Kernel("DecodeAttentionKernel<__nv_bfloat16, 128, 4>", "sm_90", None,
                 loops=[Loop(0, 1, 800, [128] * 8, 4), Loop(2, 3, 640, [128] * 8, 1)])
    expect("alternative loops: the worse", loaded_bytes_per_inst(alt), 4096 / 800)
    seq = Kernel("PagedAttentionKernel<__nv_bfloat16, 128, false>", "sm_90", None,
                 loops=[Loop(0, 1, 100, [16] * 8, 2), Loop(2, 3, 156, [16] * 8, 2)])
    expect("successive loops: combined", loaded_bytes_per_inst(seq), 2 / (100 / 512 + 156 / 512))
    expect("roofline per group", roofline_bytes_per_inst(seq, 4), 2 / (100 / 512 + 156 / 512) / 4)
    expect("short_name plain", short_name(
        "llm::ops::cuda::(anonymous namespace)::RotaryKernel(float*, int)"), "RotaryKernel")
    res = parse_ptxas(SAMPLE_PTXAS)
    expect("ptxas entries", sorted(res), ["_Z5Spillv", "_Z6Decodev"])
    expect("ptxas decode", res["_Z6Decodev"], Resources(48, 0, 0, 0, 4224))
    expect("ptxas spill", res["_Z5Spillv"], Resources(32, 16, 12, 12, 0))
    sass = parse_sass(SAMPLE_SASS)
    loads, tensor, loops = analyze_sass(sass["_Z6Decodev"])
    expect("load widths", loads, {32: 2, 16: 4, 128: 1, 64: 1})
    expect("tensor", tensor, ["HMMA"])
    expect("loops", [(lp.head, lp.tail, lp.insts, lp.data_loads, lp.index_loads) for lp in loops],
           [(0x50, 0x1d0, 25, [16, 16, 16, 16], 1)])
    expect("loop bytes", loops[0].bytes, 4 * 2 * 32)
    decode = Kernel("Decode", "sm_90", res["_Z6Decodev"], loads, tensor, loops)
    spill = Kernel("Spill", "sm_90", res["_Z5Spillv"], *analyze_sass(sass["_Z5Spillv"]))
    expect("bytes per inst", round(decode.bytes_per_inst, 3), round(256 / 25, 3))
    expect("no loop", spill.bytes_per_inst, None)
    kernels = [decode, spill]
    budgets = {"kernels": {"Decode": {"registers": 48, "smem_bytes": 4224, "stack_bytes": 0},
                           "Spill": {"registers": 32, "smem_bytes": 0, "stack_bytes": 16}}}
    expect("spill fails", len(budget_failures(kernels, budgets)), 1)
    budgets["known_spills"] = {"sm_90": {"Spill": {"spill_bytes": 12}}}
    expect("known spill holds", budget_failures(kernels, budgets), [])
    budgets["kernels"]["Decode"]["registers"] = 40
    expect("register budget fails", len(budget_failures(kernels, budgets)), 1)
    del budgets["kernels"]["Decode"]
    expect("missing budget fails", len(budget_failures(kernels, budgets)), 1)
    ns = argparse.Namespace(expect_ldg128=["Decode"], expect_hmma=["Spill", "Nothing"],
                            min_bytes_per_inst=16.0, roofline_kernel="Decode")
    expect("expectations", len(expectation_failures(kernels, ns)), 4)
    ns = argparse.Namespace(expect_ldg128=[], expect_hmma=["Decode"], min_bytes_per_inst=10.0,
                            roofline_kernel="Decode")
    expect("expectations hold", expectation_failures(kernels, ns), [])
    expect("cubin command", cubin_command(
        ["/usr/local/cuda/bin/nvcc", "-I/x", "-O3", "--generate-code=arch=compute_90,code=[sm_90]",
         "-x", "cu", "-c", "a.cu", "-o", "a.o"], "sm_90", "o.cubin", "o.d"),
        ["/usr/local/cuda/bin/nvcc", "-I/x", "-O3", "-x", "cu", "a.cu", "-cubin", "-arch=sm_90",
         "--resource-usage", "-o", "o.cubin", "-MD", "-MF", "o.d"])
    expect("archs", build_archs(["--generate-code=arch=compute_80,code=[compute_80,sm_80]",
                                 "--generate-code=arch=compute_90,code=[compute_90,sm_90]"]),
           ["sm_80", "sm_90"])
    for f in fails:
        print(f"FAIL: {f}")
    print(f"self-test: {len(fails)} failure(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
