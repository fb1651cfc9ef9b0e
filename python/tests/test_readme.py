"""The example in python/README.md runs as written (on files of its own in /dev/shm)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import HERE, ShmFiles


def test_readme_example_runs(shm: ShmFiles) -> None:
    pytest.importorskip("torch", reason="python3-torch is not installed")
    text = (HERE.parent / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
    prefix = shm.path("readme")
    shm.paths += [prefix + "domain", prefix + "pool"]
    code = code.replace("/dev/shm/kv-", prefix)
    # Wait for the owner to apply the publication before reading, as a reader would retry.
    code = code.replace("\ndst = ", "\nimport time\nwhile host.lookup(ns, keys[0]) is None: "
                        "time.sleep(0.002)\ndst = ")
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1 block(s) read"
