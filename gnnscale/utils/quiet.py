"""Import-time notices of gnnscale's dependencies that say nothing to a gnnscale user, filtered at their source.

Each is matched by its own text and dropped only while the module that prints it is being imported; any
other output of that import, and every warning raised later, still reaches stderr.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

# module -> the start of the line it prints on import that we drop
NOTICES = {
    # PyTorch, on a machine with a CUDA toolkit (nvcc on PATH, /usr/local/cuda) but no GPU: it names where
    # extensions would be compiled; gnnscale compiles none. Imported by torch.utils.benchmark (profile).
    "torch.utils.cpp_extension": "No CUDA runtime is found",
}


class _DropLine:
    """A stderr stand-in that drops the lines starting with `prefix` (print writes the text and its end
    separately, so the newline after a dropped text is dropped too) and passes everything else on."""

    def __init__(self, stream, prefix: str):
        self.stream, self.prefix, self.dropped = stream, prefix, False

    def write(self, text: str) -> int:
        if text.startswith(self.prefix):
            self.dropped = not text.endswith("\n")
            return len(text)
        if self.dropped and text == "\n":
            self.dropped = False
            return len(text)
        self.dropped = False
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds the noisy modules with the other finders, then runs their code with the notice dropped."""

    def find_spec(self, fullname, path, target=None):
        prefix = NOTICES.get(fullname)
        if prefix is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module, run=run, prefix=prefix):
                    real = sys.stderr
                    sys.stderr = _DropLine(real, prefix)
                    try:
                        run(module)
                    finally:
                        sys.stderr = real

                spec.loader.exec_module = exec_module  # this spec's own loader object: nothing else sees it
                return spec
        return None


def quiet_import_notices() -> None:
    """Called once on `import gnnscale`, before any dependency that prints is imported."""
    # DGL prints "DGL backend not selected or invalid" and writes ~/.dgl/config.json when no backend is
    # chosen; gnnscale runs only on PyTorch, so it chooses it (a user's own DGLBACKEND is kept).
    os.environ.setdefault("DGLBACKEND", "pytorch")
    if not any(isinstance(f, _QuietFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietFinder())
