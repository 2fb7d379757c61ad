#!/usr/bin/env python3
"""Checks the relative links of README.md and docs/**/*.md; exits 1 listing the broken ones.

  tools/docs/check_links.py [--root REPO]        check the repository's pages
  tools/docs/check_links.py --self-test          check that a broken link is reported

A link is every inline link or image, `[text](target)` or `![alt](target)`, and every
reference definition, `[name]: target`, outside fenced code blocks and code spans. Links with a
scheme (https:, mailto:) are not followed. A relative target must name a file or directory
that exists, relative to the page; a `#anchor` into a markdown page (or into the page itself)
must name one of its headings, spelled as GitHub spells heading anchors (lower case, spaces
to hyphens, punctuation other than '-' and '_' dropped, -1, -2 ... for repeats). The ctest
`docs_links` runs the check and `docs_links_self_test` the self-test (tests/docs).
"""
import argparse
import os
import re
import sys
import tempfile

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target "title") or ![alt](target); the text may hold one level of brackets and
# line breaks (pages are wrapped).
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages(root):
    found = [os.path.join(root, "README.md")]
    for base, dirs, files in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        found += [os.path.join(base, f) for f in sorted(files) if f.endswith(".md")]
    return [p for p in found if os.path.isfile(p)]


def outside_fences(text):
    """The text with fenced code blocks blanked (offsets and lines kept)."""
    out, fenced = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fenced:
            if m and m.group(1) == fenced:
                fenced = None
            out.append(" " * len(line))
        elif m:
            fenced = m.group(1)
            out.append(" " * len(line))
        else:
            out.append(line)
    return "\n".join(out)


def prose(text):
    """The text with fenced code blocks and code spans blanked (offsets and lines kept)."""
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), outside_fences(text))


def slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "")
    text = re.sub(r"[*_]{1,3}(\S(?:.*?\S)?)[*_]{1,3}", r"\1", text)  # emphasis markers
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache):
    if path not in cache:
        seen, found = {}, set()
        with open(path, encoding="utf-8") as f:
            for line in outside_fences(f.read()).split("\n"):
                m = HEADING.match(line)
                if not m:
                    continue
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def links(text):
    """(line number, target) of every link in the page's prose."""
    body = prose(text)
    for regex in (INLINE, REFERENCE):
        for m in regex.finditer(body):
            yield body.count("\n", 0, m.start(1)) + 1, m.group(1)


def check(root):
    """Returns the broken links as 'page:line: target (why)' lines."""
    broken, cache = [], {}
    for page in pages(root):
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for line, target in links(text):
            if SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            path = path.split("?")[0]
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            where = f"{os.path.relpath(page, root)}:{line}: {target}"
            if not os.path.exists(resolved):
                broken.append(f"{where} (no such file: {os.path.relpath(resolved, root)})")
            elif anchor and resolved.endswith(".md") and os.path.isfile(resolved):
                if anchor not in anchors(resolved, cache):
                    broken.append(f"{where} (no heading #{anchor} in "
                                  f"{os.path.relpath(resolved, root)})")
    return broken


def self_test():
    """A page with a missing file, a missing anchor and a link inside code: two reported."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs", "a"))
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("# Top\n\nSee [the page](docs/a/page.md#a-heading-with-code) and\n"
                    "[a missing\npage](docs/missing.md), `[in code](nowhere.md)`.\n\n"
                    "```\n[in a block](nowhere.md)\n```\n")
        with open(os.path.join(root, "docs", "a", "page.md"), "w") as f:
            f.write("# Page\n\n## A heading, with `code`\n\n[up](../../README.md#top) "
                    "[self](#page) [bad](#no-such-heading) [web](https://example.com/x)\n")
        got = check(root)
        want = ["README.md:5: docs/missing.md (no such file: docs/missing.md)",
                "docs/a/page.md:5: #no-such-heading (no heading #no-such-heading in "
                "docs/a/page.md)"]
        if sorted(got) != sorted(want):
            print("self-test failed: reported\n  " + "\n  ".join(got) + "\nexpected\n  " +
                  "\n  ".join(want))
            return 1
    print("self-test passed: the broken links were reported, the good ones were not")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), help="the repository (default: this script's)")
    ap.add_argument("--self-test", action="store_true", help="check the checker")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    broken = check(args.root)
    checked = len(pages(args.root))
    if broken:
        print(f"{len(broken)} broken link(s) in {checked} pages:")
        print("\n".join(broken))
        return 1
    print(f"all relative links of {checked} pages resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
