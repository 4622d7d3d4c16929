#!/usr/bin/env python3
"""Checks the relative links of the project's Markdown: README.md and docs/**/*.md.

For every link `[text](target)`, image `![alt](target)` and reference definition `[id]: target`
outside fenced code blocks and code spans, a relative target must exist (a file or a directory,
relative to the linking file) and an anchor (`#anchor` in the same file, `file.md#anchor` in
another) must match a heading of the target file by GitHub's and mdBook's rule: lower case, spaces
to `-`, every other character but letters, digits, `-` and `_` dropped, a repeated heading given
`-1`, `-2`, ... Links to http(s) and mailto are skipped. Each broken link is printed as
`file:line: link: why`, and the exit status is 1 if there is any; otherwise a one-line summary and
exit status 0.

Usage: scripts/doc-links.py [FILE.md ...]   (default: README.md and docs/**/*.md)
"""

import os
import re
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# An inline link or image: [text](target) where the text may hold one level of brackets.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SKIP = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")  # http:, https:, mailto:, any scheme


def slug(text):
    """The anchor GitHub and mdBook give a heading."""
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = text.replace("`", "").lower()
    return "".join(c for c in text.replace(" ", "-") if c.isalnum() or c in "-_")


def lines_outside_fences(text):
    """(line number, line) for each line not inside a fenced code block."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)) :].strip():
            fence = None


_anchors = {}


def shown(path):
    """A path as printed: relative to the repository where it lies inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def anchors(path):
    """The anchors of a Markdown file's headings."""
    if path not in _anchors:
        seen = {}
        found = set()
        for _, line in lines_outside_fences(path.read_text(encoding="utf-8")):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def links(text):
    """(line number, target) of every link outside code."""
    for number, line in lines_outside_fences(text):
        line = CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line)
        for m in INLINE.finditer(line):
            yield number, m.group(1)
        m = REFERENCE.match(line)
        if m:
            yield number, m.group(1)


def check(path):
    """The broken links of one file, as (line, link, why)."""
    broken = []
    count = 0
    for number, target in links(path.read_text(encoding="utf-8")):
        count += 1
        link = target[1:-1] if target.startswith("<") and target.endswith(">") else target
        if not link or SKIP.match(link):
            continue
        part, _, anchor = link.partition("#")
        dest = path if not part else Path(os.path.normpath(path.parent / unquote(part)))
        if not dest.exists():
            broken.append((number, target, f"{shown(dest)} does not exist"))
            continue
        if anchor:
            if dest.is_dir() or dest.suffix.lower() != ".md":
                broken.append((number, target, f"an anchor into {dest.name}, which is not a Markdown file"))
            elif unquote(anchor) not in anchors(dest.resolve()):
                broken.append((number, target, f"no heading of {dest.name} has the anchor #{anchor}"))
    return count, broken


def main(argv):
    if argv:
        files = [Path(a).resolve() for a in argv]
    else:
        files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    total = 0
    bad = 0
    for path in files:
        count, broken = check(path)
        total += count
        for number, link, why in broken:
            bad += 1
            print(f"{shown(path)}:{number}: {link}: {why}")
    if bad:
        print(f"{bad} broken link(s) of {total} in {len(files)} Markdown files", file=sys.stderr)
        return 1
    print(f"doc-links: {total} links in {len(files)} Markdown files, every relative target and anchor found")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
