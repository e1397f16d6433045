#!/usr/bin/env python3
"""test_installed.py — the pip-installed flce package (issue 17): `import flce` must come from the
install target (not this repository's python/ folder), load the libflce.so.0 shipped inside it
(FLCE_LIBRARY unset), and run compiled models on the GPU: a tiny language model whose loss is
flce.linear_cross_entropy, under torch.compile(fullgraph=True), two training steps against eager
PyTorch (F.cross_entropy on materialized logits) in fp32; an RL log-prob objective (per-token
logprobs and entropy with temperature) compiled the same way; and, when transformers is installed,
a tiny Llama patched with flce.patch_hf (python/test_hf.py's checks, then the patched model under
torch.compile(fullgraph=True)) against the unpatched model.

  python3 -m pip install --no-deps --no-build-isolation --no-index --target /tmp/site ./python
  env -u FLCE_LIBRARY PYTHONPATH=/tmp/site python3 python/test_installed.py --target /tmp/site
  ... python/test_installed.py --target /tmp/site --cpu   # without a GPU: the same cases on the
        # CPU, the kernels replaced by python/standin.py's float64 stand-in (the installed package,
        # its library, the custom ops and the compiled graphs real)

Exit status 0 when all pass, 1 on a failure, 77 when torch or a GPU is missing (a skip, as in
CTest; the location checks still run when torch is there). The last line reads 'N passed, N failed'.
"""
import copy
import importlib.util
import os
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
# Python puts this script's folder first on sys.path, and that folder holds the source tree's
# flce/: drop it (and a '' or '.' that means it), so `import flce` finds the installed copy.
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != HERE]

TARGET = None
CPU = "--cpu" in sys.argv  # python/test_hf.py, loaded below, reads the same flag
DEV = "cpu" if CPU else "cuda"
if "--target" in sys.argv:
    TARGET = os.path.realpath(sys.argv[sys.argv.index("--target") + 1])

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = F = None  # the location check still runs, then a skip

flce = None  # imported by installed_copy(), once its location is checked
passed, failed = 0, 0


def case(name, fn):
    global passed, failed
    t0 = time.time()
    try:
        fn()
        passed += 1
        print(f"ok {name} ({time.time() - t0:.1f} s)")
    except Exception as e:  # noqa: BLE001
        failed += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    d = b.norm().item()
    return (a - b).norm().item() / d if d else (a - b).norm().item()


def under(path, folder):
    return os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep)


def located():
    """Where `import flce` will come from (found without importing it, so without torch): the
    install target, not the source tree, with the library shipped beside it."""
    assert "FLCE_LIBRARY" not in os.environ, \
        f"FLCE_LIBRARY={os.environ['FLCE_LIBRARY']} is set: unset it to test the library inside the package"
    spec = importlib.util.find_spec("flce")
    assert spec is not None and spec.origin, "no flce package on sys.path (PYTHONPATH=<install target>?)"
    origin = spec.origin
    assert not under(origin, HERE), f"flce would be imported from the source tree: {origin}"
    if TARGET is not None:
        assert under(origin, TARGET), f"flce would be imported from {origin}, not from under {TARGET}"
    shipped = os.path.join(os.path.dirname(origin), "libflce.so.0")
    assert os.path.isfile(shipped), f"no libflce.so.0 installed beside {origin}"
    print(f"  flce package: {os.path.dirname(origin)}")
    return origin


def installed_copy():
    global flce
    origin = located()
    import flce
    assert os.path.samefile(flce.__file__, origin), f"imported {flce.__file__}, expected {origin}"
    shipped = os.path.join(os.path.dirname(origin), "libflce.so.0")
    assert os.path.samefile(flce.library_path(), shipped), \
        f"library loaded from {flce.library_path()}, not the one shipped in the package ({shipped})"
    print(f"  flce {flce.version()}, library {flce.library_path()}")


# ---- a tiny language model whose loss is flce.linear_cross_entropy ---------------------------

V, D = 1000, 64


