"""Download, for a GPU machine whose Python already holds CUDA PyTorch, the wheels of this project's other
dependencies at the versions this checkout's environment has, for `bench/gpu_lease.sh` to install there:

    .venv/bin/python bench/gpu_wheels.py                 # into .whl/ (git-ignored through .git/info/exclude)
    .venv/bin/python bench/gpu_wheels.py --list          # print the pins only

The set is the dependency closure of prefect, gliner2, transformers and this project's runtime dependencies (as
installed here, markers evaluated for Linux x86-64), Prefect's server extras that its closure leaves out (asyncpg,
greenlet), minus what such a machine already has at a working version (torch, numpy, scipy, triton, the NVIDIA
libraries, pip, setuptools, safetensors, rich, ...): 110 wheels, 59 MB here. Binary wheels for CPython 3.12 on
manylinux x86-64.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOTS = ("prefect", "gliner2", "transformers", "huggingface_hub", "blake3", "pydantic", "PyYAML", "fsspec", "psutil")
EXTRA = ("asyncpg", "greenlet")  # Prefect's server imports them; its metadata does not require them everywhere
# Already on such a machine at a working version (KINDS.md's package list); leaving them out keeps the wheels and the
# checkout under the device tool's 64 MiB
PRESENT = ("torch", "numpy", "scipy", "triton", "pip", "setuptools", "packaging", "hf-xet", "pygments", "pyyaml")
PRESENT += ("regex", "rich", "safetensors")
MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "extra": "",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17, 5)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure() -> dict[str, str]:
    """name -> installed version, for every distribution the roots need here."""
    versions: dict[str, str] = {}
    stack = [*ROOTS, *EXTRA]
    while stack:
        name = canonical(stack.pop())
        if name in versions:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency this environment does not have
        versions[name] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(MARKERS):
                stack.append(requirement.name)
    return {
        name: version
        for name, version in sorted(versions.items())
        if name not in PRESENT and not name.startswith("nvidia-")
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", default=str(Path(__file__).resolve().parents[1] / ".whl"))
    parser.add_argument("--list", action="store_true", help="print the pins, download nothing")
    args = parser.parse_args()
    pins = [f"{name}=={version}" for name, version in closure().items()]
    if args.list:
        print("\n".join(pins))
        return 0
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", "--dest", args.dest]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    done = subprocess.run([*command, *pins]).returncode
    message = f"{len(pins)} wheels for CPython 3.12 in {args.dest}" if done == 0 else "pip download failed"
    print(message, file=sys.stderr)
    return done


if __name__ == "__main__":
    raise SystemExit(main())
