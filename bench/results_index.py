"""Why each tracked file under bench/results is kept at HEAD, and which are referenced by nothing.

    python bench/results_index.py              # totals: kept vs unreferenced (files, MB)
    python bench/results_index.py --list       # every tracked file: KEEP <why> | DROP
    python bench/results_index.py --unreferenced -0 | xargs -0 git rm -q --   # prune

The rule (docs/results.md, "What bench/results keeps"): bench/results holds what the documents
cite, what the tests and `horizonserve calibrate rebuild` read, and what the bench scripts read
to regenerate a cited figure. A file is kept when it is reached from one of these roots:

* documents: README.md, docs/*.md and runtime/**/README.md; their Markdown links and the
  `bench/results/...` paths they name in code quotes. A cited folder keeps the whole folder
  (`bench/results/` itself: its README, the folder's index);
* code: .py, .sh and data files under tests/, runtime/ and bench/ (outside bench/results):
  every `bench/results/...` path they name (strings, comments), and the paths their Python
  builds with `/` from such a string (`ROOT / "bench/results/x" / "y"`; an operand the script
  cannot evaluate, a loop or parametrize variable, matches the module's string constants). A
  path naming an item inside a campaign (`.../qwen-ship-v1/r10/horizon`) keeps the campaign.
  A folder that holds many campaigns (`h200-eval/`, a top-level folder, `eval-vN/`) named in
  code keeps nothing by itself: code reads campaigns, not collections;

and then, for every kept file:

* a symbolic link keeps its target (a report's `sNN` session, its `plan.json.gz`);
* a kept Markdown file's links and named paths are followed like a document's;
* its unit is kept whole: a report folder (`h200-eval/<campaign>/`) and a device session
  (`h200-eval/eval-vN/<id>/`) are regenerated from all their files (bench/eval/report.py reads
  the plan, every session's records and step traces), and any other first-level folder of a
  result area (`sim/<sweep>/`, `calibration/<run>/`, ...) is one run.

Standard library only; reads the working tree of the tracked files (`git ls-files`).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "bench/results"
DOCS_GLOBS = ("README.md", "docs/*.md", "runtime/**/README.md")
CODE_DIRS = ("tests", "runtime", "bench")
CODE_SUFFIXES = {".py", ".sh", ".json", ".yaml", ".yml", ".toml", ".txt", ".md"}
# Folders of session folders: their children, not they, are the units.
SESSION_CONTAINERS = re.compile(r"^bench/results/h200-eval/eval-v\d+$")

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # [text](target), ![alt](target)
NAMED = re.compile(r"`(bench/results/[^`<>\s]+)`")  # a path in code quotes (may hold globs)
MENTION = re.compile(r"bench/results(?:/[A-Za-z0-9_.*?{}<>=+-]+)*/?")  # in code text
RELATIVE = re.compile(r"(?<![\w/.-])((?:\.\./)*[\w.-]+(?:/[\w.-]+)+/?)")  # a/b, ../a/b.json
PLACEHOLDER = re.compile(r"[<>{}]|\b(?:RUN|NAME|ID|CAMPAIGN|DIR|OUT|X|N)\b")
ROOT_NAMES = {"ROOT", "REPO", "REPO_ROOT", "REPOSITORY", "HERE", "TOP"}


@dataclass
class Tree:
    """The tracked files under bench/results: sizes (as `du -b` counts them) and symlinks."""

    size: dict[str, int]
    links: dict[str, str]  # a tracked symlink -> its target, repository-relative
    dirs: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, root: Path = ROOT) -> Tree:
        out = subprocess.run(
            ["git", "ls-files", "-s", "-z", RESULTS], cwd=root, capture_output=True, check=True
        ).stdout.decode()
        size: dict[str, int] = {}
        links: dict[str, str] = {}
        for entry in filter(None, out.split("\0")):
            meta, path = entry.split("\t", 1)
            size[path] = (root / path).lstat().st_size
            if meta.startswith("120000"):
                target = os.readlink(root / path)
                links[path] = os.path.normpath(os.path.join(os.path.dirname(path), target))
        dirs = {str(p) for f in size for p in PurePosixPath(f).parents if str(p) != "."}
        return cls(size, links, dirs)

    def under(self, folder: str) -> list[str]:
        prefix = folder.rstrip("/") + "/"
        return [f for f in self.size if f.startswith(prefix)]

    def is_collection(self, path: str) -> bool:
        """bench/results, a top-level result area, or a folder of session folders."""
        depth = len(PurePosixPath(path).parts)
        return path in self.dirs and (depth <= 3 or bool(SESSION_CONTAINERS.match(path)))

    def unit(self, path: str) -> str:
        """The folder regenerated as a whole with `path`, or `path` when it stands alone."""
        parts = PurePosixPath(path).parts  # ('bench', 'results', area, ...)
        if len(parts) >= 5:
            first = "/".join(parts[:4])
            if SESSION_CONTAINERS.match(first):
                return "/".join(parts[:5]) if len(parts) >= 6 else path
            return first
        return path


def _match(tree: Tree, pattern: str) -> set[str]:
    """Tracked files and folders matching a glob (a folder matches all its files)."""
    hits = {f for f in tree.size if fnmatch.fnmatchcase(f, pattern)}
    for d in tree.dirs:
        if fnmatch.fnmatchcase(d, pattern):
            hits.update(tree.under(d))
    return hits


def resolve(tree: Tree, path: str, *, code: bool) -> tuple[set[str], str | None]:
    """The tracked files a reference to `path` (repository-relative) keeps, and, when it keeps
    nothing, why. Follows tracked symlinks along the way (keeping them)."""
    path = os.path.normpath(path.rstrip("/"))
    if not path.startswith(RESULTS):
        return set(), None
    if any(c in path for c in "*?["):
        hits = _match(tree, path)
        return hits, None if hits else "no tracked path matches"
    if path == RESULTS:  # the folder's index
        return {f"{RESULTS}/README.md"} & tree.size.keys(), None
    kept: set[str] = set()
    parts = PurePosixPath(path).parts
    current = ""
    for i, part in enumerate(parts):
        current = f"{current}/{part}" if current else part
        if current in tree.links:  # a symlinked session or plan: keep the link, follow it
            kept.add(current)
            rest = "/".join(parts[i + 1 :])
            target = tree.links[current]
            more, why = resolve(tree, f"{target}/{rest}" if rest else target, code=code)
            return kept | more, why
        if current in tree.size:
            if i == len(parts) - 1:
                return {current}, None
            return set(), "names a path inside a file"
        if current not in tree.dirs and i == len(parts) - 1:
            # Committed compressed: a plan as X.json.gz, a finished session's records as .xz
            # (bench/eval/compaction.py); the readers take either name.
            for alt in (f"{current}.gz", re.sub(r"\.jsonl\.gz$", ".jsonl.xz", current)):
                if alt in tree.size or alt in tree.links:
                    return resolve(tree, alt, code=code)
        if current not in tree.dirs:
            # `current` does not exist: the longest existing folder is what it names (a campaign
            # item such as .../r10/horizon), unless that folder is a collection.
            folder = str(PurePosixPath(*parts[:i])) if i else ""
            if not folder or tree.is_collection(folder):
                return set(), "not in the tree"
            return set(tree.under(folder)), None
    if code and tree.is_collection(path):
        return set(), "a collection of campaigns (code reads campaigns, not collections)"
    return set(tree.under(path)), None


# -- reading references ---------------------------------------------------------------------


def markdown_links(path: Path, text: str) -> Iterator[str]:
    """Repository-relative targets of a Markdown file's links (`path` in the working tree)."""
    rel_dir = os.path.dirname(os.path.relpath(path, ROOT))
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        # Resolved by name, not through symlinks: a kept link is followed by its own rule.
        yield os.path.normpath(os.path.join(rel_dir, target))


