"""Sphinx configuration of Bagua's documentation.

The build imports the Python packages but never the compiled extension:
``bagua_core._C`` is a stand-in (``_ext/extension_stub.py``), so the docs
build without a compiler. Pages that
must follow the code (settings, API reference, benchmark results) are
generated at build time by ``_ext/bagua_docs.py``.
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

project = "Bagua"
author = "Bagua contributors"
copyright = "Bagua contributors"

import extension_stub  # noqa: E402  (needs the path above)

extension_stub.install()

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "bagua_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_generated", "requirements.txt"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Docstrings refer to private helpers and third-party types: a Python
# reference without a target is not an error (not nitpicky). A link to a
# missing page or heading is (myst.xref_missing, with -W), and so is a
# public name without a docstring (_ext/bagua_docs.py).
nitpicky = False
# Generated parts are included below a page's title, so they start at H2.
suppress_warnings = ["myst.header"]

html_theme = "furo"
html_title = "Bagua"
html_static_path = ["_static"]
html_css_files = ["tables.css"]
