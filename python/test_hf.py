#!/usr/bin/env python3
"""test_hf.py — flce.patch_hf against the unpatched Hugging Face model, on tiny random configs built
in code (nothing is downloaded): Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2 and Gemma 3 (text;
Gemma 2/3 with final_logit_softcapping). For each: the loss and every parameter's gradient equal
the unpatched model's (fp32, with ignored labels and padding), with num_items_in_batch (the
Trainer's gradient accumulation) too; logits are not made (out.logits is None); generation and
forward without labels are untouched; the forward's signature is the model's (the Trainer looks
for **kwargs there); unpatch_hf restores the model. One bf16 smoke case, one under torch.autocast.

  python3 python/test_hf.py           # needs a CUDA GPU (skips, exit 77, without one)
  python3 python/test_hf.py --cpu     # without a GPU: the float64 stand-in for the kernels
                                      # (standin.py), to check the plumbing
Exit status 0 when all pass, 1 on a failure, 77 when torch, transformers or a GPU is missing.
The last line reads 'N passed, N failed'.
"""
import copy
import inspect
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)
try:
    import transformers
except ImportError:
    print("transformers is not installed: skipped")
    sys.exit(77)

import flce  # noqa: E402

CPU = "--cpu" in sys.argv
GPU = torch.cuda.is_available() and not CPU
DEV = "cuda" if GPU else "cpu"
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
    a, b = a.double(), b.double()
    d = b.norm().item()
    return (a - b).norm().item() / d if d else (a - b).norm().item()


TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)


def families():
    """(name, config class, model class, extra config) of the families transformers here has."""
    out = []
    for name, cfg, model, extra in (
            ("llama", "LlamaConfig", "LlamaForCausalLM", {}),
            ("mistral", "MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
            ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", {}),
            ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
            ("gemma", "GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
            ("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
             dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8, final_logit_softcapping=3.0)),
            ("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",
             dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8, final_logit_softcapping=3.0))):
        c, m = getattr(transformers, cfg, None), getattr(transformers, model, None)
        if c is None or m is None:
            print(f"skipped {name}: transformers {transformers.__version__} has no {model}")
            continue
        out.append((name, c, m, extra))
    return out


def build(cfg_cls, model_cls, extra, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = cfg_cls(**TINY, **extra)
    try:
        model = model_cls._from_config(cfg, attn_implementation="eager")
    except (TypeError, ValueError, AttributeError):
        model = model_cls(cfg)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)  # peaked logits: a stricter test than ~uniform
    return model.to(DEV, dtype).train()


def batch(v, seed=1, b=3, t=24):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, (b, t), generator=g)
    labels = ids.clone()
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, -5:] = 0            # right padding
    labels[1, -5:] = -100
    labels[2, :7] = -100        # a prompt that is not trained on
    return ids.to(DEV), mask.to(DEV), labels.to(DEV)


def check_family(cfg_cls, model_cls, extra):
    ref = build(cfg_cls, model_cls, extra)
    model = copy.deepcopy(ref)
    assert flce.patch_hf(model) is model
    assert flce.patch_hf(model) is model  # twice: a no-op
    params = inspect.signature(model.forward).parameters
    assert "labels" in params and any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()), \
        f"patched forward's signature lost the model's: {list(params)}"
    ids, mask, labels = batch(ref.config.vocab_size)
    for kwargs in ({}, {"num_items_in_batch": torch.tensor(41, device=DEV)}):
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, **kwargs)
        out_ref = ref(input_ids=ids, attention_mask=mask, labels=labels, **kwargs)
        assert out.logits is None, "the patched model should not make logits"
        e = rel(out.loss.detach(), out_ref.loss.detach())
        assert e < 1e-5, f"loss {out.loss.item()} vs {out_ref.loss.item()} ({kwargs}): rel {e:.1e}"
        (out.loss * 1.5).backward()
        (out_ref.loss * 1.5).backward()
        worst = max((rel(p.grad, q.grad), n) for (n, p), q in zip(model.named_parameters(), ref.parameters())
                    if q.grad is not None)
        assert worst[0] < 1e-4, f"gradient of {worst[1]} rel err {worst[0]:.1e} ({kwargs})"
    # labels passed positionally (in the model's own argument order)
    names = list(inspect.signature(ref.forward).parameters)
    args = [None] * (names.index("labels") + 1)
    args[0], args[names.index("attention_mask")], args[-1] = ids, mask, labels
    with torch.no_grad():
        out = model(*args)
        out_ref = ref(input_ids=ids, attention_mask=mask, labels=labels)
    assert out.logits is None and rel(out.loss, out_ref.loss) < 1e-5, "labels given positionally"
    # eval mode with labels: the model's own forward (logits for metrics), unless eval_logits=False
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        assert out.logits is not None and out.loss is not None, "eval mode should keep the logits"
        lean = flce.patch_hf(copy.deepcopy(flce.unpatch_hf(copy.deepcopy(model))), eval_logits=False)
        lean.eval()
        out2 = lean(input_ids=ids, attention_mask=mask, labels=labels)
        assert out2.logits is None and rel(out2.loss, out.loss) < 1e-5, "eval_logits=False"
    model.train()
    # without labels: the model's own forward, logits bit for bit
    with torch.no_grad():
        a, b = model(input_ids=ids, attention_mask=mask).logits, ref(input_ids=ids, attention_mask=mask).logits
    assert a is not None and torch.equal(a, b), "forward without labels changed"
    model.eval()
    ref.eval()
    with torch.no_grad():
        g1 = model.generate(ids[:1, :6], max_new_tokens=5, do_sample=False)
        g2 = ref.generate(ids[:1, :6], max_new_tokens=5, do_sample=False)
    assert torch.equal(g1, g2), "generation changed"
    copied = copy.deepcopy(model)
    assert getattr(copied.forward, "__self__", None) is copied, "a deep copy's forward must be its own"
    flce.unpatch_hf(model)
    assert model(input_ids=ids, labels=labels).logits is not None, "unpatch_hf did not restore the forward"


