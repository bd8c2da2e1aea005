"""mkdocs hooks: the site is made from the repository's own files, each kept in one place.

The manual is docs/*.md (the site's root); the README is the front page; the specification,
the benchmark pages and the changelog are pages at their repository paths (``PAGES``). Their
links are written for the repository, where they work as they are (on a code host, in an
editor), so each relative link is resolved against the repository and pointed at the page or
file that holds its target in the site:

* a page: the link to it, relative to the linking page;
* another repository file (a script, a manifest, a plot): the file is copied into the site;
* a folder: its index page if it has one, otherwise the link's text alone (a folder listing
  is not a page).

A link whose target is not in the repository is left as it is, so that ``mkdocs build
--strict`` reports it.

The docstrings name objects with reStructuredText roles (``:func:`save```), which Markdown
renders as the role's text and a code span: the API pages show the code span alone.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent
DOCS = "docs"
# repository files outside docs/ that are pages of the site: the site's path of each (a link
# to any other Markdown file outside docs/ is reported as broken: add the file here)
PAGES = {
    "README.md": "index.md",
    "spec/FORMAT.md": "spec/FORMAT.md",
    "spec/vectors/minimal.hexdump.md": "spec/vectors/minimal.hexdump.md",
    "benchmarks/RESULTS.md": "benchmarks/RESULTS.md",
    "benchmarks/HISTORY.md": "benchmarks/HISTORY.md",
    "benchmarks/README.md": "benchmarks/README.md",
    "CHANGELOG.md": "CHANGELOG.md",
}
# an inline link or image: ``[text](target)`` or ``[text](target "title")``
LINK = re.compile(r"!?\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]"
                  r"\((?P<target>[^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
# ":func:" + <code>~name</code>, as Markdown renders a docstring's :func:`~name`
ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):(<code>)~?")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")

# site path -> repository path of every page, filled by on_files
_repo_of: dict[str, str] = {}


def site_path(repo_path: str) -> str | None:
    """Where the repository file ``repo_path`` is in the site, if it is a page."""
    if repo_path in PAGES:
        return PAGES[repo_path]
    if repo_path.startswith(DOCS + "/"):
        return repo_path[len(DOCS) + 1:]
    return None


def index_pages(repo_dir: str) -> list[str]:
    """The site paths an index page of the repository folder ``repo_dir`` would have."""
    if repo_dir == DOCS or repo_dir.startswith(DOCS + "/"):
        repo_dir = repo_dir[len(DOCS) + 1:]
    return [posixpath.normpath(posixpath.join(repo_dir, name))
            for name in ("index.md", "README.md")]


def repo_target(page_repo_path: str, target: str) -> tuple[str, str] | None:
    """The repository path and the ``#anchor`` (or ``""``) a relative link of the page
    ``page_repo_path`` points at; None for an absolute URL, a bare anchor or a target above
    the repository."""
    if SCHEME.match(target) or target.startswith(("#", "/")):
        return None
    path, sep, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))
    if resolved == ".." or resolved.startswith("../"):
        return None
    return resolved, sep + anchor


def links(markdown: str):
    """The link matches of ``markdown`` outside fenced code blocks."""
    fenced = False
    offset = 0
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            for match in LINK.finditer(line):
                yield offset, match
        offset += len(line)


def on_files(files: Files, config: Any) -> Files:
    """Add the pages of ``PAGES`` and every non-page repository file a page links to."""
    _repo_of.clear()
    for file in files.documentation_pages():
        _repo_of[file.src_uri] = f"{DOCS}/{file.src_uri}"
    for repo_path, uri in PAGES.items():
        if files.get_file_from_path(uri) is not None:
            raise ValueError(f"{DOCS}/{uri} would hide {repo_path}: one source per page")
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / repo_path)))
        _repo_of[uri] = repo_path
    # plots, scripts and manifests the pages link to are copied into the site as they are
    for uri, repo_path in list(_repo_of.items()):
        text = (ROOT / repo_path).read_text(encoding="utf-8")
        for _, match in links(text):
            found = repo_target(repo_path, match["target"])
            if found is None or site_path(found[0]) is not None:
                continue
            source = ROOT / found[0]
            if (source.is_file() and source.suffix != ".md"
                    and files.get_file_from_path(found[0]) is None):
                files.append(File.generated(config, found[0], abs_src_path=str(source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point the page's repository links at the site's pages and files."""
    repo_path = _repo_of.get(page.file.src_uri)
    if repo_path is None:
        return markdown
    here = posixpath.dirname(page.file.src_uri)
    pieces, last = [], 0
    for offset, match in links(markdown):
        found = repo_target(repo_path, match["target"])
        if found is None:
            continue
        target, anchor = found
        uri = site_path(target) or target
        if (ROOT / target).is_dir():
            index = [uri for uri in index_pages(target) if files.get_file_from_path(uri)]
            if not index:  # a folder of the repository, not a page: keep the text
                start, end = offset + match.start(), offset + match.end()
                pieces += [markdown[last:start], match["text"]]
                last = end
                continue
            uri = index[0]
        elif files.get_file_from_path(uri) is None:
            continue  # not in the repository either: mkdocs reports the broken link
        new = posixpath.relpath(uri, here or ".") + anchor
        start, end = offset + match.start("target"), offset + match.end("target")
        pieces += [markdown[last:start], new]
        last = end
    pieces.append(markdown[last:])
    return "".join(pieces)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """Drop the reStructuredText role before each code span rendered from a docstring."""
    return ROLE.sub(r"\1", html)