def markdown_named(tree: Tree, path: Path, text: str) -> Iterator[str]:
    """Result paths a Markdown file names without linking them: `bench/results/...` anywhere
    (code quotes, commands in code blocks) and, for a file under bench/results, the files of
    its own folder it names by their path relative to it (a run's README naming `fit.sh`)."""
    yield from NAMED.findall(text)
    yield from text_mentions(text)
    rel = os.path.relpath(path, ROOT)
    # `eval-v5/q28`, `../eval-v5/bracket-qwen-sim.json`: relative to the file's folder, else
    # the tail of exactly one tracked path.
    for token in set(RELATIVE.findall(text)):
        if token.startswith(RESULTS):
            continue
        here = os.path.normpath(os.path.join(os.path.dirname(rel), token.rstrip("/")))
        if here in tree.size or here in tree.dirs or here in tree.links:
            yield here
            continue
        tail = "/" + token.strip("./").rstrip("/")
        hits = [f for f in (*tree.size, *tree.dirs) if f.endswith(tail)]
        if len(hits) == 1:
            yield hits[0]
    if rel.startswith(RESULTS + "/"):
        folder = os.path.dirname(rel)
        for f in tree.under(folder):
            local = f[len(folder) + 1 :]
            if re.search(rf"(?<![\w./-]){re.escape(local)}(?![\w-])", text):
                yield f


