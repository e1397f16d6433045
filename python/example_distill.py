#!/usr/bin/env python3
"""example_distill.py — distill one tiny randomly initialised Hugging Face causal LM (the teacher,
frozen) into a smaller one (the student) with flce.linear_distillation: the models run without
their LM heads (model.model(...) gives the last hidden states), and the heads' weights go to flce,
so neither model's tokens x vocab logits exist. The student's hidden size differs from the
teacher's; only the vocabulary is shared.

    python3 python/example_distill.py            # on a GPU (bf16 autocast)
    python3 python/example_distill.py --steps 30 --divergence jsd --beta 0.5 --temperature 2
    (no GPU: runs on the CPU with python/standin.py's float64 stand-in for the library call)

Per step: loss = mean over unmasked positions of D(teacher || student) + ce_weight * CE(student, next
token), with D the divergence asked for (forward KL by default); positions whose next token is
padding are masked with ignore_index. It prints the loss as it falls and, at the end, the same loss
on materialized float64 logits for the trained student, to show the two agree.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flce  # noqa: E402

IGNORE = -100


def tiny_llama(hidden, layers, vocab, seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def batch(vocab, n_seq, seq_len, gen, device):
    """Token ids and next-token labels (shifted by one, the last position and padding masked)."""
    ids = torch.randint(0, vocab, (n_seq, seq_len), generator=gen).to(device)
    labels = torch.full_like(ids, IGNORE)
    labels[:, :-1] = ids[:, 1:]
    pad = torch.rand(n_seq, seq_len, generator=gen).to(device) < 0.1  # some padding positions
    labels[pad] = IGNORE
    return ids, labels


def distill_loss(student, teacher, ids, labels, opts):
    with torch.no_grad():
        t_hidden = teacher.model(input_ids=ids).last_hidden_state
    s_hidden = student.model(input_ids=ids).last_hidden_state
    return flce.linear_distillation(s_hidden, student.lm_head.weight, t_hidden, teacher.lm_head.weight, labels,
                                    **opts)


def reference_loss(student, teacher, ids, labels, opts):
    """The same loss on materialized float64 logits (forward/reverse KL, JSD(beta), CE at T = 1)."""
    with torch.no_grad():
        zs = student.model(input_ids=ids).last_hidden_state.double() @ student.lm_head.weight.double().T
        zt = teacher.model(input_ids=ids).last_hidden_state.double() @ teacher.lm_head.weight.double().T
    t = opts["temperature"]
    lq, lp = (zs / t).log_softmax(-1), (zt / t).log_softmax(-1)
    div, beta = opts["divergence"], opts["beta"]
    if div == "forward_kl" or (div == "jsd" and beta == 0):
        d = (lp.exp() * (lp - lq)).sum(-1)
    elif div == "reverse_kl" or (div == "jsd" and beta == 1):
        d = (lq.exp() * (lq - lp)).sum(-1)
    else:
        lm = torch.logaddexp(lp + torch.tensor(beta).log(), lq + torch.tensor(1 - beta).log())
        d = beta * (lp.exp() * (lp - lm)).sum(-1) + (1 - beta) * (lq.exp() * (lq - lm)).sum(-1)
    valid = labels != IGNORE
    ce = zs.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0].neg()
    per = d + opts["ce_weight"] * ce
    return (per * valid).sum() / valid.sum()


def main():
    ap = argparse.ArgumentParser(description="distill a tiny random LM into a smaller one with flce")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--divergence", default="forward_kl", choices=["forward_kl", "reverse_kl", "jsd"])
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--ce-weight", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    if args.ce_weight and args.temperature != 1:
        ap.error("--ce-weight needs --temperature 1 (the CE term is supported at temperature 1)")

    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if not gpu:
        import standin
        standin.install()
        print("no CUDA device: the library call runs on the CPU stand-in (python/standin.py, float64)")
    vocab = 1000
    teacher = tiny_llama(hidden=128, layers=2, vocab=vocab, seed=0).to(device).eval().requires_grad_(False)
    student = tiny_llama(hidden=64, layers=1, vocab=vocab, seed=1).to(device)
    opts = dict(divergence=args.divergence, beta=args.beta, temperature=args.temperature, ce_weight=args.ce_weight,
                ignore_index=IGNORE)
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(0)
    ids, labels = batch(vocab, n_seq=4, seq_len=64, gen=gen, device=device)  # one batch, fitted repeatedly
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else torch.autocast("cpu", enabled=False)
    first = last = None
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = distill_loss(student, teacher, ids, labels, opts)
        loss.backward()
        opt.step()
        last = loss.item()
        first = last if first is None else first
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {last:.5f}")
    with torch.no_grad():
        flce_loss = distill_loss(student, teacher, ids, labels, opts).item()
    ref = reference_loss(student, teacher, ids, labels, opts).item()
    print(f"after {args.steps} steps: flce {flce_loss:.6f}, materialized float64 {ref:.6f} "
          f"(rel diff {abs(flce_loss - ref) / abs(ref):.1e}); loss {first:.4f} -> {last:.4f}")
    ok = last < first and abs(flce_loss - ref) <= 1e-3 * abs(ref)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
