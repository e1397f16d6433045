"""_compat.py — the PyTorch names flce needs that moved between versions, looked up once, outside
any trace (python/flce/__init__.py's _static_dims and _plan_options use them while torch.compile
traces). Never import inside a traced function: under Dynamo a failed import is an exception the
traced `except ImportError` does not see, and fullgraph=True fails (PyTorch 2.15 dropped
symbolic_shapes.size_hint; issue 41).

  has_static_value(x)  True for an int/float, or a symbol whose value is fixed
  size_hint(x)         the value a symbolic int has in the call being traced, without a guard:
                       symbolic_shapes.optimization_hint (2.15), size_hint (2.11 and before)

Either is None on a PyTorch without it; the callers then treat symbolic sizes as unknown.
"""
from torch.fx.experimental import symbolic_shapes as _symbolic_shapes

has_static_value = getattr(_symbolic_shapes, "has_static_value", None)
size_hint = getattr(_symbolic_shapes, "optimization_hint", None) or getattr(_symbolic_shapes, "size_hint", None)
