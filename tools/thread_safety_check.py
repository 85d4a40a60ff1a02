#!/usr/bin/env python3
"""Clang's thread-safety analysis over every source that declares lock annotations.

The control plane guards its state with absl::Mutex and ABSL_GUARDED_BY,
libdgca_model with dgca::Mutex and DGCA_GUARDED_BY (model/core/mutex.h). GCC
ignores the annotations; this check compiles each annotated source with
clang++ -fsyntax-only -Wthread-safety -Werror, using the flags CMake recorded
in BUILD_DIR/compile_commands.json, so that reading a guarded member without
its lock fails the build's tests.

Usage: tools/thread_safety_check.py [--build DIR] [--jobs N] [--self-test]
Exit 0 when every file passes (or, with a reason, 77 when clang++ is missing),
1 when the analysis reports a problem.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ANNOTATED = re.compile(r'#include "(absl/synchronization/mutex\.h|model/core/mutex\.h)"')
FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Wthread-safety-beta", "-Werror=thread-safety",
         "-Wno-unknown-warning-option"]


REPO_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
MARKS = re.compile(r"GUARDED_BY|LOCKS_REQUIRED|LOCKS_EXCLUDED|DGCA_REQUIRES")


def annotated(text, root):
    """Whether `text` or a repository header it includes uses lock annotations."""
    if ANNOTATED.search(text) or MARKS.search(text):
        return True
    for inc in REPO_INCLUDE.findall(text):
        header = os.path.join(root, inc)
        if os.path.isfile(header):
            with open(header, errors="replace") as f:
                if MARKS.search(f.read()):
                    return True
    return False


def clang():
    for name in ("clang++", "clang++-14", "clang++-15", "clang++-16"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def command_for(entry, cxx):
    args = entry.get("arguments") or shlex.split(entry["command"])
    out, skip = [cxx], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-fno-tree"):
            continue
        out.append(a)
    return out + FLAGS


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stderr


def self_test(cxx):
    """A guarded member read without its lock must fail the check."""
    src = r'''
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
struct Counter {
  absl::Mutex mu;
  int n ABSL_GUARDED_BY(mu) = 0;
  int Read() { return n; }  // no lock: the analysis must object
};
int main() { Counter c; return c.Read(); }
'''
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "unlocked.cc")
        with open(path, "w") as f:
            f.write(src)
        rc, err = run([cxx, "-std=gnu++17"] + FLAGS + [path], d)
        if rc == 0 or "requires holding mutex" not in err:
            print("self-test FAILED: an unlocked read of a guarded member passed:\n" + err)
            return 1
    print("self-test: an unlocked read of an ABSL_GUARDED_BY member fails the check")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.environ.get("DGCA_BUILD_DIR", "build"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    cxx = clang()
    if cxx is None:
        print("thread_safety_check: skipped: no clang++ on PATH (tools/install-deps.sh installs "
              "clang)")
        return 77
    if args.self_test:
        return self_test(cxx)
    db_path = os.path.join(args.build, "compile_commands.json")
    with open(db_path) as f:
        db = json.load(f)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    todo, seen = [], set()
    for e in db:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if path in seen or not path.endswith(".cc") or path.endswith("_test.cc"):
            continue
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        # The file, or a header of this repository it includes, declares
        # lock annotations (a scheduler_*.cc through coordinator/scheduler.h).
        if not annotated(text, root):
            continue
        seen.add(path)
        todo.append((path, command_for(e, cxx), e["directory"]))
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for (path, _, _), (rc, err) in zip(todo, pool.map(lambda t: run(t[1], t[2]), todo)):
            rel = os.path.relpath(path)
            if rc != 0:
                failures += 1
                print(f"FAIL {rel}\n{err}")
            else:
                print(f"ok   {rel}")
    print(f"\n{len(todo) - failures} of {len(todo)} annotated source(s) pass clang -Wthread-safety")
    return 1 if failures or not todo else 0


if __name__ == "__main__":
    sys.exit(main())