def text_mentions(text: str) -> Iterator[str]:
    """`bench/results/...` paths named anywhere in a code file, placeholders dropped."""
    for m in MENTION.findall(text):
        m = m.rstrip(".")
        cut = PLACEHOLDER.search(m)
        if cut:  # `bench/results/h200-eval/RUN/plan.json`: only the part before RUN is a path
            m = m[: m.rfind("/", 0, cut.start())]
        yield m


class _PathEval:
    """Paths a Python module builds with `/` from string constants (see the module doc)."""

    WILD = "\0"

    def __init__(self, tree: ast.Module, rel: str) -> None:
        self.rel = rel  # the module's repository-relative path
        self.env: dict[str, str] = {}
        self.strings = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and "/" not in n.value
        }
        for node in ast.walk(tree):  # names bound to a path, in source order
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = self.value(node.value) if node.value is not None else None
                for t in targets:
                    if isinstance(t, ast.Name) and value is not None:
                        self.env[t.id] = value
        self.paths: list[str] = []
        parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(tree):
            parent = parents.get(id(node))
            if (
                isinstance(parent, ast.BinOp)
                and isinstance(parent.op, ast.Div)
                and parent.left is node
            ):
                continue  # only the whole join is a reference
            if isinstance(node, ast.BinOp | ast.Name):
                if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                    continue
                value = self.value(node)
                if value and value.startswith(RESULTS):
                    self.paths.append(value)

    def value(self, node: ast.AST) -> str | None:
        """'' for the repository root, a relative path, a path with WILD parts, or None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            return "" if node.id in ROOT_NAMES else self.WILD
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = self.value(node.left), self.value(node.right)
            if left is None or right is None or left == self.WILD:
                return None
            return f"{left}/{right}" if left else right
        if isinstance(node, ast.Call | ast.Attribute | ast.Subscript):
            # Path(__file__).resolve().parents[n] / .parent.parent: a folder of this module's.
            src = ast.unparse(node)
            if "__file__" in src:
                up = re.search(r"\.parents\[(\d+)\]$", src)
                levels = int(up.group(1)) + 1 if up else src.count(".parent")
                if levels:
                    folder = PurePosixPath(self.rel)
                    for _ in range(levels):
                        folder = folder.parent
                    return "" if str(folder) == "." else str(folder)
        return None

    def expand(self, tree: Tree, value: str) -> Iterator[str]:
        """A built path; a WILD part matches the module's string constants naming a child."""
        if self.WILD not in value:
            yield value
            return
        head, _, tail = value.partition(self.WILD)
        folder = head.rstrip("/")
        for name in self.strings:
            candidate = f"{folder}/{name}"
            if candidate in tree.dirs or candidate in tree.size:
                yield from self.expand(tree, candidate + tail)


def code_refs(tree: Tree, path: Path, text: str) -> Iterator[str]:
    yield from text_mentions(text)
    if path.suffix == ".py":
        try:
            module = ast.parse(text)
        except SyntaxError:
            return
        ev = _PathEval(module, os.path.relpath(path, ROOT))
        for value in ev.paths:
            yield from ev.expand(tree, value)


def tracked(root: Path, *specs: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *specs], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    return [root / p for p in filter(None, out.split("\0"))]


# -- the index ------------------------------------------------------------------------------


@dataclass
class Index:
    tree: Tree
    why: dict[str, list[str]] = field(default_factory=dict)  # kept file -> its reasons
    dangling: list[str] = field(default_factory=list)  # references that keep nothing

    def kept_bytes(self) -> int:
        return sum(self.tree.size[f] for f in self.why)

    def unreferenced(self) -> list[str]:
        return sorted(set(self.tree.size) - self.why.keys())


