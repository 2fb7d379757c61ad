#!/usr/bin/env python3
"""Writes docs/reference/<binary>.md from each binary's --help, or checks that they agree.

  tools/docs/flag_reference.py --out docs/reference NAME=PATH ...          write the pages
  tools/docs/flag_reference.py --out docs/reference --check NAME=PATH ...  exit 1 on drift

Each page is the binary's --help output verbatim under a short header, so the reference can
only say what the binary says. `make docs-reference` writes them; the ctest `flag_reference`
runs --check against the built binaries (and `flag_reference_self_test` checks that a changed
flag is caught).
"""
import argparse
import difflib
import os
import subprocess
import sys
import tempfile

HEADER = """# `{name}` flags

Generated from `{name} --help` by `tools/docs/flag_reference.py`: do not edit; `make
docs-reference` writes it again, and the `flag_reference` test fails when it differs from the
binary.

```text
"""


def page(name, path):
    env = dict(os.environ)
    # Defaults some flags read from the environment must not leak into the page.
    for var in ("LLM_API_KEY", "LLM_CLUSTER_SECRET"):
        env.pop(var, None)
    r = subprocess.run([path, "--help"], capture_output=True, text=True, env=env, timeout=60)
    if r.returncode != 0:
        sys.exit(f"{name} --help exited with {r.returncode}: {r.stderr.strip()}")
    text = r.stdout if r.stdout.strip() else r.stderr
    return HEADER.format(name=name) + text.rstrip("\n") + "\n```\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the directory of the pages")
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    ap.add_argument("--self-test", action="store_true",
                    help="check that a page that differs from its binary is reported")
    ap.add_argument("binaries", nargs="+", metavar="NAME=PATH")
    args = ap.parse_args()
    pages = {}
    for spec in args.binaries:
        name, _, path = spec.partition("=")
        if not name or not path:
            sys.exit(f"expected NAME=PATH, got {spec!r}")
        pages[name] = page(name, path)

    if args.self_test:
        # A page with one flag's help changed must be reported, naming the file.
        name, text = next(iter(pages.items()))
        with tempfile.TemporaryDirectory() as d:
            for n, t in pages.items():
                with open(os.path.join(d, n + ".md"), "w") as f:
                    f.write(t.replace("  --", "  --renamed-", 1) if n == name else t)
            if not drift(d, pages):
                sys.exit("self-test: a changed page was not reported")
        print("self-test: a changed page is reported")
        return

    if args.check:
        if drift(args.out, pages):
            sys.exit("the flag reference differs from the binaries; run `make docs-reference` "
                     "and commit docs/reference/")
        print(f"{len(pages)} flag reference pages agree with their binaries")
        return
    os.makedirs(args.out, exist_ok=True)
    for name, text in pages.items():
        with open(os.path.join(args.out, name + ".md"), "w") as f:
            f.write(text)
    print(f"wrote {len(pages)} pages to {args.out}")


def drift(directory, pages):
    """Prints a diff for each page that is missing or differs; True when any does."""
    found = False
    for name, want in pages.items():
        path = os.path.join(directory, name + ".md")
        have = open(path).read() if os.path.exists(path) else ""
        if have != want:
            found = True
            sys.stdout.writelines(difflib.unified_diff(
                have.splitlines(True), want.splitlines(True), path, f"{name} --help"))
    return found


if __name__ == "__main__":
    main()
