"""Pages of the documentation that are made from the code and the data.

At build time (``builder-inited``) this extension

* writes one API page per public package (``api/<package>.rst``) from that
  package's ``__all__``, and fails the build when a public name has no
  docstring of its own;
* fails the build when a registered algorithm (``bagua_core.algorithms``) has
  no section on ``algorithms.md``;
* writes ``_generated/benchmarks.md`` from ``benchmarks/results/*/`` (tables,
  figures, notes, commands) and from the benchmark scripts' docstrings, and
  the time-to-accuracy summary on it;
* writes ``_generated/algorithms_table.md`` from the registered algorithms'
  plans, ``_generated/membership_table.md`` from their policies on a live
  membership change, and ``_generated/trace_autotune_figures.md``: a stored trace drawn
  as a timeline (``trace_figure.py``) and the plot of a stored autotune log;
* fails the build when the README's copies of that table and summary (between
  the ``algorithms`` and ``tta-summary`` markers) differ from them:
  ``python docs/_ext/bagua_docs.py --write-readme`` rewrites it.

The settings page needs no generator: it renders ``bagua_core.config``'s
docstring, the one table of settings.
"""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import json
import os
import re
import shutil
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = os.path.join(ROOT, "docs")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PUBLIC_PACKAGES = ("bagua_core", "bagua_torch", "bagua_jax", "bagua.torch_api")

PHASES = {
    "backward": "during backward, bucket by bucket",
    "forward_start": "from the start of forward, concurrently with forward/backward; applied before the optimizer step",
    "after_optimizer_step": "after the optimizer step",
    "background": "by a background loop, while each rank trains at its own pace",
}


class DocsError(Exception):
    """A page or a public name the documentation lacks."""


# ---------------------------------------------------------------- API pages


def public_names(package: str) -> list[tuple[str, object]]:
    module = importlib.import_module(package)
    return [(name, getattr(module, name)) for name in module.__all__]


def undocumented(package: str) -> list[str]:
    """Public names of ``package`` whose object has no docstring of its own."""
    missing = []
    for name, obj in public_names(package):
        doc = getattr(obj, "__doc__", None)
        if (
            inspect.isclass(obj)
            and doc is not None
            and any(doc is getattr(b, "__doc__", None) for b in obj.__mro__[1:])
        ):
            doc = None
        if not (isinstance(doc, str) and doc.strip()):
            missing.append(f"{package}.{name}")
    return missing


def api_page(package: str) -> str:
    module = importlib.import_module(package)
    title = f"``{package}``"
    lines = [title, "=" * len(title), "", f".. automodule:: {package}", ""]
    for name, obj in public_names(package):
        if inspect.ismodule(obj):
            lines += [f".. rubric:: ``{package}.{name}``", "", f".. automodule:: {obj.__name__}", "   :no-index:", ""]
        elif inspect.isclass(obj):
            lines += [
                f".. autoclass:: {package}::{name}",
                "   :members:",
                "   :no-index:" if _documented_elsewhere(package, obj) else "",
                "",
            ]
        elif callable(obj):
            lines += [f".. autofunction:: {package}::{name}", ""]
        else:
            lines += [f".. autodata:: {package}::{name}", ""]
    del module
    return "\n".join(lines) + "\n"


def _documented_elsewhere(package: str, obj) -> bool:
    """A class re-exported by several packages gets one indexed entry: the
    first package of PUBLIC_PACKAGES that exports it."""
    for earlier in PUBLIC_PACKAGES:
        if earlier == package:
            return False
        if any(o is obj for _, o in public_names(earlier)):
            return True
    return False


# ---------------------------------------------------------------- algorithms


def check_algorithms_page() -> None:
    import bagua_core.algorithms as algorithms

    text = open(os.path.join(DOCS, "algorithms.md"), encoding="utf-8").read()
    missing = [
        name
        for name in algorithms.names()
        if f"bagua_core.algorithms.{type(algorithms.as_description(name)).__name__}" not in text
    ]
    if missing:
        raise DocsError(f"docs/algorithms.md has no section for the registered algorithm(s) {missing}")


