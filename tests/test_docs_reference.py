"""The API reference of the documentation site (docs/reference/) shows every public name of
the package faces. mkdocstrings reads the code statically and cannot see through the lazy
faces, so those pages name each object's own module; a name added to a face and not to its
page would be missing from the site without any build warning."""
import importlib
import importlib.util
import os
import re

import pytest

import inshrink
from kit import ROOT

REFERENCE = os.path.join(ROOT, "docs", "reference")
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def documented(page: str) -> set[str]:
    """The objects a reference page renders (its ``::: path`` directives)."""
    with open(os.path.join(REFERENCE, page), encoding="utf-8") as f:
        return set(DIRECTIVE.findall(f.read()))


def test_the_package_face_page_names_every_public_name():
    # the errors have their own page (inshrink.errors, rendered whole)
    names = {name for name in inshrink.__all__ if name != "__version__"
             and not (isinstance(getattr(inshrink, name), type)
                      and issubclass(getattr(inshrink, name), Exception))}
    assert {"save", "File", "Series"} <= names
    # a lazy face too: each name by its own module
    expected = {f"{importlib.util.resolve_name(inshrink._NAMES[name], 'inshrink')}.{name}"
                for name in names}
    page = documented("inshrink.md")
    # a name re-exported by a package face (inshrink.search) is documented where it is defined
    assert all(any(p.endswith("." + e.rsplit(".", 1)[1]) and p.startswith(e.rsplit(".", 1)[0])
                   for p in page) for e in expected), expected - page


@pytest.mark.parametrize("face,page", [("inshrink.torch", "torch.md"),
                                       ("inshrink.dcp", "dcp.md"),
                                       ("inshrink.transformers", "transformers.md")])
def test_a_lazy_face_page_names_each_name_in_its_module(face, page):
    module = importlib.import_module(face)  # the face alone: no torch import
    expected = {f"{importlib.util.resolve_name(module._NAMES[name], face)}.{name}"
                for name in module.__all__}
    assert expected
    assert not expected - documented(page)


@pytest.mark.parametrize("module,page", [("inshrink.errors", "errors.md"),
                                         ("inshrink.numcodecs", "numcodecs.md"),
                                         ("inshrink.zarr", "zarr.md"),
                                         ("inshrink.lightning", "lightning.md")])
def test_a_module_page_renders_the_whole_module(module, page):
    assert module in documented(page)
