"""Installing the package offline from the tree, as python/README.md says (the cmake --install
route is tests/install/run.sh, the `install` ctest)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cxlkv
from conftest import HERE


def test_pip_install_offline_into_a_venv(tmp_path: Path) -> None:
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("pip is not installed for this interpreter (apt-get install python3-pip)")
    src = tmp_path / "src"
    shutil.copytree(HERE.parent, src, ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__"))  # pip builds in the source directory
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"no venv module (apt-get install python3-venv): {r.stderr.strip()[-200:]}")
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-index", str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import cxlkv, os, sys; print(cxlkv.__file__); "
            "print(os.path.exists(os.path.join(os.path.dirname(cxlkv.__file__), 'py.typed'))); "
            "print(cxlkv.library().realpath); import cxlkv.integrations.check; "
            "from importlib.metadata import distribution, entry_points; "
            "print(distribution('cxlkv').version); "
            "print([(e.name, e.value) for e in entry_points(group='vllm.general_plugins')])")
    # A pip-installed package finds the library through CXLKV_LIBRARY or the soname (an
    # installed libcxlkv): here, the one these tests run against.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CXLKV_LIBRARY"] = cxlkv.library().path
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env=env)
    assert r.returncode == 0, r.stderr
    where, typed, lib, version, plugins = r.stdout.split("\n")[:5]
    assert where.startswith(str(venv)) and typed == "True"
    assert lib == cxlkv.library().realpath
    # The distribution and the vLLM plugin entry point, as vLLM's loader finds them.
    assert version == "0.1.0"
    assert ("cxlkv", "cxlkv.integrations.vllm:register_plugin") in ast.literal_eval(plugins)
