"""What a device call carries, checked on this machine before the call is spent (docs/BENCHMARKS.md,
"Reproducing"). The GPU machine gets the project's working tree (tracked files, and untracked ones git
does not ignore) plus the paths named in ``carry``, 64 MiB in all (the device tool's limit), and no
registry: every wheel a part installs must be in the carried folder.

    python bench/gpu_carry.py --carry .whl --need packtrain bitsandbytes torchao [--beside .whl-unsloth]

One line per needed wheel (found, or missing), one for the total against 64 MiB; ``--beside DIR``: one
more line saying whether DIR would also fit in the same call (a note: never a problem). Exit 1 on a
missing wheel or a carry over the limit.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

LIMIT = 64 * 2**20
ROOT = Path(__file__).resolve().parents[1]


def normalized(name: str) -> str:
    """A distribution's name as wheel file names spell it (PEP 427/503: runs of -_. are one _, lower case)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def wheels_in(folder: Path) -> dict[str, Path]:
    """{normalized distribution name: wheel file} of ``folder`` (empty when it does not exist)."""
    return {normalized(w.name.split("-")[0]): w for w in sorted(folder.glob("*.whl"))} if folder.is_dir() else {}


def tree_bytes(root: Path) -> int:
    """The working tree as it travels: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((root / name.decode()).stat().st_size for name in listed if name and (root / name.decode()).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def check(root: Path, carry: Path, needs: list[str], beside: Path | None = None) -> list[str]:
    """The problems (empty: the carry holds every needed wheel and fits); prints one line per fact."""
    problems = []
    found = wheels_in(carry)
    for name in needs:
        wheel = found.get(normalized(name))
        if wheel is None:
            problems.append(f"{name}: no wheel in {carry.name}/")
            print(f"CARRY {name}: MISSING from {carry.name}/", flush=True)
        else:
            print(f"CARRY {name}: {wheel.name} ({mb(wheel.stat().st_size)})", flush=True)
    tree, wheels = tree_bytes(root), folder_bytes(carry)
    total = tree + wheels
    verdict = "fits" if total <= LIMIT else "OVER the limit"
    print(f"CARRY total: working tree {mb(tree)} + {carry.name}/ {mb(wheels)} = {mb(total)} of {mb(LIMIT)} "
          f"(64 MiB): {verdict}, {mb(abs(LIMIT - total))} {'left' if total <= LIMIT else 'too much'}", flush=True)
    if total > LIMIT:
        problems.append(f"the carry is {mb(total)}, over 64 MiB")
    if beside is not None:
        report_beside(carry, beside, total)
    return problems


def report_beside(carry: Path, beside: Path, total: int) -> None:
    """Whether ``beside``'s wheels would fit in the same call: those ``carry`` does not already hold."""
    held = {w.name for w in carry.glob("*.whl")} if carry.is_dir() else set()
    extra = sum(w.stat().st_size for w in beside.glob("*.whl") if w.name not in held) if beside.is_dir() else 0
    if not extra:
        print(f"CARRY {beside.name}/: absent (not carried)", flush=True)
        return
    both = total + extra
    verdict = "fits" if both <= LIMIT else f"does not fit ({mb(both - LIMIT)} over 64 MiB): not carried"
    print(f"CARRY {beside.name}/ beside it: {mb(extra)} more (its wheels {carry.name}/ lacks) = {mb(both)}: {verdict}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--carry", type=Path, required=True, help="the wheel folder the call carries (.whl)")
    parser.add_argument("--need", nargs="+", required=True, metavar="NAME", help="distributions it must hold")
    parser.add_argument("--beside", type=Path, default=None, help="a folder to report as carried beside it")
    parser.add_argument("--root", type=Path, default=ROOT, help="the working tree (default: this checkout)")
    args = parser.parse_args()
    carry = args.carry if args.carry.is_absolute() else args.root / args.carry
    beside = None if args.beside is None else args.beside if args.beside.is_absolute() else args.root / args.beside
    return 1 if check(args.root, carry, args.need, beside) else 0


if __name__ == "__main__":
    raise SystemExit(main())