def bf16_smoke():
    name, cfg_cls, model_cls, extra = families()[0]
    ref = build(cfg_cls, model_cls, extra, torch.bfloat16)
    model = flce.patch_hf(copy.deepcopy(ref))
    ids, mask, labels = batch(ref.config.vocab_size, seed=2)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out_ref = ref(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    out_ref.loss.backward()
    # the unpatched model rounds its logits to bf16; flce keeps them in fp32: close, not equal
    assert rel(out.loss.detach(), out_ref.loss.detach()) < 2e-2
    w, w_ref = model.get_output_embeddings().weight.grad, ref.get_output_embeddings().weight.grad
    assert w.dtype == torch.bfloat16 and rel(w, w_ref) < 5e-2, rel(w, w_ref)


def autocast_smoke():
    # fp32 parameters under torch.autocast (mixed-precision training): flce runs in bf16 like the
    # model's own lm_head (no fp32 copy of the hidden states), fp32 gradients, close to the unpatched
    name, cfg_cls, model_cls, extra = families()[0]
    ref = build(cfg_cls, model_cls, extra)
    model = flce.patch_hf(copy.deepcopy(ref))
    ids, mask, labels = batch(ref.config.vocab_size, seed=3)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out_ref = ref(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    out_ref.loss.backward()
    assert rel(out.loss.detach(), out_ref.loss.detach()) < 2e-2
    w, w_ref = model.get_output_embeddings().weight.grad, ref.get_output_embeddings().weight.grad
    assert w.dtype == torch.float32 and rel(w, w_ref) < 5e-2, rel(w, w_ref)


def compiled_no_graph_break():
    # the patched forward under torch.compile: dynamo traces it whole (explain), and the compiled
    # loss and gradients (aot_eager: no kernel compile time) equal the eager patched model's
    for name, cfg_cls, model_cls, extra in families():
        if name not in ("llama", "gemma2"):
            continue
        model = flce.patch_hf(build(cfg_cls, model_cls, extra))
        ids, mask, labels = batch(model.config.vocab_size, seed=3)

        def loss_of(m, ids, mask, labels):
            return m(input_ids=ids, attention_mask=mask, labels=labels).loss
        torch._dynamo.reset()
        ex = torch._dynamo.explain(loss_of)(model, ids, mask, labels)
        assert ex.graph_break_count == 0, f"{name}: {[str(r.reason)[:200] for r in ex.break_reasons]}"
        torch._dynamo.reset()
        eager = loss_of(model, ids, mask, labels)
        eager.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        compiled = torch.compile(loss_of, backend="aot_eager")(model, ids, mask, labels)
        compiled.backward()
        assert rel(compiled.detach(), eager.detach()) < 1e-6, name
        worst = max(rel(p.grad, g) for p, g in zip(model.parameters(), grads))
        assert worst < 1e-5, f"{name}: compiled gradients differ by {worst:.1e}"


def refuses_unknown():
    class Cfg:
        model_type = "cohere"
    m = torch.nn.Module()
    m.config = Cfg()
    try:
        flce.patch_hf(m)
    except ValueError as e:
        assert "cohere" in str(e)
        return
    raise AssertionError("an unchecked model type should be refused")


def main():
    if not GPU and not CPU:
        print("no CUDA device: skipped (python3 python/test_hf.py --cpu checks the plumbing with a float64 "
              "stand-in for the kernels)")
        return 77
    if CPU:
        try:
            flce._lib.lib()
        except flce.FlceLibraryNotFound as e:
            print(f"no libflce.so to build problems with: skipped ({e})")
            return 77
        import standin
        standin.install()
        print(f"CPU, float64 stand-in for the kernels; transformers {transformers.__version__}")
    else:
        print(f"{torch.cuda.get_device_name()}: flce {flce.version()}, torch {torch.__version__}, transformers "
              f"{transformers.__version__}")
    for name, cfg_cls, model_cls, extra in families():
        case(f"{name}: loss, gradients, num_items_in_batch, generation", lambda: check_family(cfg_cls, model_cls, extra))
    case("torch.compile of the patched model: no graph break, same loss and gradients", compiled_no_graph_break)
    case("bf16 smoke", bf16_smoke)
    case("autocast smoke (fp32 parameters, bf16 autocast)", autocast_smoke)
    case("unchecked model types refused", refuses_unknown)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
