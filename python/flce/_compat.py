"""_compat.py — the PyTorch names flce needs that moved between versions or cost time to import,
looked up outside any trace (python/flce/__init__.py's _static_dims, _plan_options and
_auto_choice use them while torch.compile traces).

  has_static_value(x)  True for an int/float, or a symbol whose value is fixed
  size_hint(x)         the value a symbolic int has in the call being traced, without a guard:
                       symbolic_shapes.optimization_hint (2.15), size_hint (2.11 and before)
  assume_constant_result(fn)  torch.compiler.assume_constant_result, applied when torch._dynamo
                       is imported
  autocast_dtype(device_type)  the dtype torch.autocast runs F.linear in on that device type, or
                       None where autocast is off: torch.is_autocast_enabled(device_type) and
                       torch.get_autocast_dtype(device_type) (2.4+), else the older per-device
                       names, chosen once at import (both trace under torch.compile)
  DTensor              torch.distributed.tensor.DTensor once PyTorch imports it (else None), for
                       flce.cce's check without an import inside a trace
  compile_drops_accumulated  True below PyTorch 2.11: see below
  compile_unbacked_outputs   True from PyTorch 2.11: see below
  require_torch(version)  ImportError unless `version` is in the supported range (MIN_TORCH and up)

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
import re
import sys
import warnings

import torch

# The oldest PyTorch the binding runs on: torch.library.custom_op, register_fake and
# register_autograd (python/flce/_ops.py), torch.library.get_ctx().new_dynamic_size() all appeared
# in 2.4. python/pyproject.toml's dependency says the same.
MIN_TORCH = (2, 4)
SUPPORTED = f"PyTorch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}"


def torch_version_tuple(version):
    """(major, minor) of a PyTorch version string ('2.15.0+cu132', '2.4.0a0+git1234',
    '2.6.0.dev20240901'), or None where it does not start with two numbers."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def require_torch(version):
    """Raises ImportError naming the supported range where `version` is older than MIN_TORCH (an
    unreadable version string passes: a source build may say anything)."""
    v = torch_version_tuple(version)
    if v is not None and v < MIN_TORCH:
        raise ImportError(
            f"flce needs {SUPPORTED} (torch.library.custom_op, register_fake and register_autograd); this "
            f"is PyTorch {version} ({getattr(torch, '__file__', '?')}). Upgrade it: pip install "
            f"'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'")

has_static_value = None
size_hint = None
DTensor = None  # torch.distributed.tensor.DTensor (2.4: torch.distributed._tensor's), once imported


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


def _take_dtensor(module):
    global DTensor
    DTensor = DTensor or getattr(module, "DTensor", None)


after_import("torch.fx.experimental.symbolic_shapes", _take_symbolic_shapes)
after_import("torch.distributed.tensor", _take_dtensor)
after_import("torch.distributed._tensor", _take_dtensor)  # where PyTorch 2.4 defines it


# PyTorch 2.4's AOTAutograd compiles a graph whose only gradients go to fp32 accumulators (the
# custom op's backward returns no input gradient) without its backward, so the accumulators never
# receive them; 2.15 keeps it (2.11's is unchecked for this case, 2.5 to 2.10 unknown): flce refuses
# such a call under torch.compile below 2.11 rather than lose the gradients.
compile_drops_accumulated = (torch_version_tuple(torch.__version__) or (99, 0)) < (2, 11)

# Dynamo before 2.11 refuses a custom op whose output size only the library knows (the saved
# logits' workspace for a dynamic token count: _ops._fake_saved_bytes's new_dynamic_size) unless
# capture_dynamic_output_shape_ops is set: "Dynamic shape operator" on 2.8 (fuzz_binding seed 1 cases
# 7, 42, 270, CPU, 2026-11-28); 2.11 (the GPU runs) and 2.15 trace it. Below 2.11 a compiled call
# takes the other routes (the same values).
compile_unbacked_outputs = (torch_version_tuple(torch.__version__) or (99, 0)) >= (2, 11)


def _autocast_by_device_type():
    """Whether this PyTorch has torch.is_autocast_enabled(device_type) and
    torch.get_autocast_dtype(device_type) (2.4 on); asked once, at import."""
    try:
        torch.is_autocast_enabled("cpu")
        return isinstance(torch.get_autocast_dtype("cpu"), torch.dtype)
    except (TypeError, AttributeError, RuntimeError):
        return False


if _autocast_by_device_type():
    def autocast_dtype(device_type):
        """torch.autocast's dtype on `device_type` ('cuda', 'cpu', ...) where it is enabled, else None."""
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
        return None
else:  # older names: CUDA's and the CPU's only
    def autocast_dtype(device_type):
        """torch.autocast's dtype on `device_type` ('cuda' or 'cpu') where it is enabled, else None."""
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if device_type == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
        return None
