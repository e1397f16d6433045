#!/usr/bin/env python3
"""check_layout.py — checks that the ctypes mirror of include/flce.h in flce/_lib.py matches what a C
compiler makes of the header: sizeof and offsetof of every field of flce_problem and flce_tensors,
and the value of every enum constant. Then, if libflce.so can be loaded, checks the library's
_init functions against the binding and exercises the error path. Needs gcc (or $CC), no GPU and
no PyTorch.  Usage: python3 python/check_layout.py   (exit status 0 when everything matches)
"""
import ctypes
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HEADER_DIR = os.path.join(REPO, "include")


def load_lib_module():
    """flce/_lib.py on its own, without flce/__init__.py (which imports torch)."""
    spec = importlib.util.spec_from_file_location("flce_lib", os.path.join(HERE, "flce", "_lib.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_distill_module():
    """flce/_distill_lib.py (ctypes only) as flce._distill_lib under a bare `flce` package module, so that its
    `from . import _lib` works without flce/__init__.py (which imports torch)."""
    import types
    if "flce" not in sys.modules:
        pkg = types.ModuleType("flce")
        pkg.__path__ = [os.path.join(HERE, "flce")]
        sys.modules["flce"] = pkg
    return importlib.import_module("flce._distill_lib")


def enum_constants(L):
    return {name: getattr(L, name) for name in dir(L)
            if name.startswith(("FLCE_OK", "FLCE_ERR_", "FLCE_DTYPE_", "FLCE_REDUCTION_",
                                "FLCE_STRATEGY_", "FLCE_OP_", "FLCE_API_VERSION"))}


def header_fields(struct):
    """Field names of `typedef struct <struct> { ... } <struct>;` in flce.h, in order."""
    text = open(os.path.join(HEADER_DIR, "flce.h")).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    body = re.search(r"typedef\s+struct\s+%s\s*\{(.*?)\}\s*%s\s*;" % (struct, struct), text, re.S).group(1)
    return [re.findall(r"\w+", decl)[-1] for decl in body.split(";") if decl.strip()]


def c_layout(structs, constants):
    """Compiles and runs a C program that prints the layout the compiler gives the header's structs."""
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "flce.h"', 'int main(void) {',
             '  printf("{");']
    for cname, cls in structs.items():
        lines.append(f'  printf("\\"{cname}\\": {{\\"sizeof\\": %zu", sizeof({cname}));')
        for field, _ in cls._fields_:
            lines.append(f'  printf(", \\"{field}\\": [%zu, %zu]", offsetof({cname}, {field}), '
                         f'sizeof((({cname} *)0)->{field}));')
        lines.append('  printf("}, ");')
    lines.append('  printf("\\"constants\\": {");')
    for i, name in enumerate(sorted(constants)):
        sep = ", " if i else ""
        lines.append(f'  printf("{sep}\\"{name}\\": %lld", (long long)({name}));')
    lines.append('  printf("}}\\n");')
    lines.append('  return 0;\n}')
    cc = os.environ.get("CC", "gcc")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", HEADER_DIR, src, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    L = load_lib_module()
    D = load_distill_module()
    structs = {"flce_problem": L.Problem, "flce_tensors": L.Tensors,
               "flce_distill_problem": D.DistillProblem, "flce_distill_tensors": D.DistillTensors,
               "flce_topk_problem": D.TopkProblem, "flce_topk_tensors": D.TopkTensors}
    constants = enum_constants(L)
    constants.update({name: getattr(D, name) for name in dir(D) if name.startswith("FLCE_DIVERGENCE_")})
    c = c_layout(structs, constants)
    bad = 0

    for cname, cls in structs.items():
        names = [f for f, _ in cls._fields_]
        if header_fields(cname) != names:
            bad += 1
            print(f"{cname}: fields in flce.h {header_fields(cname)}\n  differ from _lib.py {names}  MISMATCH")
        lay = c[cname]
        ok = lay["sizeof"] == ctypes.sizeof(cls)
        bad += not ok
        print(f"{cname}: sizeof C {lay['sizeof']}, ctypes {ctypes.sizeof(cls)}  {'ok' if ok else 'MISMATCH'}")
        for field, ctype in cls._fields_:
            c_off, c_size = lay[field]
            py_off, py_size = getattr(cls, field).offset, ctypes.sizeof(ctype)
            ok = (c_off, c_size) == (py_off, py_size)
            bad += not ok
            if not ok:
                print(f"  {field}: C offset {c_off} size {c_size}, ctypes offset {py_off} size {py_size}  MISMATCH")
        print(f"  {len(cls._fields_)} fields: " + ("all match" if not bad else "see above"))

    for name, value in sorted(constants.items()):
        if c["constants"][name] != value:
            bad += 1
            print(f"{name}: C {c['constants'][name]}, _lib.py {value}  MISMATCH")
    print(f"{len(constants)} enum constants: " + ("all match" if all(
        c["constants"][n] == v for n, v in constants.items()) else "MISMATCH"))

    # One version: the package's (flce/_version.py), the project's (CMakeLists.txt) and the library's.
    package_version = re.search(r'__version__ = "([^"]+)"', open(os.path.join(HERE, "flce", "_version.py")).read())[1]
    cmake_version = re.search(r"project\(flce VERSION ([0-9.]+)", open(os.path.join(REPO, "CMakeLists.txt")).read())[1]
    ok = package_version == cmake_version
    bad += not ok
    print(f"flce.__version__ {package_version}, CMakeLists.txt {cmake_version}: {'ok' if ok else 'MISMATCH'}")

    # With the library: its _init functions and its error path.
    try:
        path = L.library_path()
    except L.FlceLibraryNotFound as e:
        print(f"library not loaded, skipping its checks: {e}")
        return 1 if bad else 0
    ok = L.version() == package_version
    bad += not ok
    print(f"library: {path}, version {L.version()}  {'ok' if ok else 'MISMATCH (flce.__version__ ' + package_version + ')'}")
    for cname, cls in list(structs.items())[:2]:
        lib_size = L.library_struct_size(cls)
        note = "ok" if lib_size == c[cname]["sizeof"] else (
            "the library was built from an older flce.h: rebuild it (the binding sends the smaller size)"
            if lib_size < c[cname]["sizeof"] else "the library is newer than flce.h here")
        print(f"  sizeof({cname}) in the library: {lib_size}  {note}")
    p, t = L.new_problem(), L.new_tensors()
    checks = [
        ("problem.struct_size sent", p.struct_size, min(ctypes.sizeof(L.Problem), L.library_struct_size(L.Problem))),
        ("problem.api_version", p.api_version, L.FLCE_API_VERSION),
        ("problem.ignore_index default", p.ignore_index, -100),
        ("problem.temperature default", p.temperature, 1.0),
        ("problem.tp_size default", p.tp_size, 1),
        ("problem.label_bits default", p.label_bits, 32),
        ("tensors.struct_size sent", t.struct_size, min(ctypes.sizeof(L.Tensors), L.library_struct_size(L.Tensors))),
    ]
    for what, got, want in checks:
        ok = got == want
        bad += not ok
        print(f"  {what}: {got}  {'ok' if ok else f'MISMATCH (expected {want})'}")

    # A valid problem validates; invalid ones raise FlceError with the library's message.
    p = L.new_problem(tokens=8192, hidden=4096, vocab_shard=128256, vocab_total=128256, dtype=L.FLCE_DTYPE_BF16,
                      label_bits=64, memory_budget=128 << 20)
    L.validate(p)
    print("  validate(8192x4096x128256 bf16): ok")
    for fields, want in [({"hidden": 4100}, L.FLCE_ERR_INVALID_ARGUMENT),
                         ({"reduction": 7}, L.FLCE_ERR_INVALID_ARGUMENT)]:
        q = L.Problem.from_buffer_copy(p)
        for k, v in fields.items():
            setattr(q, k, v)
        try:
            L.validate(q)
            ok, msg = False, "no error"
        except L.FlceError as e:
            ok, msg = e.status == want, str(e)
        bad += not ok
        print(f"  validate({fields}): {msg}  {'ok' if ok else 'MISMATCH'}")
    q = L.Problem.from_buffer_copy(p)
    q.strategy = L.FLCE_STRATEGY_RECOMPUTE
    try:
        L.validate(q)
        print("  validate(strategy=RECOMPUTE): ok (implemented)")
    except L.FlceError as e:
        print(f"  validate(strategy=RECOMPUTE): {e}")
    # The distillation structs as the library's _init writes them (it refuses any other struct_size).
    if D.available():
        p = D.new_problem()
        for what, got, want in (("distill problem.struct_size", p.struct_size, c["flce_distill_problem"]["sizeof"]),
                                ("distill problem.beta default", p.beta, 0.5),
                                ("distill problem.ignore_index default", p.ignore_index, -100),
                                ("distill problem.temperature default", p.temperature, 1.0)):
            ok = got == want
            bad += not ok
            print(f"  {what}: {got}  {'ok' if ok else f'MISMATCH (expected {want})'}")
        p = D.new_problem(tokens=8192, hidden_student=2048, hidden_teacher=4096, vocab=151936,
                          dtype=L.FLCE_DTYPE_BF16, label_bits=64, divergence=D.FLCE_DIVERGENCE_JSD, beta=0.5)
        D.validate(p)
        print("  flce_distill_problem_validate(8192x2048x151936, teacher 4096, JSD): ok")
    else:
        print("  the library has no distillation API (built before issue 44's): its checks skipped")
    # The top-k problem as the library's _init writes it, field for field, and a vocab-parallel one
    init = getattr(L.lib(), "flce_topk_problem_init", None)
    if init is not None and getattr(L.lib(), "flce_topk_stats_bytes", None) is not None:
        init.argtypes, init.restype = [ctypes.POINTER(D.TopkProblem)], None
        theirs, ours = D.TopkProblem(), D.new_topk_problem()
        init(ctypes.byref(theirs))
        for field, _ in D.TopkProblem._fields_:
            ok = getattr(theirs, field) == getattr(ours, field)
            bad += not ok
            if not ok:
                print(f"  topk problem.{field}: library {getattr(theirs, field)}, binding {getattr(ours, field)}  MISMATCH")
        q = D.new_topk_problem(tokens=8192, hidden=4096, vocab=64128, k=64, vocab_offset=64128, vocab_total=128256,
                               tp_rank=1, tp_size=2)
        D.topk_validate(q)
        n = D.topk_stats_bytes(q)
        ok = n == 4 * (8 + 8192 * (2 + 2 * 64))
        bad += not ok
        print(f"  topk problem defaults as flce_topk_problem_init; rank 1 of 2 validates, block {n} bytes  "
              f"{'ok' if ok else 'MISMATCH'}")
    else:
        print("  the library has no vocab-parallel top-k API: its checks skipped")
    try:
        L.context(0)
        print("  flce_context_create(0): created (this machine has a GPU)")
    except L.FlceError as e:
        print(f"  flce_context_create(0) without a GPU raises: {e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