def build(root: Path = ROOT) -> Index:
    tree = Tree.load(root)
    index = Index(tree)
    todo: list[str] = []

    def keep(files: Iterable[str], reason: str) -> None:
        for f in files:
            reasons = index.why.setdefault(f, [])
            if not reasons:
                todo.append(f)
            if reason not in reasons:
                reasons.append(reason)

    def cite(ref: str, source: str, *, code: bool) -> None:
        files, why = resolve(tree, ref, code=code)
        if why and ref.startswith(RESULTS):
            index.dangling.append(f"{source}: {ref} ({why})")
        keep(files, source)

    def read_markdown(path: Path, source: str) -> None:
        text = path.read_text()
        for ref in markdown_links(path, text):
            cite(ref, source, code=False)  # a linked folder is cited whole
        for ref in markdown_named(tree, path, text):
            cite(ref, source, code=True)  # a folder named in prose may hold many campaigns

    docs = sorted({p for g in DOCS_GLOBS for p in root.glob(g) if "results" not in p.parts})
    for doc in docs:
        read_markdown(doc, str(doc.relative_to(root)))
    results_dir = root / RESULTS
    for f in tracked(root, *CODE_DIRS):
        if f.suffix not in CODE_SUFFIXES or f.is_relative_to(results_dir) or f in docs:
            continue
        if f.suffix == ".md" and not f.is_relative_to(root / "tests"):
            continue  # other Markdown under runtime/ and bench/ is not a root
        rel = str(f.relative_to(root))
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for ref in code_refs(tree, f, text):
            cite(ref, rel, code=True)

    commands = list(command_lines(root, tree))
    while todo:  # the closure over links, Markdown, units and the commands behind kept files
        while todo:
            f = todo.pop()
            if f in tree.links:
                cite(tree.links[f], f"link {f}", code=False)
            elif f.endswith(".md"):
                read_markdown(root / f, f)
            elif f.endswith(".py"):  # an analysis script beside its results: what it reads
                for ref in code_refs(tree, root / f, (root / f).read_text()):
                    cite(ref, f, code=True)
            if f.endswith(".json") and (fit := f.removesuffix(".json") + ".fit.json") in tree.size:
                keep([fit], f"per-item table of {f} (calibrate fit writes both)")
            unit = tree.unit(f)
            if unit != f:
                keep(tree.under(unit), f"unit {unit}/")
        for source, outputs, inputs in commands:  # a kept output keeps what made it
            made = [
                o for o in outputs if any(k in index.why for k in resolve(tree, o, code=True)[0])
            ]
            if made:
                for ref in inputs:
                    cite(ref, f"{source}: the command writing {made[0]}", code=True)
    return index


OUT_FLAG = re.compile(r"(?:--out(?:put)?[= ]|>\s*)(bench/results/\S+)")


def command_lines(root: Path, tree: Tree) -> Iterator[tuple[str, list[str], list[str]]]:
    """(file, outputs, inputs) of each command recorded under bench/results (COMMAND.txt, a
    README's code, a script) that writes a result by its literal path: `--out P` or `> P`."""
    for f in tree.size:
        if f in tree.links or not f.endswith((".txt", ".md", ".sh")):
            continue
        try:
            text = (root / f).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for line in text.replace("\\\n", " ").splitlines():
            outputs = OUT_FLAG.findall(line)
            if outputs:
                inputs = [m for m in text_mentions(line) if m not in outputs]
                yield f, outputs, inputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="every tracked file and why it is kept")
    ap.add_argument("--unreferenced", action="store_true", help="print only unreferenced files")
    ap.add_argument("-0", dest="nul", action="store_true", help="NUL-separated (for xargs -0)")
    ap.add_argument("--dangling", action="store_true", help="references that keep nothing")
    args = ap.parse_args(argv)
    index = build()
    tree = index.tree
    end = "\0" if args.nul else "\n"
    if args.unreferenced:
        for f in index.unreferenced():
            sys.stdout.write(f + end)
        return 0
    if args.list:
        for f in sorted(tree.size):
            reasons = index.why.get(f)
            print(f"KEEP {f}  <- {'; '.join(reasons[:3])}" if reasons else f"DROP {f}")
    if args.dangling:
        for d in index.dangling:
            print(f"dangling: {d}")
    dropped = index.unreferenced()
    mb = 1e6
    total = sum(tree.size.values())
    print(f"tracked      {len(tree.size):5d} files {total / mb:7.2f} MB")
    print(f"kept         {len(index.why):5d} files {index.kept_bytes() / mb:7.2f} MB")
    print(f"unreferenced {len(dropped):5d} files {(total - index.kept_bytes()) / mb:7.2f} MB")
    by_area: dict[str, list[int]] = {}
    for f in dropped:
        area = "/".join(PurePosixPath(f).parts[2:4])
        by_area.setdefault(area, [0, 0])
        by_area[area][0] += 1
        by_area[area][1] += tree.size[f]
    for area, (n, b) in sorted(by_area.items(), key=lambda kv: -kv[1][1]):
        print(f"  unreferenced {area:40s} {n:4d} files {b / mb:6.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
