"""What the documentation promises about itself, checked without building it
(``make docs`` builds it): the README is short, keeps the two set-up commands
and links to files that exist, its generated blocks match the code and
``benchmarks/results``, every public name has a docstring, every registered
algorithm has a section, and the docs' stand-in for the extension reads the
bindings' classes."""

import importlib.util
import os
import re

import pytest

from tests.harness.paths import REPO

ROOT = REPO
README = os.path.join(ROOT, "README.md")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "docs", "_ext", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bagua_docs():
    return _load("bagua_docs")


def test_readme_is_short_and_keeps_the_two_commands():
    text = open(README, encoding="utf-8").read()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text
    assert "Nothing has run on a GPU yet" in text


def test_readme_links_exist():
    text = open(README, encoding="utf-8").read()
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    assert targets
    missing = [t for t in targets if "://" not in t and not os.path.exists(os.path.join(ROOT, t))]
    assert not missing


def test_readme_generated_blocks_are_current(bagua_docs):
    bagua_docs.check_readme()


def test_every_public_name_has_a_docstring(bagua_docs):
    missing = [n for p in bagua_docs.PUBLIC_PACKAGES for n in bagua_docs.undocumented(p)]
    assert not missing


def test_every_registered_algorithm_has_a_section(bagua_docs):
    bagua_docs.check_algorithms_page()


def test_an_undocumented_name_is_caught(bagua_docs, monkeypatch):
    import bagua_core.comm

    monkeypatch.setattr(bagua_core.comm.barrier, "__doc__", None)
    assert "bagua_core.barrier" in bagua_docs.undocumented("bagua_core")


def test_time_to_accuracy_summary_from_the_data(bagua_docs):
    rows = {(r["hosts"], r["link"], r["workload"], r["track"]): r for r in bagua_docs.tta_rows()}
    for hosts in (2, 4):
        slow = [r for (h, link, _, _), r in rows.items() if (h, link) == (hosts, "100mbit")]
        assert len(slow) == 6 and all(r["vs_powersgd"] >= 1.3 for r in slow), hosts
    assert not rows[(2, "1gbit", "lm", "sgd")]["powersgd_reached"]
    # a later run replaces an earlier one's rows: the CNN with AdamW on a quiet machine
    quiet = rows[(2, "100mbit", "cnn", "adamw")]
    assert quiet["run"].endswith("-quiet") and quiet["best"] == "Bagua LocalSteps+8bit"
    for hosts in (2, 4):
        fast = [r for (h, link, _, _), r in rows.items() if (h, link) == (hosts, "10gbit")]
        assert len(fast) == 6 and all(r["vs_ddp"] >= 0.95 for r in fast), hosts
        medium = [r for (h, link, _, _), r in rows.items() if (h, link) == (hosts, "1gbit")]
        assert len(medium) == 6, hosts
        assert all(r["best"] and (not r["powersgd_reached"] or r["vs_powersgd"] > 1) for r in medium), hosts
        delayed = [r for (h, link, _, _), r in rows.items() if (h, link) == (hosts, "100mbit+5ms")]
        assert len(delayed) == 6, hosts
        assert all(r["best"] and (not r["powersgd_reached"] or r["vs_powersgd"] >= 2.2) for r in delayed), hosts
    # the CNN on 4 hosts at 1 Gbit/s: reached first with plain averaging, never by tuned PowerSGD
    for track in ("sgd", "adamw"):
        cnn = rows[(4, "1gbit", "cnn", track)]
        assert cnn["best"] == "Bagua LocalAvg+8bit" and not cnn["powersgd_reached"], track


def test_benchmark_scripts_say_where_their_result_is(bagua_docs):
    table = bagua_docs.scripts_table()
    assert "`benchmarks/time_to_accuracy.py`" in table and "not stored" in table


def test_extension_stand_in_reads_the_bindings():
    pytest.importorskip("sphinx")
    stub = _load("extension_stub")
    found = stub.bindings()
    assert {"Buffer", "DType", "DLPackView"} <= set(found)
    assert "float32" in found["DType"][1]
    errors = stub.exceptions()
    assert issubclass(errors["PeerError"], errors["BaguaError"])
    assert issubclass(errors["BaguaError"], RuntimeError)
