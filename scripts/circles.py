#!/usr/bin/env python3
"""Import circles between the source files of each crate: a file that takes a name from a file
that takes a name from it, directly or around a longer loop. Prints every circle with the names
that tie it and exits 1 if there is one (scripts/test.sh runs it), 0 otherwise.

    python3 scripts/circles.py [CRATE_DIR ...]     (default: every workspace crate)

A file's imports, read as text: `use` declarations and paths in the code that start at
`crate::`, `super::` or `self::`, or at a submodule the file declares (`mod x;` then `x::...`),
each resolved to the file that defines the module the path reaches; comments, doc comments,
string literals and the file's unit tests (`#[cfg(test)] mod tests`) are not read. A file
taking a name from a module that contains it (`super::Config`, `crate::Error` from a submodule)
is not counted: an enclosing module's file holds what its submodules share. Every other import
is, a parent's of its children included; so `scheme/staleness.rs -> engine/mod.rs ->
scheme/mod.rs -> scheme/staleness.rs` is a circle.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = ["kernels", "transport", "slurm", "core", "launch", "benches"]


def strip(text):
    """The code without comments, strings and the unit-test module."""
    cut = re.search(r"#\[cfg\(test\)\]\s*mod tests\b", text)
    if cut:
        text = text[: cut.start()]
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'r(#*)".*?"\1', '""', text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return text


def module_of(src, f):
    """Module path segments of file `f` under `src` (lib.rs and main.rs: [])."""
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def file_of(src, segments):
    """The file defining the deepest module along `segments` (and how many it used)."""
    cur, used = [], 0
    for s in segments:
        d = src.joinpath(*cur)
        if (d / f"{s}.rs").exists() or (d / s / "mod.rs").exists():
            cur.append(s)
            used += 1
        else:
            break
    if not cur:
        for root in ("lib.rs", "main.rs"):
            if (src / root).exists():
                return src / root
        return None
    d = src.joinpath(*cur[:-1])
    return d / f"{cur[-1]}.rs" if (d / f"{cur[-1]}.rs").exists() else src.joinpath(*cur) / "mod.rs"


def parent(src, f):
    """The file of the module that declares `f`'s module (None for the crate root)."""
    here = module_of(src, f)
    if not here:
        return None
    return file_of(src, here[:-1])


def ancestors(src, f):
    """The files of every module that contains `f`'s, up to the crate root."""
    out, p = [], parent(src, f)
    while p is not None:
        out.append(p)
        p = parent(src, p)
    return out


def use_paths(code):
    """Every path a `use` declaration names, braces expanded."""
    out = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        stack = [("", m.group(1).replace("\n", " "))]
        while stack:
            prefix, tree = stack.pop()
            tree = tree.strip()
            b = tree.find("{")
            if b < 0:
                for item in tree.split(","):
                    item = item.strip().split(" as ")[0].strip()
                    if item:
                        out.append(prefix + item)
                continue
            head, body = tree[:b], tree[b + 1 : tree.rfind("}")]
            depth, start, parts = 0, 0, []
            for i, c in enumerate(body):
                if c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                elif c == "," and depth == 0:
                    parts.append(body[start:i])
                    start = i + 1
            parts.append(body[start:])
            for p in parts:
                if p.strip():
                    stack.append((prefix + head, p))
    return out


def imports(src, f):
    """{target file: set of names} for file `f`."""
    code = strip(f.read_text())
    here = module_of(src, f)
    children = set(re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code, flags=re.M))
    paths = use_paths(code)
    body = re.sub(r"\buse\s+[^;]+;", " ", code)
    paths += re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", body)
    paths += [p for p in re.findall(r"(?<![:\w])(\w+(?:::\w+)+)", body) if p.split("::")[0] in children]
    out = {}
    for p in paths:
        segs = [s for s in p.split("::") if s]
        if not segs:
            continue
        if segs[0] == "crate":
            base, segs = [], segs[1:]
        elif segs[0] in ("super", "self"):
            base = list(here)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
        elif segs[0] in children:
            base = list(here)
        else:
            continue
        if not segs or segs == ["*"]:
            continue
        target = file_of(src, base + segs)
        if target is None or target == f or target in ancestors(src, f):
            continue
        out.setdefault(target, set()).add(segs[-1])
    return out


def circles(graph):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    crates = sys.argv[1:] or CRATES
    found = 0
    for c in crates:
        src = ROOT / c / "src"
        if not src.is_dir():
            continue
        files = sorted(src.rglob("*.rs"))
        graph = {f: imports(src, f) for f in files}
        for comp in circles(graph):
            found += 1
            rel = lambda p: str(p.relative_to(ROOT))
            print(f"circle {found}: {len(comp)} files: {', '.join(map(rel, comp))}")
            members = set(comp)
            for a in comp:
                for b, names in sorted(graph[a].items()):
                    if b in members:
                        print(f"  {rel(a)} -> {rel(b)}: {', '.join(sorted(names))}")
    if found:
        print(f"{found} import circle(s): break each (move what both sides need into a module that imports neither)")
        return 1
    print(f"no import circles in {', '.join(crates)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
