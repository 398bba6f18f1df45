#!/usr/bin/python3
"""PyTorch parity for fusebox's token models (docs/jobspec.md, "Token models").

A small character language model (T = 16 positions, V = 40 symbols, D = 32,
two pre-LayerNorm transformer blocks of 4 heads, causal) and a classifier that
pools a bidirectional block's output are built in PyTorch from its own modules
(nn.Embedding, nn.MultiheadAttention, nn.LayerNorm, nn.GELU, nn.Linear) with
the state-dict names fusebox gives the same spec.  From the same initial
weights, torch_driver (torch_driver.c) runs the engine and this script
compares, by relative error max|fusebox - torch| / max|torch|:

  grad  one forward and backward: logits, loss and every parameter's
        gradient, <= GRAD_TOL;
  traj  STEPS optimizer updates (Adam alone, B = 1; AdamW fused, B = 4 with
        different learning rates and warmups): the loss before every update,
        <= TRAJ_TOL at every step.

The fusebox package's to_torch builds the same module from the spec, and
fusebox.load rebuilds the engine's weights file: both give the same logits.

The language model's text is the GPL-3 licence every Debian system carries,
folded to 40 symbols; records are T + 1 symbols (input the first T, target the
last T).  The classifier's label is a function of its T symbols.  Exits 0 when
everything agrees, 1 on a failure, 77 when torch cannot be imported (1 under
FUSEBOX_TEST_STRICT=1).
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_torch_parity as tp  # noqa: E402  (exits 77 itself without torch)

np, torch, nn, F = tp.np, tp.torch, tp.nn, tp.F

GRAD_TOL = 1e-4
TRAJ_TOL = 1e-4
STEPS = 40
N = 8
T, V, D, H, BLOCKS = 16, 40, 32, 4, 2
CLASSES = 4
CORPUS = "/usr/share/common-licenses/GPL-3"
SYMBOLS = "abcdefghijklmnopqrstuvwxyz .,;:'()-\n0?!"  # 40; anything else is '?'


class Positional(nn.Module):
    """A learned position table [max_len, D] added to the first T rows."""

    def __init__(self, max_len, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_len, dim) * 0.02)

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


class Block(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)); exact GELU."""

    def __init__(self, dim, heads, mlp_ratio=4, causal=True):
        super().__init__()
        self.causal = causal
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1) if self.causal else None
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class Pool(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def forward(self, x):
        return x.mean(dim=1) if self.mode == "mean" else x[:, 0]


class Tokens(nn.Module):
    """Float ids [N, T] (fusebox's delivery) to int64 for nn.Embedding."""

    def forward(self, x):
        return x.long()


def lm_layers():
    return ([{"type": "embedding", "dim": D}, {"type": "positional", "max_len": 20}] +
            [{"type": "transformer_block", "heads": H}] * BLOCKS +
            [{"type": "layernorm"}, {"type": "linear", "out": V}])


def cls_layers():
    return [{"type": "embedding", "dim": D}, {"type": "positional"},
            {"type": "transformer_block", "heads": H, "mlp_ratio": 2, "causal": False},
            {"type": "pool", "mode": "mean"}, {"type": "linear", "out": CLASSES}]


def build(kind, seed):
    """The torch model of the spec's layers, seeded, with norms made non-trivial.
    An nn.Sequential whose indices are the spec's layer indices, so the state
    dict's names are fusebox's; the id conversion runs before it."""
    torch.manual_seed(seed)
    if kind == "lm":
        mods = [nn.Embedding(V, D), Positional(20, D)]
        mods += [Block(D, H) for _ in range(BLOCKS)]
        mods += [nn.LayerNorm(D), nn.Linear(D, V)]
    else:
        mods = [nn.Embedding(V, D), Positional(T, D), Block(D, H, 2, causal=False), Pool("mean"),
                nn.Linear(D, CLASSES)]
    model = nn.Sequential(*mods)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.6 - 0.3)
            if isinstance(m, nn.MultiheadAttention):
                # the zero biases PyTorch starts from would leave their paths untested
                m.in_proj_bias.copy_(torch.randn(m.in_proj_bias.shape, generator=g) * 0.1)
                m.out_proj.bias.copy_(torch.randn(m.out_proj.bias.shape, generator=g) * 0.1)
    return model


def forward(kind, model, x, y):
    """Logits [N, K] as fusebox lays them out and the loss."""
    ids = torch.from_numpy(x).long()
    if kind == "lm":
        out = model(ids[:, :T])  # [N, T, V]
        loss = F.cross_entropy(out.reshape(-1, V), ids[:, 1:].reshape(-1))
        return out.reshape(out.shape[0], -1), loss
    out = model(ids)
    return out, F.cross_entropy(out, torch.from_numpy(y))