def algorithms_table() -> str:
    """The table of algorithms, from each registered description's plan."""
    import bagua_core.algorithms as algorithms

    rows = [
        "| algorithm (`init(name)`) | torch / JAX class | what travels | when | where in `optax.chain` |",
        "|---|---|---|---|---|",
    ]
    for name in algorithms.names():
        description = algorithms.as_description(name)
        plan = description.plan()
        cls = f"`{type(description).__name__}Algorithm`"
        if plan.optimizer_state:
            chain = "is the optimizer (with `bagua_jax.qadam`)"
            travels = f"{plan.communicates}, then the optimizer's `{plan.optimizer_state}`"
        elif plan.communicates == "gradients":
            chain, travels = "before the optimizer", plan.communicates
        else:
            chain, travels = "after the optimizer (`params` passed)", plan.communicates
        rows.append(f"| `{name}` | {cls} | {travels} | {PHASES[plan.phase]} | {chain} |")
    return "\n".join(rows) + "\n"


def membership_table() -> str:
    """What each algorithm's members take on a live membership change, from
    each registered description's ``on_membership_change`` (fails the build
    where one has none)."""
    import bagua_core.algorithms as algorithms

    rows = ["| algorithm | on a membership change |", "|---|---|"]
    for name in algorithms.names():
        text = getattr(algorithms.description_type(name), "on_membership_change", None)
        if not text:
            raise DocsError(f"algorithm {name!r} says nothing of a membership change (on_membership_change)")
        rows.append(f"| `{name}` | {text} |")
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------- benchmarks


def result_folders() -> list[str]:
    return sorted(d for d in glob.glob(os.path.join(RESULTS, "*")) if os.path.isdir(d))


def _load(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _shift_headings(markdown: str, to_level: int) -> str:
    """Headings of an included result, the highest moved to ``to_level``."""
    levels = [len(m) for m in re.findall(r"^(#+) ", markdown, re.M)]
    if not levels:
        return markdown
    shift = to_level - min(levels)
    return re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + shift) + " ", markdown, flags=re.M)


def result_section(folder: str, page_dir: str) -> str:
    name = os.path.basename(folder)
    meta_path = os.path.join(folder, "meta.json")
    meta = _load(meta_path) if os.path.exists(meta_path) else {}
    out = [f"### {meta.get('title', name)}", ""]
    data = [
        _load(p)
        for p in sorted(glob.glob(os.path.join(folder, "*.json")))
        if not os.path.basename(p).startswith(("meta.", "trace."))
    ]
    facts = [f"folder `benchmarks/results/{name}`"]
    for d in [meta, *(d for d in data if isinstance(d, dict))]:
        if any(d.get(k) for k in ("date", "machine", "commit")):
            facts += [f"{k} {d[k]}" for k in ("date", "machine", "commit") if d.get(k)]
            break
    out += ["; ".join(facts) + ".", ""]
    if meta.get("commands"):
        out += ["```", *meta["commands"], "```", ""]
    for md in sorted(glob.glob(os.path.join(folder, "*.md"))):
        if os.path.basename(md) != "notes.md":
            out += [_shift_headings(open(md, encoding="utf-8").read().strip(), 4), ""]
    for png in sorted(glob.glob(os.path.join(folder, "*.png"))):
        alt = meta.get("figure_alt", {}).get(os.path.basename(png), os.path.basename(png))
        # Sphinx reads images from inside the source folder only: a copy goes there.
        copy = os.path.join(DOCS, "_generated", "results", name, os.path.basename(png))
        _copy(png, copy)
        out += [f"![{alt}]({os.path.relpath(copy, page_dir)})", ""]
    for figure in drawn_figures(folder, meta):
        out += [f"![{figure['alt']}]({os.path.relpath(figure['path'], page_dir)})", ""]
    notes = os.path.join(folder, "notes.md")
    if os.path.exists(notes):
        out += ["#### Notes", "", _shift_headings(open(notes, encoding="utf-8").read().strip(), 5), ""]
    return "\n".join(out)


def drawn_figures(folder: str, meta: dict) -> list[dict]:
    """The figures ``meta.json`` asks for (``"figures": {png: {"from": glob,
    "alt": text}}``), drawn from the folder's data into ``_generated``: a
    timeline of ``BAGUA_TRACE`` files, or the plot of an autotune log."""
    made = []
    for png, spec in sorted(meta.get("figures", {}).items()):
        sources = sorted(glob.glob(os.path.join(folder, spec["from"])))
        if not sources:
            raise DocsError(f"{folder}/meta.json: no file matches {spec['from']!r} for {png}")
        out = os.path.join(DOCS, "_generated", "results", os.path.basename(folder), png)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if not os.path.exists(out) or os.path.getmtime(out) < max(map(os.path.getmtime, sources)):
            if sources[0].endswith(".log"):
                from bagua_core.autotune.plot import plot

                plot(sources[0], out)
            else:
                import trace_figure

                trace_figure.draw(sources, out)
        made.append({"png": png, "path": out, "alt": spec["alt"]})
    return made


