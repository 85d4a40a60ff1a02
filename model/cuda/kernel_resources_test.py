#!/usr/bin/env python3
"""What each CUDA kernel costs in registers, shared memory and spills, per
architecture, checked against what a launch on a real GPU needs.

The CUDA emulator runs every kernel in CI, but it cannot see registers: a
kernel compiled to more registers than its block can have fails on a GPU
with "too many resources requested for launch", a failure no CPU test
shows. This compiles each model/cuda/*.cu with nvcc --resource-usage (the
ptxas report of the real build, one cubin per architecture) and checks:

  1. A kernel of ours without __launch_bounds__ uses at most 64 registers,
     so that any block up to 1024 threads fits the 64K registers of an SM.
     A kernel with __launch_bounds__(N) is held to it by ptxas itself.
  2. No kernel of ours spills more than SPILL_LIMIT bytes to local memory:
     a spill cliff (a change that tips a kernel over its register budget)
     shows here instead of as an unexplained slowdown on the GPU.
  3. Static shared memory at most 48 KiB (the launch limit without an
     opt-in; ptxas rejects more, this names the kernel).

Library kernels (CUB's sort) carry their own launch bounds and are listed,
not checked. The table it prints (registers, shared memory, spills) is the
first thing to read when a kernel is slower on the GPU than expected.

Before checking the build it checks itself on a canned report with one
violation of each rule (a check that cannot fail proves nothing).

Usage: kernel_resources_test.py --nvcc NVCC --root REPO --archs "80;86;89;90"
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

REGISTER_LIMIT = 64      # 65536 registers per SM / 1024 threads
SPILL_LIMIT = 64         # bytes of spill stores
SMEM_LIMIT = 48 * 1024   # static shared memory without opt-in


def kernels_in_source(text):
    """{kernel name: has __launch_bounds__} for every __global__ function."""
    out = {}
    for m in re.finditer(r"__global__\s+void\s+(__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(", text):
        out[m.group(2)] = out.get(m.group(2), False) or m.group(1) is not None
    return out


def parse_report(report):
    """ptxas --resource-usage text -> [dict(mangled, arch, regs, smem, spill_stores, spill_loads)]."""
    rows, cur = [], None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line)
        if m:
            cur = {"mangled": m.group(1), "arch": m.group(2), "regs": 0, "smem": 0,
                   "spill_stores": 0, "spill_loads": 0}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["spill_stores"], cur["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return rows


def kernel_name(mangled, names):
    """The source kernel a mangled name is (Itanium: <len><name>), or None."""
    best = None
    for n in names:
        if f"{len(n)}{n}" in mangled and (best is None or len(n) > len(best)):
            best = n
    return best


def demangle(mangled):
    """c++filt's name without namespaces and parameters where c++filt exists, else the mangled name."""
    if shutil.which("c++filt") is None:
        return mangled
    full = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
    full = re.sub(r"\((?!anonymous).*\)$", "", full)  # the parameter list
    full = re.sub(r"^void ", "", full).replace("(anonymous namespace)::", "").replace("dgca::cuda::", "")
    return full.replace("__nv_bfloat16", "bf16").replace("__half", "half")


def check(rows, bounded):
    """Violations of the three rules, one line each. bounded: {name: has __launch_bounds__}."""
    bad = []
    for r in rows:
        name = kernel_name(r["mangled"], bounded) if "4dgca" in r["mangled"] else None
        if name is None:
            continue  # a library kernel (CUB): its own launch bounds
        where = f"{demangle(r['mangled'])} on {r['arch']}"
        if not bounded[name] and r["regs"] > REGISTER_LIMIT:
            bad.append(f"{where}: {r['regs']} registers without __launch_bounds__ (at most "
                       f"{REGISTER_LIMIT}, so that a 1024-thread block fits; declare the block size)")
        if r["spill_stores"] > SPILL_LIMIT:
            bad.append(f"{where}: spills {r['spill_stores']} bytes (at most {SPILL_LIMIT})")
        if r["smem"] > SMEM_LIMIT:
            bad.append(f"{where}: {r['smem']} bytes of static shared memory (at most {SMEM_LIMIT})")
    return bad