def corpus_ids():
    try:
        with open(CORPUS, encoding="utf-8", errors="replace") as f:
            text = f.read().lower()
    except OSError:
        text = "the quick brown fox jumps over the lazy dog. " * 400
    idx = {c: i for i, c in enumerate(SYMBOLS)}
    return np.array([idx.get(c, SYMBOLS.index("?")) for c in text], dtype=np.int64)


def make_batches(kind, rng, lead):
    """x [lead..., rec] token ids as floats, y [lead...] labels (0 for the LM)."""
    ids = corpus_ids()
    rec = T + 1 if kind == "lm" else T
    count = int(np.prod(lead))
    starts = rng.integers(0, len(ids) - rec, size=count)
    x = np.stack([ids[s:s + rec] for s in starts]).astype(np.float32)
    if kind == "lm":
        y = np.zeros(count, dtype=np.int64)
    else:
        # how many of the record's symbols are vowels, folded to CLASSES
        vowels = np.isin(x, [SYMBOLS.index(c) for c in "aeiou"]).sum(axis=1)
        y = (vowels % CLASSES).astype(np.int64)
    return x.reshape(list(lead) + [rec]), y.reshape(lead)


def make_spec(kind, name, optim, sched, seed):
    layers = lm_layers() if kind == "lm" else cls_layers()
    return {"name": name, "dataset": "torch-parity",
            "model": {"input": {"tokens": T, "vocab": V}, "layers": layers},
            "loss": "cross_entropy", "batch_size": N, "steps": STEPS,
            "optimizer": optim, "schedule": sched, "seed": seed}


def check_grad(args, rep, tmp, kind, seed):
    model = build(kind, seed)
    base = os.path.join(tmp, f"grad_{kind}")
    with open(base + ".json", "w") as f:
        json.dump(make_spec(kind, f"grad-{kind}", {"type": "sgd", "lr": 0.1}, {}, seed), f)
    tp.st_write(base + ".init.safetensors", tp.state_arrays(model))
    x, y = make_batches(kind, np.random.default_rng(seed), [N])
    tp.st_write(base + ".batch.safetensors", {"x": x, "y": y})
    model.train()
    model.zero_grad()
    logits, loss = forward(kind, model, x, y)
    loss.backward()
    grads = {k: p.grad.detach().numpy() for k, p in model.named_parameters()}
    if not tp.run_driver(args, ["grad", base + ".json", base + ".init.safetensors",
                                base + ".batch.safetensors", base], rep, "grad", kind):
        return
    got = tp.st_read(base + ".logits.safetensors")
    rep.add("grad", f"{kind} logits", tp.rel_err(got["logits"], logits.detach().numpy()),
            GRAD_TOL)
    rep.add("grad", f"{kind} loss", tp.rel_err(got["loss"], loss.item()), GRAD_TOL,
            f"loss {loss.item():.4f}")
    # the fusebox package builds the same module from the spec, and loads the
    # engine's weights file from its own metadata
    pkg = tp.fusebox.to_torch(make_spec(kind, "pkg", {"type": "sgd", "lr": 0.1}, {}, seed))
    pkg.load_state_dict({k: torch.from_numpy(v) for k, v in tp.state_arrays(model).items()},
                        strict=True)
    pkg.eval()
    model.eval()
    with torch.no_grad():
        ref = forward(kind, model, x, y)[0].numpy()
        mine = pkg(torch.from_numpy(x[:, :T])).reshape(N, -1).numpy()
    rep.add("grad", f"{kind} fusebox.to_torch logits", tp.rel_err(mine, ref), GRAD_TOL)
    loaded, _ = tp.fusebox.load(base + ".after.safetensors")
    with torch.no_grad():
        mine = loaded(torch.from_numpy(x[:, :T])).reshape(N, -1).numpy()
    rep.add("grad", f"{kind} fusebox.load logits", tp.rel_err(mine, got["logits"]), GRAD_TOL)
    gg = tp.st_read(base + ".grads.safetensors")
    missing = sorted(set(grads) ^ set(gg))
    if missing:
        rep.fail("grad", f"{kind} names", f"names differ: {missing}")
    for k in sorted(set(grads) & set(gg)):
        rep.add("grad", f"{kind} d{k}", tp.rel_err(gg[k], grads[k]), GRAD_TOL)


