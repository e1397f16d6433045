"""q2 (session 31): is the fp32 logits pass's rounding biased? 8192x4096x128256 bf16, logit std 4 (and 2):
the CE pass's lse and label logit (labels = each row's fp64 argmax, where the mass is) against fp64 on 128 rows;
the top-k call's log-probs against fp64 on the same rows."""
import sys, torch
sys.path.insert(0, "python")
import flce
torch.manual_seed(1)
n, d, v = 8192, 4096, 128256
for std in (4.0, 2.0):
    h = torch.randn(n, d, device="cuda").bfloat16()
    w = (torch.randn(v, d, device="cuda") * std / d ** 0.5).bfloat16()
    rows = torch.arange(0, n, n // 128, device="cuda")
    z64 = h[rows].double() @ w.double().T
    lse64 = torch.logsumexp(z64, 1)
    y = torch.zeros(n, dtype=torch.long, device="cuda")
    y[rows] = z64.argmax(1)
    with torch.no_grad():
        o = flce.linear_cross_entropy(h, w, y, reduction="none", return_lse=True)
        loss, lse = o.loss, o.lse
    zy = (lse - loss)[rows].double()          # the pass's label logit: loss = lse − z_y
    dz = zy - z64.gather(1, y[rows, None])[:, 0]
    dl = lse[rows].double() - lse64
    ztop = z64.gather(1, y[rows, None])[:, 0]
    print(f"std {std}: top logit mean {ztop.mean():.3f}; its error mean {dz.mean():.3e} sd {dz.std():.3e}; "
          f"relative mean {(dz / ztop).mean():.3e} sd {(dz / ztop).std():.3e}")
    print(f"std {std}: lse error mean {dl.mean():.3e} sd {dl.std():.3e} max|.| {dl.abs().max():.3e}")
    r = flce.topk_logprobs(h, w, 64)
    ref = torch.log_softmax(z64, 1).gather(1, r.indices[rows])
    e = r.logprobs[rows].double() - ref
    el = r.lse[rows].double() - lse64
    print(f"std {std}: top-64 log-prob error mean {e.mean():.3e} sd {e.std():.3e} max|.| {e.abs().max():.3e}; "
          f"its lse error mean {el.mean():.3e} sd {el.std():.3e}; top-64 mass {torch.softmax(z64, 1).topk(64).values.sum(1).mean():.3f}")
    sys.stdout.flush()