SELF_TEST_SOURCE = """
__global__ void WideKernel(float* x) {}
__global__ void __launch_bounds__(128)
    BoundedKernel(float* x) {}
__global__ void SpillKernel(float* x) {}
__global__ void BigSmemKernel(float* x) {}
"""
SELF_TEST_REPORT = """
ptxas info    : Compiling entry function '_ZN4dgca4cuda10WideKernelEPf' for 'sm_90'
ptxas info    : Used 72 registers, used 0 barriers
ptxas info    : Compiling entry function '_ZN4dgca4cuda13BoundedKernelEPf' for 'sm_90'
ptxas info    : Used 255 registers, used 1 barriers, 40000 bytes smem
ptxas info    : Compiling entry function '_ZN4dgca4cuda11SpillKernelEPf' for 'sm_90'
    80 bytes stack frame, 80 bytes spill stores, 80 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
ptxas info    : Compiling entry function '_ZN4dgca4cuda13BigSmemKernelEPf' for 'sm_90'
ptxas info    : Used 40 registers, used 1 barriers, 50000 bytes smem
ptxas info    : Compiling entry function '_ZN3cub6detail10SortKernelEv' for 'sm_90'
ptxas info    : Used 128 registers, used 1 barriers, 33856 bytes smem
"""


def self_test():
    bad = check(parse_report(SELF_TEST_REPORT), kernels_in_source(SELF_TEST_SOURCE))
    want = ["WideKernel", "SpillKernel", "BigSmemKernel"]
    got = [b.split(" ")[0] for b in bad]
    if got != want:
        print(f"SELF-TEST FAILED: flagged {got}, want {want}:\n  " + "\n  ".join(bad))
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc", required=True)
    ap.add_argument("--root", required=True, help="repository root (model/cuda/*.cu under it)")
    ap.add_argument("--archs", required=True, help='CMAKE_CUDA_ARCHITECTURES, e.g. "80;86;89;90"')
    a = ap.parse_args()
    if not self_test():
        return 1
    cuda_dir = os.path.join(a.root, "model", "cuda")
    sources = sorted(f for f in os.listdir(cuda_dir) if f.endswith(".cu"))
    archs = [x.split("-")[0] for x in re.split(r"[;,\s]+", a.archs) if x]
    rows, bounded = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            path = os.path.join(cuda_dir, src)
            bounded.update(kernels_in_source(open(path).read()))
            for arch in archs:
                cmd = [a.nvcc, "-cubin", f"-arch=sm_{arch}", "--resource-usage", "-O3", "-DNDEBUG",
                       "-std=c++17", "--diag-suppress=2810", f"-I{a.root}", path,
                       "-o", os.path.join(tmp, f"{src}.{arch}.cubin")]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"FAIL: {' '.join(cmd)}\n{p.stdout}{p.stderr}")
                    return 1
                found = parse_report(p.stdout + p.stderr)
                for r in found:
                    r["file"] = src
                rows += found
    if not rows:
        print("FAIL: nvcc --resource-usage reported no kernels (did its output format change?)")
        return 1
    print(f"{'file':<24} {'arch':<6} {'regs':>4} {'smem':>6} {'spill':>5}  kernel")
    for r in rows:
        name = kernel_name(r["mangled"], bounded) if "4dgca" in r["mangled"] else "(library)"
        shown = demangle(r["mangled"]) if name != "(library)" else name
        print(f"{r['file']:<24} {r['arch']:<6} {r['regs']:>4} {r['smem']:>6} {r['spill_stores']:>5}  "
              f"{shown}{' [launch bounds]' if bounded.get(name) else ''}")
    bad = check(rows, bounded)
    for b in bad:
        print("FAIL:", b)
    print(f"{len(rows)} kernels over {len(archs)} architectures: "
          f"{'all within' if not bad else f'{len(bad)} over'} the limits "
          f"({REGISTER_LIMIT} registers unbounded, {SPILL_LIMIT} bytes spilled, {SMEM_LIMIT} bytes static smem)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
