"""A package's names imported on first use, so `import dit` / `import parallel` (which every `dit.x` /
`parallel.x` import runs) costs no torch: the API process and the CLI's checks read settings, presets and
layouts without it, and only what runs a model pays the seconds of `import torch`."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """`(__getattr__, __dir__)` for `package`'s `__init__`: `exports` maps a name to the submodule that
    defines it; any other name is the submodule of that name, as an `__init__` that imported it would have."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