def torch_trajectory(kind, optim, sched, seed, x, y):
    model = build(kind, seed)
    init = tp.state_arrays(model)
    opt = tp.torch_optimizer(model.parameters(), optim)
    lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: tp.lr_factor(sched, t, STEPS))
    model.train()
    losses = []
    for t in range(STEPS):
        opt.zero_grad()
        _, loss = forward(kind, model, x[t], y[t])
        loss.backward()
        opt.step()
        lr.step()
        losses.append(loss.item())
    return init, losses


def compare(rep, what, got, want, B):
    if not isinstance(got, list) or len(got) != len(want):
        rep.fail("traj", what, f"driver wrote {got!r:.60}, expected {len(want)} losses")
        return
    errs = [abs(a - b) / max(abs(b), 1e-6) if a is not None else float("inf")
            for a, b in zip(got, want)]
    worst = max(range(len(errs)), key=lambda i: errs[i])
    rep.add("traj", what, errs[worst], TRAJ_TOL,
            f"B={B} worst @ step {worst + 1}; loss {want[0]:.4f} -> {want[-1]:.4f}")


def check_traj(args, rep, tmp, kind, members, seed):
    """members: (optimizer, schedule) per member; run alone when there is one,
    fused in one array when there are several."""
    x, y = make_batches(kind, np.random.default_rng(seed), [STEPS, N])
    batches = os.path.join(tmp, f"traj_{kind}_{len(members)}.batches.safetensors")
    tp.st_write(batches, {"x": x, "y": y})
    cmd, wants = ["traj"], []
    for i, (optim, sched) in enumerate(members):
        mseed = seed + 17 * (i + 1)
        init, losses = torch_trajectory(kind, optim, sched, mseed, x, y)
        base = os.path.join(tmp, f"traj_{kind}_{len(members)}_{i}")
        with open(base + ".json", "w") as f:
            json.dump(make_spec(kind, f"traj-{kind}-{i}", optim, sched, mseed), f)
        tp.st_write(base + ".init.safetensors", init)
        cmd += [base + ".json", base + ".init.safetensors"]
        wants.append((f"{kind} {optim['type']} lr {optim['lr']:g} warmup "
                      f"{sched.get('warmup_steps', 0)}", losses))
    out = os.path.join(tmp, f"traj_{kind}_{len(members)}.losses.json")
    what = f"{kind} B={len(members)}"
    if not tp.run_driver(args, cmd + [batches, out], rep, "traj", what):
        return
    with open(out) as f:
        got = json.load(f)
    if len(members) == 1:
        got = [got]
    if not isinstance(got, list) or len(got) != len(members):
        rep.fail("traj", what, f"expected {len(members)} loss lists")
        return
    for (label, want), g in zip(wants, got):
        compare(rep, label, g, want, len(members))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--driver", required=True, help="path of the torch_driver executable")
    ap.add_argument("--backend", default=os.environ.get("FUSEBOX_TEST_BACKEND") or "cpu",
                    choices=["cpu", "cpu-ref", "cuda"])
    ap.add_argument("--keep", help="write the files into this directory and keep them")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rep = tp.Report()
    t0 = time.time()
    adam = {"type": "adam", "lr": 3e-3}
    fused = [({"type": "adamw", "lr": lr, "weight_decay": 0.01}, {"warmup_steps": w})
             for lr, w in ((1e-3, 0), (2e-3, 5), (3e-3, 0), (5e-3, 10))]
    with tempfile.TemporaryDirectory(prefix="fb-torch-tx-") as tmpd:
        tmp = args.keep or tmpd
        os.makedirs(tmp, exist_ok=True)
        check_grad(args, rep, tmp, "lm", 11)
        check_grad(args, rep, tmp, "cls", 12)
        check_traj(args, rep, tmp, "lm", [(adam, {})], 21)
        check_traj(args, rep, tmp, "lm", fused, 22)
        check_traj(args, rep, tmp, "cls", [(adam, {})], 23)
        check_traj(args, rep, tmp, "cls", fused[:2], 24)
    print(f"fusebox token models vs PyTorch {torch.__version__}, backend {args.backend}, "
          f"N={N} T={T} V={V} D={D} H={H}, {STEPS} steps")
    w = max(len(r[1]) for r in rep.rows) if rep.rows else 10
    for kind, what, err, tol, status, note in rep.rows:
        print(f"{kind:5s}  {what:{w}s}  {err:9.2e}  {tol:7.0e}  {status:6s}  {note}")
    print(f"{len(rep.rows) - rep.failed}/{len(rep.rows)} checks passed in {time.time() - t0:.1f} s")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
