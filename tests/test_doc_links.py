"""Every file the README and docs/ link to or name under bench/results exists at HEAD: pruning
the results keeps what the documents cite, and a moved file breaks this test, not a reader."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # [text](target) and ![alt](target)
NAMED = re.compile(r"`(bench/results/[^`*<>\s]+)`")  # a path named in code quotes


def cited(doc: Path) -> list[tuple[str, Path]]:
    """(as written, resolved path) of every repository path `doc` links to or names under
    bench/results; web links and in-page anchors are not paths."""
    text = doc.read_text()
    out = [
        (t, (doc.parent / t).resolve())
        for t in LINK.findall(text)
        if "://" not in t and not t.startswith("mailto:")
    ]
    out += [(t, ROOT / t) for t in NAMED.findall(text)]
    return out


def test_every_results_path_the_documents_cite_exists() -> None:
    results = (ROOT / "bench" / "results").resolve()
    missing = [
        f"{doc.relative_to(ROOT)}: {written}"
        for doc in DOCS
        for written, path in cited(doc)
        if path.is_relative_to(results) and not path.exists()
    ]
    assert not missing, "cited but not in the tree (restore it or fix the link):\n" + "\n".join(
        missing
    )


def test_the_readme_links_resolve() -> None:
    """The README's links into the code, charts and results resolve (its links to docs/ pages
    are the pages' own business: each is written with the part it documents)."""
    readme = ROOT / "README.md"
    docs = (ROOT / "docs").resolve()
    missing = [w for w, p in cited(readme) if not p.exists() and p.parent != docs]
    assert not missing, f"README.md links to missing files: {missing}"


ANCHORED = re.compile(r"\]\(([^)\s]*\.md)?#([^)\s]+)\)")  # [text](page.md#anchor) or (#anchor)


def slugs(page: Path) -> set[str]:
    """The anchors a Markdown page's headings get (GitHub's rule: lower case, punctuation
    dropped, spaces to hyphens)."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_anchors_into_the_readme_and_docs_name_a_heading() -> None:
    broken = []
    for doc in DOCS:
        for page, anchor in ANCHORED.findall(doc.read_text()):
            target = (doc.parent / page).resolve() if page else doc
            if target.exists() and anchor not in slugs(target):
                broken.append(f"{doc.relative_to(ROOT)}: {page}#{anchor}")
    assert not broken, f"links to headings that do not exist: {broken}"
