"""_compat.py — the PyTorch names flce needs that moved between versions or cost time to import,
looked up outside any trace (python/flce/__init__.py's _static_dims, _plan_options and
_auto_choice use them while torch.compile traces).

  has_static_value(x)  True for an int/float, or a symbol whose value is fixed
  size_hint(x)         the value a symbolic int has in the call being traced, without a guard:
                       symbolic_shapes.optimization_hint (2.15), size_hint (2.11 and before)
  assume_constant_result(fn)  torch.compiler.assume_constant_result, applied when torch._dynamo
                       is imported

Never import inside a traced function: under Dynamo a failed import is an exception the traced
`except ImportError` does not see, and fullgraph=True fails (PyTorch 2.15 dropped
symbolic_shapes.size_hint; issue 41). Nor at `import flce`: symbolic_shapes (sympy) costs ~0.45 s
and torch._dynamo over 1 s after `import torch` (issue 41 asks for 0.3 s). So the names are taken
right after PyTorch itself imports those modules, by a one-shot import hook: symbolic sizes exist
only once symbolic_shapes is loaded, and Dynamo reads a function's constant mark only while it
traces, after torch._dynamo is loaded.

has_static_value and size_hint are None until then, and on a PyTorch without them; the callers
then treat symbolic sizes as unknown.
"""
import sys
import warnings

import torch

has_static_value = None
size_hint = None


def _take_symbolic_shapes(module):
    global has_static_value, size_hint
    has_static_value = getattr(module, "has_static_value", None)
    size_hint = getattr(module, "optimization_hint", None) or getattr(module, "size_hint", None)


class _AfterImport:
    """A sys.meta_path finder that runs callback(module) right after `name` is first imported
    (the module executed, before the importer sees it), then leaves sys.meta_path. It finds
    nothing itself: it asks the finders after it and wraps the found loader's exec_module."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, callback = loader.exec_module, self.callback

        def exec_then_call(module):
            exec_module(module)
            if module.__name__ != fullname:  # a loader shared by several modules
                return
            vars(loader).pop("exec_module", None)
            try:
                callback(module)
            except Exception as e:  # noqa: BLE001  (flce must not break PyTorch's import)
                warnings.warn(f"flce: after importing {fullname}: {type(e).__name__}: {e}", RuntimeWarning,
                              stacklevel=2)
        loader.exec_module = exec_then_call  # on this loader object only; removed once called
        return spec


def after_import(name, callback):
    """callback(module) now if `name` is imported, else right after it is."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


def assume_constant_result(fn):
    """fn, marked with torch.compiler.assume_constant_result once torch._dynamo is imported (now, if
    it is): the mark only matters while Dynamo traces, and taking it at `import flce` would import
    torch._dynamo."""
    after_import("torch._dynamo", lambda _: torch.compiler.assume_constant_result(fn))
    return fn


after_import("torch.fx.experimental.symbolic_shapes", _take_symbolic_shapes)
