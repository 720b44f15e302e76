"""Build the torch base of the target environments: a folder of links to the top-level files of torch and its
dependencies as installed in cliplab's own venv (run with that venv's python), which each target's venv reads
through a .pth file. Usage: python link_torch.py DEST"""
import sys
from importlib import metadata
from pathlib import Path

DISTRIBUTIONS = ("torch", "numpy", "sympy", "mpmath", "networkx", "filelock", "fsspec", "jinja2", "markupsafe",
                 "typing_extensions")


def main(dest: str) -> None:
    dest = Path(dest)
    dest.mkdir(parents=True)
    for name in DISTRIBUTIONS:
        dist = metadata.distribution(name)
        for top in sorted({f.parts[0] for f in dist.files} - {"..", "bin", "__pycache__"}):
            (dest / top).symlink_to(Path(dist.locate_file(top)).resolve())


if __name__ == "__main__":
    main(sys.argv[1])