def trace_autotune_figures() -> str:
    """The figures of the newest stored autotune run, for the trace page."""
    folders = [f for f in result_folders() if os.path.basename(f).startswith("autotune-")]
    if not folders:
        return "No trace or autotune run is stored.\n"
    folder = folders[-1]
    meta = _load(os.path.join(folder, "meta.json"))
    lines = [
        f"From `benchmarks/results/{os.path.basename(folder)}` ({meta.get('title', '')}; "
        "the numbers are on [Benchmarks](benchmarks.md)):",
        "",
    ]
    for figure in drawn_figures(folder, meta):
        lines += [f"![{figure['alt']}]({os.path.relpath(figure['path'], DOCS)})", ""]
    return "\n".join(lines)


def benchmark_scripts() -> list[tuple[str, str]]:
    """(script, first paragraph of its docstring) of each benchmarks/*.py."""
    scripts = []
    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))):
        base = os.path.basename(path)
        if base.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read())) or ""
        scripts.append((base, " ".join(doc.split("\n\n")[0].split())))
    return scripts


def scripts_table() -> str:
    stored: dict = {}
    for folder in result_folders():
        name = os.path.basename(folder)
        stored.setdefault(name.split("-")[0], []).append(name)
    rows = ["| script | stored results (below) | what it measures |", "|---|---|---|"]
    for base, doc in benchmark_scripts():
        names = stored.get(base[:-3])
        where = ", ".join(f"`{n}`" for n in names) if names else "not stored"
        rows.append(f"| `benchmarks/{base}` | {where} | {doc.replace('|', '/')} |")
    return "\n".join(rows)


def tta_rows() -> list[dict]:
    """One row per (link, workload, track) of the dated time-to-accuracy runs
    (folders with a ``meta.json``; a later run replaces an earlier one's row):
    the first method to the target and Bagua's best against tuned
    DDP+PowerSGD and against DDP."""
    rows = {}
    for folder in result_folders():  # by name: oldest date first
        if not os.path.exists(os.path.join(folder, "meta.json")):
            continue
        for path in glob.glob(os.path.join(folder, "time_to_accuracy.json")):
            for link, workloads in _load(path)["summary"].items():
                for workload, tracks in workloads.items():
                    for track, result in tracks.items():
                        methods = result["methods"]
                        reached = {
                            m: v["median_seconds_to_target"]
                            for m, v in methods.items()
                            if v.get("median_seconds_to_target") is not None
                        }
                        bagua = {m: s for m, s in reached.items() if m.startswith("Bagua")}
                        best = min(bagua, key=bagua.get) if bagua else None
                        hosts, _, rate = link.partition(" hosts, ")  # "2 hosts, 100mbit+5ms"
                        rows[(link, workload, track)] = {
                            "run": os.path.basename(folder),
                            "hosts": int(hosts),
                            "link": rate,
                            "workload": workload,
                            "track": track,
                            "first": min(reached, key=reached.get) if reached else None,
                            "best": best,
                            "best_s": bagua.get(best),
                            "vs_powersgd": methods[best].get("speedup_vs_powersgd") if best else None,
                            "vs_ddp": methods[best].get("speedup_vs_ddp") if best else None,
                            "powersgd_reached": "DDP+PowerSGD" in reached,
                        }
    return list(rows.values())


def _link_order(row: dict) -> tuple:
    """Fewer hosts first, then the slowest link, added latency after the plain link."""
    m = re.match(r"(\d+)(mbit|gbit)(.*)", row["link"])
    rate = int(m.group(1)) * (1000 if m.group(2) == "gbit" else 1) if m else 0
    latency = m.group(3) if m else row["link"]
    return (row["hosts"], rate, latency, row["workload"] != "mlp", row["workload"] != "cnn")


