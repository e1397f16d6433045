"""q5 (session 31): would a per-row bias estimate close the top-k log-prob gap? 8192x4096x128256 bf16, logit std 4
and 2, 128 rows against fp64. The CE pass gives lse, entropy (so E_p[z] = lse - entropy) and, with a row's label set
to one of its 64 largest fp64 logits, that column's pass logit (lse - loss). Per row: eps = -sum(d z)/sum(z^2) with
d = z_pass - z_exact over those 16 columns; lse_corr = lse_pass + eps * E_p[z]. Reported: lse errors before and
after, and the top-64 log-prob error with exact logits against lse_corr (what flce_topk_row would return)."""
import sys, torch
sys.path.insert(0, "python")
import flce
torch.manual_seed(2)
n, d, v, K = 8192, 4096, 128256, 64
for std in (4.0, 2.0):
    h = torch.randn(n, d, device="cuda").bfloat16()
    w = (torch.randn(v, d, device="cuda") * std / d ** 0.5).bfloat16()
    rows = torch.arange(0, n, n // 128, device="cuda")
    z64 = h[rows].double() @ w.double().T
    lse64 = torch.logsumexp(z64, 1)
    top = z64.topk(64, 1)
    y = torch.zeros(n, dtype=torch.long, device="cuda")
    with torch.no_grad():
        o = flce.linear_cross_entropy(h, w, y, reduction="none", return_lse=True, return_entropy=True)
        lse_p, ez = o.lse[rows].double(), (o.lse - o.entropy)[rows].double()
        zp = []
        for k in range(K):
            y[rows] = top.indices[:, k]
            o = flce.linear_cross_entropy(h, w, y, reduction="none", return_lse=True)
            zp.append((o.lse - o.loss)[rows].double())
    zp = torch.stack(zp, 1); ze = top.values[:, :K]
    dl = zp - ze
    eps = -(dl * ze).sum(1) / (ze * ze).sum(1)
    pk = torch.exp(ze - lse_p[:, None])
    lse_k = lse_p - (pk * dl).sum(1)                               # flce_topk_row today: the k exact logits
    lse_c = lse_k + eps * (ez - (pk * ze).sum(1))                  # + the rest's bias, eps * E_p[z] outside K
    lp_ref = top.values - lse64[:, None]
    for name, l in (("pass", lse_p), ("k exact (today)", lse_k), ("k exact + bias", lse_c)):
        e = l - lse64
        print(f"std {std} {name:16s}: lse error {e.mean():.3e} +- {e.std():.3e}; top-64 log-prob error max|.| "
              f"{((top.values - l[:, None]) - lp_ref).abs().max():.3e}")
    print(f"std {std}: eps mean {eps.mean():.3e} sd {eps.std():.3e}; top-64 mass {pk.sum(1).mean():.3f}")
    sys.stdout.flush()
