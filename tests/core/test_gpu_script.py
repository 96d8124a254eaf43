"""tests/gpu/run.sh --dry-run on this machine: every step up to the first CUDA
call (unpack Gloo's debs, configure, build with the GPU image's XLA FFI
headers, import, collect the gpu tests, list the GPU benchmarks) must pass, so
the script cannot rot between the runs on a lent GPU.

The dry run works on a copy of this tree under build/gpu-dryrun/ (the build
writes the module into bagua_core/, which must not replace this tree's own).
The copy and its build folder persist, so later runs rebuild only what changed.
"""

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from tests.harness.paths import REPO

COPY = os.path.join(REPO, "build", "gpu-dryrun", "tree")
STEPS = ["env", "gloo", "configure", "build", "import", "gpu_tests", "benchmarks"]
SKIP_TOP = {".git", ".venv", "build", "_skbuild", "dist", "wt", "bandwidth_results"}
SKIP_ANY = {"__pycache__", ".pytest_cache"}
DRY_RUN_S = 1080  # a cold build on 2 busy cores takes several minutes


def skipped(rel_dir, name):
    if rel_dir == "" and name in SKIP_TOP:
        return True
    return name in SKIP_ANY or name.endswith(".egg-info") or name.endswith(".so")


def sync_tree(src, dst):
    """Make dst a copy of src's sources; keep dst/build and unchanged mtimes."""
    wanted = set()
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        rel = "" if rel == "." else rel
        dirs[:] = [d for d in dirs if not skipped(rel, d)]
        for f in files:
            if skipped(rel, f):
                continue
            path = os.path.join(rel, f)
            wanted.add(path)
            s, d = os.path.join(src, path), os.path.join(dst, path)
            st = os.stat(s)
            if os.path.exists(d) and os.stat(d).st_mtime == st.st_mtime and os.stat(d).st_size == st.st_size:
                continue
            os.makedirs(os.path.dirname(d), exist_ok=True)
            shutil.copy2(s, d)
    for root, dirs, files in os.walk(dst):
        rel = os.path.relpath(root, dst)
        rel = "" if rel == "." else rel
        dirs[:] = [d for d in dirs if not skipped(rel, d)]
        for f in files:
            path = os.path.join(rel, f)
            if not skipped(rel, f) and path not in wanted:
                os.remove(os.path.join(dst, path))


def network_problem():
    """None when the package servers answer, else why not."""
    for host, port in (("deb.debian.org", 80), ("pypi.org", 443)):
        try:
            socket.create_connection((host, port), timeout=5).close()
        except OSError as e:
            return f"{host}:{port} unreachable ({e})"
    return None


def prepare():
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("tests/gpu/prepare.sh needs apt-get and dpkg-deb (a Debian or Ubuntu host)")
    proc = subprocess.run(
        ["bash", os.path.join(REPO, "tests", "gpu", "prepare.sh")],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        problem = network_problem()
        if problem:
            pytest.skip(f"tests/gpu/prepare.sh needs the network: {problem}")
        pytest.fail(f"tests/gpu/prepare.sh failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def summary_results(text):
    """{step: 'pass'|'fail'} from summary.txt's step lines."""
    results = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("pass", "fail") and parts[2].endswith("s"):
            results[parts[0]] = parts[1]
    return results


@pytest.mark.timeout(DRY_RUN_S + 120)
def test_gpu_script_dry_run(tmp_path):
    prepare()
    sync_tree(REPO, COPY)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, BAGUA_GPU_TOTAL_S=str(DRY_RUN_S))
    proc = subprocess.run(
        ["bash", os.path.join(COPY, "tests", "gpu", "run.sh"), str(out), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DRY_RUN_S + 60,
    )
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    results = summary_results(summary)
    failed = [s for s in STEPS if results.get(s) != "pass"]
    logs = "".join(
        f"\n--- {s}.log (end) ---\n{(out / f'{s}.log').read_text()[-3000:]}"
        for s in failed
        if (out / f"{s}.log").exists()
    )
    assert not failed and proc.returncode == 0, (
        f"dry run: rc={proc.returncode}, steps not passed: {failed}\n{summary}\n{proc.stderr[-2000:]}{logs}"
    )
    assert "all steps passed" in summary
    assert (out / "build.log").exists() and (out / "gpu_tests.log").exists()
    # gpu tests were found, and the build used the downloaded jaxlib headers
    collected = re.search(r"(\d+)/\d+ tests? collected", (out / "gpu_tests.log").read_text())
    assert collected and int(collected.group(1)) > 0, (out / "gpu_tests.log").read_text()[-2000:]
    assert os.path.join("tests", "gpu", "deps", "xla_include") in (out / "configure.log").read_text()