def tiny_lm():
    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(V, D)
            self.mlp = torch.nn.Linear(D, D)
            self.lm_head = torch.nn.Linear(D, V, bias=False)

        def hidden(self, ids):
            return F.gelu(self.mlp(self.embed(ids)))

        def forward(self, ids, labels):
            # position t predicts labels[:, t + 1] (shift=1), without materializing the logits
            return flce.linear_cross_entropy(self.hidden(ids), self.lm_head.weight, labels, shift=1)

        def reference(self, ids, labels):
            logits = self.hidden(ids)[:, :-1] @ self.lm_head.weight.T
            return F.cross_entropy(logits.reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100)
    return TinyLM()


def tiny_batch(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    labels = ids.clone()
    labels[0, : t // 3] = -100  # a prompt not trained on
    return ids.to(DEV), labels.to(DEV)


def compiled_tiny_lm(b, t):
    # b x t tokens: <= 256 computes the gradients in backward (flce_backward), more lets the
    # library's AUTO choose (loss and gradients in forward, scaled in backward, when chunked)
    def run():
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = tiny_lm().to(DEV)
        ref = copy.deepcopy(model)
        ids, labels = tiny_batch(b, t, seed=b * t)
        ex = torch._dynamo.explain(model)(ids, labels)
        assert ex.graph_break_count == 0, [str(r.reason)[:200] for r in ex.break_reasons]
        torch._dynamo.reset()
        step = torch.compile(model, fullgraph=True)
        opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, ref))
        for i in range(2):  # two steps: the compiled graph runs again on updated weights
            opt.zero_grad(set_to_none=True)
            opt_ref.zero_grad(set_to_none=True)
            loss = step(ids, labels)
            loss.backward()
            loss_ref = ref.reference(ids, labels)
            loss_ref.backward()
            e = rel(loss, loss_ref)
            assert e < 1e-5, f"step {i}: loss {loss.item()} vs {loss_ref.item()}, rel {e:.1e}"
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                e = rel(p.grad, q.grad)
                assert e < 1e-4, f"step {i}: gradient of {name} rel err {e:.1e}"
            opt.step()
            opt_ref.step()
    return run


def compiled_rl_logprobs():
    # per-token log-probs of sampled tokens at temperature 0.7, a clipped-ratio objective, the
    # entropy for logging: compiled with fullgraph=True vs log_softmax of materialized logits
    torch._dynamo.reset()
    g = torch.Generator(device=DEV).manual_seed(5)
    b, t, T = 3, 40, 0.7
    h0 = torch.randn(b, t, D, device=DEV, generator=g)
    w0 = torch.randn(V, D, device=DEV, generator=g) * 0.3
    tokens = torch.randint(0, V, (b, t), device=DEV, generator=g)
    old = -torch.rand(b, t, device=DEV, generator=g) * 8
    adv = torch.randn(b, t, device=DEV, generator=g)
    mask = torch.ones(b, t, device=DEV)
    mask[:, 0] = 0  # position 0 has no log-prob (nothing predicts it)
    mask[2, -6:] = 0

    def objective(logprobs, entropy):
        ratio = torch.exp(logprobs - old)
        loss = -(torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * mask).sum() / mask.sum()
        return loss, logprobs.detach(), entropy.detach()

    @torch.compile(fullgraph=True)
    def step(h, w):
        out = flce.linear_cross_entropy(h, w, tokens, shift=1, reduction="none", temperature=T,
                                        return_logprobs=True, return_entropy=True)
        return objective(out.logprobs, out.entropy)

    def reference(h, w):
        logp = torch.log_softmax((h[:, :-1] @ w.T) / T, dim=-1)
        lp = F.pad(logp.gather(-1, tokens[:, 1:, None]).squeeze(-1), (1, 0))
        ent = F.pad(-(logp.exp() * logp).sum(-1), (1, 0))
        return objective(lp, ent)

    results = []
    for f in (step, reference):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss, lp, ent = f(h, w)
        loss.backward()
        results.append((loss, lp, ent, h.grad, w.grad))
    names = ("loss", "logprobs", "entropy", "grad hidden", "grad weight")
    for name, a, r, tol in zip(names, *results, (1e-5, 1e-5, 1e-5, 1e-4, 1e-4)):
        e = rel(a, r)
        assert e < tol, f"{name}: rel err {e:.1e}"


# ---- a tiny Hugging Face model through flce.patch_hf -------------------------------------------

