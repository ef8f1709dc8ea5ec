"""A package's names imported on first use, so `import dit` / `import parallel` (which every `dit.x` /
`parallel.x` import runs) costs no torch: the API process and the CLI's checks read settings, presets and
layouts without it, and only what runs a model pays the seconds of `import torch`."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]):
    """`(__getattr__, __dir__, __all__)` for `package`'s `__init__`: `modules` maps a submodule to the names
    it exports; any other name is the submodule of that name, as an `__init__` that imported it would have."""
    exports = {name: module for module, names in modules.items() for name in names}

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

    return __getattr__, __dir__, sorted(exports)
