"""Writes the dist-info directory `cmake --install` installs next to the Python package, so
importlib.metadata finds the distribution and its entry points (vLLM's plugin loader reads
``vllm.general_plugins`` through it), as a pip install would leave them.

Usage: python_dist_info.py <python/pyproject.toml> <output directory>
Writes <output>/cxlkv-<version>.dist-info/{METADATA,entry_points.txt,top_level.txt,INSTALLER}
from the [project] table, so pyproject.toml stays the one place the entry points are declared.
"""

import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11
    sys.exit("python_dist_info.py needs Python 3.11+ (tomllib); set CXLKV_PYTHON to one, or "
             "-DCXLKV_INSTALL_PYTHON=OFF")


def main(pyproject: str, out: str) -> None:
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    name, version = project["name"], project["version"]
    d = Path(out) / f"{name}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '')}",
    ]
    meta += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    (d / "METADATA").write_text("\n".join(meta) + "\n")
    groups = project.get("entry-points", {})
    lines = []
    for group in sorted(groups):
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in sorted(groups[group].items())]
        lines.append("")
    (d / "entry_points.txt").write_text("\n".join(lines))
    (d / "top_level.txt").write_text(f"{name}\n")
    (d / "INSTALLER").write_text("cmake\n")
    print(d.name)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