def hf_helpers():
    """python/test_hf.py's model builders and checks (it imports flce, which is by now the
    installed copy), else a minimal Llama of the same size."""
    try:
        spec = importlib.util.spec_from_file_location("test_hf", os.path.join(HERE, "test_hf.py"))
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        finally:  # test_hf.py puts python/ first on sys.path: off again
            sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != HERE]
        assert mod.flce is flce, "test_hf.py imported another flce"
        name, cfg_cls, model_cls, extra = mod.families()[0]
        assert name == "llama", name
        return mod.build, mod.batch, lambda: mod.check_family(cfg_cls, model_cls, extra), (cfg_cls, model_cls, extra)
    except Exception as e:  # noqa: BLE001
        print(f"  python/test_hf.py not usable here ({type(e).__name__}: {e}): a minimal Llama instead")
    import transformers

    def build(cfg_cls, model_cls, extra, dtype=torch.float32, seed=0):
        torch.manual_seed(seed)
        cfg = cfg_cls(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **extra)
        return model_cls(cfg).to(DEV, dtype).train()

    def batch(v, seed=1, b=3, t=24):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, v, (b, t), generator=g)
        labels = ids.clone()
        labels[2, :7] = -100
        return ids.to(DEV), torch.ones(b, t, dtype=torch.long).to(DEV), labels.to(DEV)
    return build, batch, None, (transformers.LlamaConfig, transformers.LlamaForCausalLM, {})


def hf_compiled(build, batch, family):
    def run():
        torch._dynamo.reset()
        ref = build(*family)
        model = flce.patch_hf(copy.deepcopy(ref))
        ids, mask, labels = batch(ref.config.vocab_size, seed=3)

        def loss_of(m, ids, mask, labels):
            return m(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss = torch.compile(loss_of, fullgraph=True)(model, ids, mask, labels)
        loss.backward()
        loss_ref = loss_of(ref, ids, mask, labels)
        loss_ref.backward()
        e = rel(loss, loss_ref)
        assert e < 2e-5, f"loss {loss.item()} vs unpatched {loss_ref.item()}: rel {e:.1e}"
        worst = max((rel(p.grad, q.grad), n) for (n, p), q in zip(model.named_parameters(), ref.parameters())
                    if q.grad is not None)
        assert worst[0] < 3e-4, f"gradient of {worst[1]} rel err {worst[0]:.1e}"
    return run


def main():
    if torch is None:
        case("flce on sys.path: the installed copy, with libflce.so.0 inside", located)
        print("torch is not installed: skipped" if not failed else f"{passed} passed, {failed} failed")
        return 1 if failed else 77
    case("import flce: the installed copy and the library shipped inside it", installed_copy)
    if failed:
        print(f"{passed} passed, {failed} failed")
        return 1
    if CPU:
        # the stand-in from the source tree (not on sys.path), over the installed flce it imports
        spec = importlib.util.spec_from_file_location("standin", os.path.join(HERE, "standin.py"))
        standin = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(standin)
        assert standin.flce is flce, "standin.py imported another flce"
        standin.install()
        print(f"CPU, float64 stand-in for the kernels: torch {torch.__version__}")
    elif not torch.cuda.is_available():
        print("no CUDA device: skipped (the compiled-model tests need a GPU; --cpu runs them on the CPU "
              "with a float64 stand-in for the kernels)")
        return 77
    else:
        torch.backends.cuda.matmul.allow_tf32 = False  # the eager references in fp32, not TF32
        torch.backends.cudnn.allow_tf32 = False
        print(f"{torch.cuda.get_device_name()}: torch {torch.__version__}")
    case("torch.compile(fullgraph=True) tiny LM, 4x64 tokens: 2 steps = eager F.cross_entropy", compiled_tiny_lm(4, 64))
    case("torch.compile(fullgraph=True) tiny LM, 8x256 tokens: 2 steps = eager F.cross_entropy", compiled_tiny_lm(8, 256))
    case("torch.compile(fullgraph=True) RL objective: logprobs, entropy, temperature", compiled_rl_logprobs)
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: the Hugging Face cases skipped")
    else:
        print(f"transformers {transformers.__version__}")
        build, batch, check, family = hf_helpers()
        if check is not None:
            case("patch_hf llama (test_hf.py's checks): loss, gradients, generation", check)
        case("torch.compile(fullgraph=True) of a patch_hf llama = the unpatched model", hf_compiled(build, batch, family))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
