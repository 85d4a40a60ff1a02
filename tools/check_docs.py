#!/usr/bin/env python3
"""The documentation names only what exists.

Checks, from the repository root:
  1. every backquoted repository path in README.md and docs/*.md (a token
     that starts with one of the repository's top-level folders, such as
     `coordinator/scheduler.h` or `model/cuda_emu/`) exists;
  2. every docs/NAME.md that a source file, script or doc cites exists, and
     every section it cites in the form docs/NAME.md, "Section" is a heading
     of that page.

Usage: tools/check_docs.py [--root DIR] [--self-test]
Exit 0 when everything named exists, 1 with one line per dangling name.
"""
import argparse
import os
import re
import sys
import tempfile

TOKEN = re.compile(r"`([^`\n]+)`")
CITE = re.compile(r'docs/([A-Za-z0-9_.-]+\.md)(?:,?\s*(?://|#)?\s*\(?\s*"([^"\n]+)")?')
SOURCE_EXT = (".cc", ".h", ".cu", ".cuh", ".py", ".sh", ".txt", ".cmake", ".proto", ".yml",
              ".yaml", ".md", ".service")
SKIP_DIRS = {".git", "build", "__pycache__", ".dgca", ".gpu-data", ".gpu-e2e"}


def top_folders(root):
    return {d for d in os.listdir(root)
            if os.path.isdir(os.path.join(root, d)) and not d.startswith(".") and d not in SKIP_DIRS}


def headings(path):
    out = set()
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"#+\s+(.*?)\s*$", line)
            if m:
                out.add(m.group(1).strip())
    return out


def check(root):
    problems = []
    tops = top_folders(root)
    pages = [os.path.join(root, "README.md")]
    docs_dir = os.path.join(root, "docs")
    if os.path.isdir(docs_dir):
        pages += [os.path.join(docs_dir, f) for f in sorted(os.listdir(docs_dir)) if f.endswith(".md")]
    for page in pages:
        if not os.path.exists(page):
            continue
        rel = os.path.relpath(page, root)
        with open(page, errors="replace") as f:
            lines = f.read().split("\n")
        in_code = False
        for n, line in enumerate(lines, 1):
            if line.startswith("```"):
                in_code = not in_code
                continue
            if in_code:
                continue
            for tok in TOKEN.findall(line):
                tok = tok.strip()
                first = tok.split("/")[0]
                if "/" not in tok or first not in tops or " " in tok or "*" in tok or "{" in tok:
                    continue
                path = tok.split(":")[0].rstrip(".,;")
                if not os.path.exists(os.path.join(root, path)):
                    problems.append(f"{rel}:{n}: `{tok}` does not exist")
    # Citations of docs pages and their sections, anywhere in the tree.
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
        for name in files:
            if not name.endswith(SOURCE_EXT):
                continue
            path = os.path.join(d, name)
            if os.path.abspath(path) == os.path.abspath(__file__):
                continue  # its own examples
            with open(path, errors="replace") as f:
                text = f.read()
            for m in CITE.finditer(text):
                page = os.path.join(docs_dir, m.group(1))
                line = text.count("\n", 0, m.start()) + 1
                rel = os.path.relpath(path, root)
                if not os.path.exists(page):
                    problems.append(f"{rel}:{line}: cites docs/{m.group(1)}, which does not exist")
                elif m.group(2) and m.group(2) not in headings(page):
                    problems.append(f'{rel}:{line}: cites docs/{m.group(1)}, "{m.group(2)}": no such '
                                    f"heading there")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "model"))
        with open(os.path.join(root, "model", "a.h"), "w") as f:
            f.write('// see docs/x.md, "Real"\n// and docs/x.md, "Missing"\n// docs/gone.md\n')
        with open(os.path.join(root, "docs", "x.md"), "w") as f:
            f.write("# X\n## Real\n`model/a.h` and `model/nope.h`\n")
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("`docs/x.md`\n")
        got = sorted(p.split(": ")[0] for p in check(root))
        want = ["docs/x.md:3", "model/a.h:2", "model/a.h:3"]
        if got != want:
            print("self-test FAILED: expected problems at", want, "got", got, check(root))
            return 1
    print("self-test: a missing path, a missing section and a missing page are all flagged")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    problems = check(os.path.abspath(args.root))
    if problems:
        print("\n".join(problems))
        print(f"\n{len(problems)} dangling name(s) in the documentation or its citations")
        return 1
    print("every path the docs name exists, and every cited docs page and section too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
