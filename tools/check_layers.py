#!/usr/bin/env python3
"""The layers of the source tree, checked from its #include lines.

Each folder below is a layer; a source file may include headers of its own
folder and of folders in LOWER layers only. A test (*_test.cc, *_test.cu)
may also include test support (the CUDA checks, the emulator), but nothing
of model/ may include the control plane: model/ builds alone on GPU
machines (-DDGCA_MODEL_ONLY=ON). docs/architecture.md explains the layers.

Usage:
  tools/check_layers.py [--root DIR] [--dot FILE]   check; print the table
  tools/check_layers.py --self-test                 the checker catches a bad include

Exit 0 when every include goes down (or sideways within a folder), 1 with
one line per include that goes up.
"""
import argparse
import collections
import os
import re
import sys
import tempfile

# (folder, layer, what it is). Lower layers first.
LAYERS = [
    ("model/core", 0, "config, tokenizer, data, metrics, safetensors, memory model, exit codes"),
    ("model/cpu", 1, "CPU kernels and thread pool"),
    ("model/nn", 2, "BERT, ReLM prompts, DGCA heads, forward and backward"),
    ("model/comm", 2, "communicators: local, Gloo, NCCL"),
    ("model/train", 3, "AdamW, buckets, checkpoints, the training loop"),
    ("model/cuda", 4, "the CUDA backend: runtime, kernels, the model on the device"),
    ("model/cuda_check", 5, "checks of the CUDA backend against the CPU model"),
    ("model/cuda_emu", 5, "the CPU emulator of the CUDA runtime, cuBLASLt and NCCL"),
    ("model/tools", 6, "dgca-train, dgca-bench, dgca-model-check"),
    ("proto", 10, "the gRPC API (dgca/v1/*.proto) and the RPC glue (proto/rpc)"),
    ("topology", 11, "the node probe"),
    ("spec", 11, "the YAML job spec"),
    ("planner", 12, "plans, the cost and link models, diagnosis"),
    ("worker/agent", 13, "the node agent"),
    ("worker/rank", 13, "the rank runtime"),
    ("coordinator", 14, "the coordinator: scheduler, job store, server"),
    ("worker", 14, "dgca-worker's main"),
    ("cli", 14, "the dgca command"),
]
LAYER = {f: n for f, n, _ in LAYERS}
# Folders a test may include beyond its own layer's reach.
TEST_SUPPORT = {"model/cuda_check", "model/cuda_emu"}
SOURCE = re.compile(r"\.(cc|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    """The layer folder of a repository path ('' when none)."""
    if path.startswith("dgca/v1/"):
        return "proto"  # generated from proto/dgca/v1
    parts = path.split("/")
    if len(parts) >= 3 and "/".join(parts[:2]) in LAYER:
        return "/".join(parts[:2])
    return parts[0] if parts[0] in LAYER else ""


def check(root):
    """(violations, edges): edges[src][dst] = count of includes."""
    violations = []
    edges = collections.defaultdict(collections.Counter)
    for top in sorted({f.split("/")[0] for f in LAYER}):
        for d, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not SOURCE.search(name):
                    continue
                path = os.path.relpath(os.path.join(d, name), root)
                src = folder_of(path)
                if not src:
                    continue
                test = re.search(r"_test\.(cc|cu)$", name) is not None
                with open(os.path.join(root, path), errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    dst = folder_of(m.group(1))
                    if not dst or dst == src:
                        continue
                    edges[src][dst] += 1
                    ok = LAYER[dst] < LAYER[src]
                    if test and not ok:
                        ok = dst in TEST_SUPPORT or (src.startswith("model/") == dst.startswith("model/"))
                    if test and src.startswith("model/") and not dst.startswith("model/"):
                        ok = False  # model/ builds alone
                    if not ok:
                        line = text.count("\n", 0, m.start()) + 1
                        violations.append(
                            f"{path}:{line}: includes {m.group(1)} ({dst}, layer {LAYER[dst]}) "
                            f"from {src} (layer {LAYER[src]}): an include must go to a lower layer")
    return violations, edges


def table(edges):
    rows = [("FOLDER", "LAYER", "INCLUDES (headers)")]
    for f, n, _ in LAYERS:
        inc = ", ".join(f"{d} ({c})" for d, c in sorted(edges.get(f, {}).items(),
                                                       key=lambda kv: (LAYER[kv[0]], kv[0])))
        rows.append((f, str(n), inc or "-"))
    w = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]}" for r in rows)


def dot(edges):
    out = ["digraph layers {", "  rankdir=BT;", "  node [shape=box];"]
    for f, n, _ in LAYERS:
        out.append(f'  "{f}" [label="{f}\\nlayer {n}"];')
    for s in sorted(edges):
        for d in sorted(edges[s]):
            out.append(f'  "{s}" -> "{d}";')
    out.append("}")
    return "\n".join(out) + "\n"


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        write("planner/ok.cc", '#include "spec/spec.h"\n#include "model/core/status.h"\n')
        write("model/core/bad.cc", '#include <string>\n#include "planner/planner.h"\n')
        write("spec/bad.h", '#include "coordinator/scheduler.h"\n')
        write("model/cuda/x_test.cc", '#include "model/cuda_check/op_check.h"\n')
        write("model/train/y_test.cc", '#include "proto/rpc/rpc_util.h"\n')
        violations, _ = check(root)
        want = ["model/core/bad.cc:2:", "model/train/y_test.cc:1:", "spec/bad.h:1:"]
        got = sorted(v.split(" ")[0] for v in violations)
        if got != want:
            print("self-test FAILED: expected violations at", want, "got", got)
            return 1
    print("self-test: the checker flags the 3 planted upward includes and passes the rest")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--dot", help="also write the folder include graph (graphviz) here")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    violations, edges = check(os.path.abspath(args.root))
    print(table(edges))
    if args.dot:
        with open(args.dot, "w") as f:
            f.write(dot(edges))
    if violations:
        print(f"\n{len(violations)} include(s) going up a layer:")
        print("\n".join(violations))
        return 1
    print("\nevery include goes to its own folder or a lower layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