def tta_summary() -> str:
    rows = [
        "| hosts | link | workload | optimizer | first to target | Bagua's best | × DDP+PowerSGD | × DDP | run |",
        "|---:|---|---|---|---|---|---:|---:|---|",
    ]
    for r in sorted(tta_rows(), key=_link_order):
        if r["best"] is None:
            best, ratio, vs_ddp = "none reached", "n/a", "n/a"
        else:
            best = f"{r['best'].removeprefix('Bagua ')}, {r['best_s']:.1f} s"
            ratio = f"{r['vs_powersgd']:.2f}" if r["vs_powersgd"] is not None else "PowerSGD never reached"
            vs_ddp = f"{r['vs_ddp']:.2f}" if r["vs_ddp"] is not None else "DDP never reached"
        run = re.sub(r"^time_to_accuracy-(\d{4}-\d\d-\d\d).*", r"\1", r["run"])
        rows.append(
            f"| {r['hosts']} | {r['link']} | {r['workload']} | {r['track']} | {r['first'] or 'none'} | {best} | {ratio} | {vs_ddp} "
            f"| {run} |"
        )
    return "\n".join(rows) + "\n"


def benchmarks_page() -> str:
    page_dir = DOCS  # the page that includes it
    parts = [
        "## Scripts",
        "",
        scripts_table(),
        "",
        "## Time to accuracy: summary",
        "",
        "Median seconds to the target over 3 seeds; × DDP+PowerSGD above 1 means sooner than tuned DDP+PowerSGD.",
        "",
        tta_summary(),
        "## Stored results",
        "",
    ]
    parts += [result_section(folder, page_dir) for folder in result_folders()]
    return "\n".join(parts)


def readme_blocks() -> dict:
    """The README's generated blocks: name -> maker."""
    return {"algorithms": algorithms_table, "tta-summary": tta_summary}


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}:start (generated by docs/_ext/bagua_docs.py) -->", f"<!-- {name}:end -->")


def readme_block(readme: str, name: str) -> str:
    start_marker, end_marker = _markers(name)
    start, end = readme.find(start_marker), readme.find(end_marker)
    if start < 0 or end < start:
        raise DocsError(f"README.md lacks the markers {start_marker!r} ... {end_marker!r}")
    return readme[start + len(start_marker) : end].strip("\n") + "\n"


def write_readme() -> None:
    path = os.path.join(ROOT, "README.md")
    readme = open(path, encoding="utf-8").read()
    for name, make in readme_blocks().items():
        readme_block(readme, name)  # both markers are there
        start_marker, end_marker = _markers(name)
        start = readme.index(start_marker) + len(start_marker)
        readme = readme[:start] + "\n" + make() + readme[readme.index(end_marker) :]
    with open(path, "w", encoding="utf-8") as f:
        f.write(readme)


def check_readme() -> None:
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    for name, make in readme_blocks().items():
        if readme_block(readme, name) != make():
            raise DocsError(
                f"README.md's {name} block differs from what the code and benchmarks/results "
                "give: run  python docs/_ext/bagua_docs.py --write-readme"
            )


# ---------------------------------------------------------------- Sphinx


def _copy(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.exists(target) or open(source, "rb").read() != open(target, "rb").read():
        shutil.copyfile(source, target)


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def generate(app) -> None:
    from sphinx.errors import ExtensionError

    try:
        missing = [n for p in PUBLIC_PACKAGES for n in undocumented(p)]
        if missing:
            raise DocsError("public names without a docstring: " + ", ".join(missing))
        check_algorithms_page()
        check_readme()
    except DocsError as e:
        raise ExtensionError(str(e)) from None
    for package in PUBLIC_PACKAGES:
        _write(os.path.join(DOCS, "api", f"{package}.rst"), api_page(package))
    _write(os.path.join(DOCS, "_generated", "benchmarks.md"), benchmarks_page())
    _write(os.path.join(DOCS, "_generated", "algorithms_table.md"), algorithms_table())
    _write(os.path.join(DOCS, "_generated", "membership_table.md"), membership_table())
    _write(os.path.join(DOCS, "_generated", "trace_autotune_figures.md"), trace_autotune_figures())


def setup(app):
    app.connect("builder-inited", generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-readme"]:
        import extension_stub

        sys.path.insert(0, ROOT)
        extension_stub.install()  # as in the build: no compiled extension needed
        write_readme()
    else:
        sys.exit("usage: python docs/_ext/bagua_docs.py --write-readme")
