#!/usr/bin/python3
"""PyTorch parity for fusebox's engine.

For each model below this script builds the PyTorch module that a fusebox job
spec describes (the spec's layer list is the one source of truth; the module is
built from it by the fusebox package's to_torch, python/fusebox), draws seeded initial weights and random batches,
writes the spec, the weights and the batches to files, runs torch_driver (the
engine, see torch_driver.c) on them and compares:

  grad  one train-mode forward and backward: logits, loss, every parameter
        gradient, the batch-norm running statistics after the forward and an
        eval-mode forward that uses them, each by relative error
        max|fusebox - torch| / max(max|torch|, 1e-6) <= 1e-4; and the weights
        file fusebox saved describes itself: fusebox.load rebuilds the model
        from its metadata (spec, preprocess, version) with its tensors;
  traj  50 optimizer updates on a fixed sequence of batches with SGD
        (momentum, dampening, Nesterov), Adam and AdamW under constant, step
        and cosine (with warmup) schedules: the loss before every update, with
        relative error <= 1e-3 at every step (the worst step is reported).  Every member is run alone (B = 1) and again fused with the
        other members that share its optimizer type (B > 1).
  bf16  the MLP trained BF16_STEPS updates (Adam, cosine schedule) from one
        init on BF16_STEPS distinct batches four ways: fusebox with
        "precision": "bf16" (B = 2, beside a member with another seed),
        PyTorch in float32, PyTorch under torch.autocast("cpu",
        dtype=torch.bfloat16), and PyTorch with fusebox's definition written
        out (the operands of each linear product rounded to bf16 in both
        directions, all else float).  With a gap being the mean over steps of
        |a - b| / b of the losses:
          fusebox vs the definition, first BF16_DEF_STEPS   <= BF16_DEF_TOL
          fusebox vs autocast                               <= BF16_TOL
          fusebox vs float32, autocast vs float32           >= BF16_FLOOR,
          and the larger of these two within BF16_RATIO of the smaller.
        See the constants for where the bounds come from.

It prints a table and exits 0 when everything agrees, 1 on any failure and 77
(skipped) when torch or numpy cannot be imported (1 under FUSEBOX_TEST_STRICT=1,
which scripts/test sets).  Safetensors files are read
and written by hand (there is no safetensors package here).
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.environ.get("FB_SOURCE_DIR") or
                                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."),
                                "python"))
try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import fusebox
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("FUSEBOX_TEST_STRICT") == "1":  # scripts/test installs both
        print(f"FAILED: a prerequisite is missing under FUSEBOX_TEST_STRICT=1: PyTorch/numpy ({e})")
        sys.exit(1)
    print(f"SKIPPED: PyTorch/numpy not importable ({e})")
    sys.exit(77)

GRAD_TOL = 1e-4
TRAJ_TOL = 1e-3
STEPS = 50
# The bf16 bounds.  bf16 keeps 8 significant bits, so rounding moves a value
# by at most u = 2^-9 of itself.  Each step of a bf16 run perturbs the loss by
# about u relative to float32, and the perturbations neither vanish nor blow
# up along a trajectory (training pulls both runs toward the same minimum), so
# a bf16 run's losses stay O(u) from float32's: about 1.2u on average here.
# Two bf16 computations differ from each other by the same order, since their
# roundings differ (autocast also rounds outputs, activations and bias sums,
# which fusebox keeps in float): fusebox vs autocast <= 4u on average.  Both
# must stand at least u/8 from float32, so the mode is not a no-op: float32
# fusebox vs float32 torch differ only in summation order, about 1e-7 over
# these steps.  Both bf16 flavours see the same rounding noise, so their gaps
# to float32 are within a factor 4 of each other.  The definition written out
# in PyTorch rounds the same operands: at first the two agree to float
# summation order (1e-7 per step), but a summation difference that moves a
# value across a bf16 rounding boundary is a u-sized change, and such flips
# grow to the bf16 noise level within some 100 steps; over the first 20 steps
# they must stay within u/32 (fp32 math, ignoring the mode, would be ~0.7u).
BF16_STEPS = 300
BF16_DEF_STEPS = 20
BF16_U = 2.0 ** -9
BF16_TOL = 4 * BF16_U
BF16_FLOOR = BF16_U / 8
BF16_RATIO = 4.0
BF16_DEF_TOL = BF16_U / 32
POOL = 4
N = 16
CLASSES = 10

# --------------------------------------------------------------- safetensors

ST_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
ST_NAMES = {np.dtype(v): k for k, v in ST_DTYPES.items()}


def st_write(path, tensors):
    """Writes {name: ndarray} as a safetensors file (names sorted)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.array(tensors[name], order="C")  # ascontiguousarray would make 0-d 1-d
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": ST_NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def st_read(path):
    """Reads a safetensors file into {name: ndarray}."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        dt = np.dtype(ST_DTYPES[h["dtype"]]).newbyteorder("<")
        b, e = h["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=dt).reshape(h["shape"]).astype(dt.newbyteorder("="))
    return out


# ------------------------------------------------------- spec -> torch module

def build_torch(layers, shape):
    """The nn.Sequential a fusebox layer list describes, and its output shape:
    the fusebox package's to_torch, the one translation of specs to torch."""
    model = {"input": list(shape), "layers": layers}
    return fusebox.to_torch(model), fusebox.output_shape(model)


def init_model(layers, in_shape, seed):
    """A module with PyTorch's default init from seed, plus non-trivial norm
    affine parameters and running statistics (so their paths are exercised)."""
    torch.manual_seed(seed)
    model, out = build_torch(layers, in_shape)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)):
                if m.weight is not None:
                    m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                    m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.6 - 0.3)
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 1.5 + 0.5)
                m.num_batches_tracked.fill_(3)
    return model, out


def state_arrays(model):
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------ models

def mlp():
    return [{"type": "flatten"}, {"type": "linear", "out": 64}, {"type": "relu"},
            {"type": "linear", "out": CLASSES}]


def mlp_act():
    return [{"type": "flatten"}, {"type": "linear", "out": 48}, {"type": "gelu"},
            {"type": "linear", "out": 40}, {"type": "gelu", "approximate": "tanh"},
            {"type": "linear", "out": 32}, {"type": "tanh"},
            {"type": "linear", "out": 24}, {"type": "sigmoid"},
            {"type": "linear", "out": CLASSES}]


def mlp_norm():
    # layernorm first: it reads the shared input through a per-member copy.
    # Nothing affine sits between a bias and a batch norm: batch norm removes
    # a per-feature shift, so such a bias has an exactly zero gradient whose
    # computed value is rounding noise (~1e-9) that no relative bound can judge.
    return [{"type": "layernorm"}, {"type": "flatten"},
            {"type": "linear", "out": 48}, {"type": "relu"}, {"type": "batchnorm"},
            {"type": "linear", "out": 32, "bias": False},
            {"type": "layernorm", "eps": 1e-3}, {"type": "gelu"},
            {"type": "dropout", "p": 0.0}, {"type": "linear", "out": CLASSES}]


def cnn():
    # convolutions before batch norm have no bias (see mlp_norm)
    return [{"type": "conv2d", "out": 8, "kernel": 3, "padding": 1, "bias": False},
            {"type": "batchnorm"}, {"type": "relu"},
            {"type": "maxpool2d", "kernel": 2},
            {"type": "conv2d", "out": 16, "kernel": 3, "stride": 2, "bias": False},
            {"type": "batchnorm", "momentum": 0.2}, {"type": "relu"},
            {"type": "avgpool2d", "kernel": 2},
            {"type": "flatten"}, {"type": "dropout", "p": 0.0},
            {"type": "linear", "out": CLASSES}]


def cnn_pad():
    # padded, overlapping and non-square windows
    return [{"type": "conv2d", "out": 6, "kernel": 5, "padding": 2},
            {"type": "tanh"},
            {"type": "maxpool2d", "kernel": 3, "stride": 2, "padding": 1},
            {"type": "conv2d", "out": 8, "kernel": [3, 1], "stride": [1, 2], "padding": [1, 0]},
            {"type": "relu"},
            {"type": "avgpool2d", "kernel": 3, "stride": 2, "padding": 1},
            {"type": "layernorm"},
            {"type": "flatten"}, {"type": "linear", "out": CLASSES}]


def cnn_relu_pool():
    # relu straight before max pooling (the engine pools first, then applies
    # relu to the pooled values): overlapping padded windows, then 2x2
    return [{"type": "conv2d", "out": 6, "kernel": 3, "padding": 1},
            {"type": "relu"},
            {"type": "maxpool2d", "kernel": 3, "stride": 2, "padding": 1},
            {"type": "conv2d", "out": 8, "kernel": 3, "padding": 1},
            {"type": "relu"},
            {"type": "maxpool2d", "kernel": 2},
            {"type": "flatten"}, {"type": "linear", "out": CLASSES}]


def resnet():
    return [{"type": "conv2d", "out": 4, "kernel": 3, "padding": 1, "bias": False},
            {"type": "batchnorm"}, {"type": "relu"},
            {"type": "residual",
             "body": [{"type": "conv2d", "out": 4, "kernel": 3, "padding": 1, "bias": False},
                      {"type": "batchnorm"}, {"type": "relu"},
                      {"type": "conv2d", "out": 4, "kernel": 3, "padding": 1, "bias": False},
                      {"type": "batchnorm"}],
             "shortcut": []},
            {"type": "relu"},
            {"type": "residual",
             "body": [{"type": "conv2d", "out": 8, "kernel": 3, "stride": 2, "padding": 1,
                       "bias": False},
                      {"type": "batchnorm"}, {"type": "relu"},
                      {"type": "conv2d", "out": 8, "kernel": 3, "padding": 1, "bias": False},
                      {"type": "batchnorm"}],
             "shortcut": [{"type": "conv2d", "out": 8, "kernel": 1, "stride": 2, "bias": False},
                          {"type": "batchnorm"}]},
            {"type": "relu"},
            {"type": "global_avgpool"},
            {"type": "linear", "out": CLASSES}]


# name: (layers, input shape, loss)
MODELS = {
    "mlp": (mlp(), [1, 12, 12], "cross_entropy"),
    "mlp_act": (mlp_act(), [1, 12, 12], "cross_entropy"),
    "mlp_norm": (mlp_norm(), [1, 12, 12], "mse"),
    "cnn": (cnn(), [1, 12, 12], "cross_entropy"),
    "cnn_pad": (cnn_pad(), [1, 12, 12], "cross_entropy"),
    "resnet": (resnet(), [3, 8, 8], "cross_entropy"),
    "cnn_relu_pool": (cnn_relu_pool(), [1, 12, 12], "cross_entropy"),
}

OPTIMIZERS = {
    "sgd": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3},
    "sgd_nesterov": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True,
                     "weight_decay": 5e-4},
    "adam": {"type": "adam", "lr": 3e-3, "betas": [0.9, 0.99], "weight_decay": 1e-3},
    "adamw": {"type": "adamw", "lr": 3e-3, "betas": [0.9, 0.99], "weight_decay": 0.05},
}

SCHEDULES = {
    "cosine_w5": {"type": "cosine", "warmup_steps": 5},
    "step10": {"type": "step", "step_size": 10, "gamma": 0.5},
    "constant": {"type": "constant"},
    "cosine_min": {"type": "cosine", "warmup_steps": 3, "min_lr_factor": 0.1},
    "step_w4": {"type": "step", "warmup_steps": 4, "step_size": 7, "gamma": 0.7},
}

FULL = [(o, s) for o in ("sgd", "sgd_nesterov", "adam", "adamw")
        for s in ("cosine_w5", "step10", "constant")]
# model: the (optimizer, schedule) pairs trained for STEPS updates
TRAJECTORIES = {
    "mlp": FULL,
    "cnn": FULL,
    "mlp_norm": [("sgd", "cosine_min"), ("adamw", "step_w4")],
    "resnet": [("sgd_nesterov", "cosine_w5"), ("sgd", "step_w4"), ("adam", "cosine_min"),
               ("adamw", "constant")],
    "cnn_relu_pool": [("sgd", "step10"), ("adamw", "cosine_w5")],
}


def make_spec(name, layers, in_shape, loss, optim, sched, seed):
    return {"name": name, "dataset": "torch-parity",
            "model": {"input": list(in_shape), "layers": layers},
            "loss": loss, "batch_size": N, "steps": STEPS,
            "optimizer": optim, "schedule": sched, "seed": seed}


def lr_factor(sched, t, total):
    """The documented LR factor of update t (0-based) of total updates."""
    w = sched.get("warmup_steps", 0)
    if t < w:
        return (t + 1) / w
    u = t - w
    kind = sched.get("type", "constant")
    if kind == "step":
        return sched.get("gamma", 0.1) ** (u // sched["step_size"])
    if kind == "cosine":
        T = total - w
        if T <= 0:
            return 1.0
        m = sched.get("min_lr_factor", 0.0)
        return m + (1 - m) * (1 + math.cos(math.pi * min(u, T) / T)) / 2
    return 1.0


def torch_optimizer(params, o):
    wd = o.get("weight_decay", 0.0)
    if o["type"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.0),
                               dampening=o.get("dampening", 0.0),
                               nesterov=o.get("nesterov", False), weight_decay=wd)
    cls = torch.optim.Adam if o["type"] == "adam" else torch.optim.AdamW
    return cls(params, lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))),
               eps=o.get("eps", 1e-8), weight_decay=wd)


def loss_fn(kind, out, y):
    if kind == "cross_entropy":
        return F.cross_entropy(out, y)
    return F.mse_loss(out, F.one_hot(y, out.shape[1]).to(out.dtype))


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-6))


def make_inputs(rng, shape, lead, teacher=None):
    x = rng.standard_normal(list(lead) + list(shape)).astype(np.float32)
    if teacher is None:
        y = rng.integers(0, CLASSES, size=lead).astype(np.int64)
    else:
        # learnable labels, so the trajectories go somewhere
        y = np.argmax(x.reshape(list(lead) + [-1]) @ teacher, axis=-1).astype(np.int64)
    return x, y


# ------------------------------------------------------------------- checks

class Report:
    def __init__(self):
        self.rows = []
        self.failed = 0

    def add(self, kind, what, err, tol, note=""):
        ok = err <= tol
        self.failed += not ok
        self.rows.append((kind, what, err, tol, "ok" if ok else "FAIL", note))

    def add_min(self, kind, what, value, floor, note=""):
        """A check that value is at least floor (shown as value and -floor)."""
        ok = value >= floor
        self.failed += not ok
        self.rows.append((kind, what, value, -floor, "ok" if ok else "FAIL", note or "needs >= |tol|"))

    def fail(self, kind, what, note):
        self.failed += 1
        self.rows.append((kind, what, float("inf"), 0.0, "FAIL", note))


def run_driver(args, cmd, rep, kind, what):
    full = [args.driver, "--backend", args.backend] + cmd
    p = subprocess.run(full, capture_output=True, text=True)
    if p.returncode == 77:
        # the driver has no device for this backend (cuda on a machine without one)
        print(f"SKIPPED: {p.stderr.strip()[-300:]}")
        sys.exit(77)
    if p.returncode != 0:
        rep.fail(kind, what, f"driver exit {p.returncode}: {p.stderr.strip()[-300:]}")
        if args.verbose:
            print(" ".join(full), file=sys.stderr)
        return False
    return True


def check_grad(args, rep, tmp, name, seed):
    layers, in_shape, loss = MODELS[name]
    model, out_shape = init_model(layers, in_shape, seed)
    spec = make_spec(name, layers, in_shape, loss, OPTIMIZERS["sgd"], SCHEDULES["constant"], seed)
    base = os.path.join(tmp, f"grad_{name}")
    with open(base + ".json", "w") as f:
        json.dump(spec, f)
    init = state_arrays(model)
    st_write(base + ".init.safetensors", init)
    rng = np.random.default_rng(seed)
    x, y = make_inputs(rng, in_shape, [N])
    st_write(base + ".batch.safetensors", {"x": x, "y": y})

    model.train()
    model.zero_grad()
    out = model(torch.from_numpy(x))
    L = loss_fn(loss, out, torch.from_numpy(y))
    L.backward()
    after = state_arrays(model)
    model.eval()
    with torch.no_grad():
        eval_out = model(torch.from_numpy(x))

    if not run_driver(args, ["grad", base + ".json", base + ".init.safetensors",
                             base + ".batch.safetensors", base + ".out"], rep, "grad", name):
        return
    try:
        got = st_read(base + ".out.logits.safetensors")
        grads = st_read(base + ".out.grads.safetensors")
        saved = st_read(base + ".out.after.safetensors")
        for k in ("logits", "eval_logits", "loss"):
            got[k]
    except (OSError, ValueError, KeyError, struct.error) as e:
        rep.fail("grad", name, f"unreadable driver output: {e!r}")
        return

    rep.add("grad", f"{name} logits", rel_err(got["logits"], out.detach().numpy()), GRAD_TOL)
    rep.add("grad", f"{name} loss", rel_err(got["loss"], L.detach().numpy()), GRAD_TOL,
            f"torch {L.item():.6f}")
    rep.add("grad", f"{name} eval logits", rel_err(got["eval_logits"], eval_out.numpy()),
            GRAD_TOL)

    params = dict(model.named_parameters())
    if set(grads) != set(params):
        rep.fail("grad", f"{name} gradient names",
                 f"fusebox {sorted(set(grads) - set(params))} torch {sorted(set(params) - set(grads))}")
    worst, worst_name = 0.0, "-"
    for k, p in params.items():
        if k not in grads:
            continue
        e = rel_err(grads[k], p.grad.numpy())
        if args.verbose:
            print(f"    {name} grad {k:28s} {e:.2e}")
        if e >= worst:
            worst, worst_name = e, k
    rep.add("grad", f"{name} gradients ({len(params)})", worst, GRAD_TOL, f"worst {worst_name}")

    if set(saved) != set(after):
        rep.fail("grad", f"{name} state names",
                 f"fusebox {sorted(set(saved) - set(after))} torch {sorted(set(after) - set(saved))}")
    stats = [k for k in after if k.endswith("running_mean") or k.endswith("running_var")]
    if stats:
        worst, worst_name = 0.0, "-"
        for k in stats:
            e = rel_err(saved.get(k, np.zeros(0)), after[k])
            if e >= worst:
                worst, worst_name = e, k
        rep.add("grad", f"{name} running stats ({len(stats)})", worst, GRAD_TOL,
                f"worst {worst_name}")
        nbt = [k for k in after if k.endswith("num_batches_tracked")]
        bad = [k for k in nbt if k not in saved or int(saved[k]) != int(after[k])]
        rep.add("grad", f"{name} num_batches_tracked ({len(nbt)})", float(len(bad)), 0.0,
                ", ".join(bad[:3]))
    # parameters survive the load/save round trip bit for bit
    worst = max(rel_err(saved.get(k, np.zeros(0)), init[k]) for k in params)
    rep.add("grad", f"{name} saved parameters", worst, 0.0)
    # the saved file describes itself: fusebox.load rebuilds this model from its metadata
    # alone, with the file's tensors
    try:
        loaded, fspec = fusebox.load(base + ".out.after.safetensors")
        ok = (fspec["model"]["layers"] == json.loads(json.dumps(
            fusebox.from_torch(model, in_shape)["layers"])) and
            fspec.preprocess.uint8_scale == 1 / 255 and bool(fspec.fusebox_version) and
            all(np.array_equal(v.numpy(), saved[k]) for k, v in loaded.state_dict().items()))
        rep.add("grad", f"{name} file metadata", 0.0 if ok else 1.0, 0.0,
                "fusebox.load: spec, preprocess, version, tensors")
    except fusebox.FuseboxError as e:
        rep.fail("grad", f"{name} file metadata", f"fusebox.load: {e}")


def torch_trajectory(name, o, s, seed, x, y):
    layers, in_shape, loss = MODELS[name]
    model, _ = init_model(layers, in_shape, seed)
    init = state_arrays(model)
    opt = torch_optimizer(model.parameters(), OPTIMIZERS[o])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: lr_factor(SCHEDULES[s], t, STEPS))
    model.train()
    losses = []
    for t in range(STEPS):
        opt.zero_grad()
        L = loss_fn(loss, model(torch.from_numpy(x[t])), torch.from_numpy(y[t]))
        L.backward()
        opt.step()
        sched.step()
        losses.append(L.item())
    return init, losses


def read_losses(rep, what, path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        rep.fail("traj", what, f"unreadable driver output: {e!r}")
        return None


def compare_traj(rep, what, got, want, B):
    if not isinstance(got, list):
        rep.fail("traj", what, f"driver wrote {type(got).__name__}, expected a list")
        return
    got = [float("nan") if v is None else v for v in got]
    if len(got) != len(want):
        rep.fail("traj", what, f"{len(got)} losses, expected {len(want)}")
        return
    errs = [abs(a - b) / max(abs(b), 1e-6) if math.isfinite(a) else float("inf")
            for a, b in zip(got, want)]
    # every step is judged: a trajectory that strays and comes back (or ends
    # near the same minimum by another path) is not a match
    worst = max(range(len(errs)), key=lambda i: errs[i])
    rep.add("traj", what, errs[worst], TRAJ_TOL,
            f"B={B} worst @ step {worst + 1}, last {errs[-1]:.2e}; "
            f"loss {want[0]:.4f} -> {want[-1]:.4f}")


def bf16_round(t):
    """t rounded to bfloat16 (nearest, ties to even) and back to float32."""
    return t.to(torch.bfloat16).to(torch.float32)


class Bf16Linear(torch.autograd.Function):
    """fusebox's bf16 linear layer: the operands of each product (input and
    weight forward; output gradient, input and weight backward) rounded to
    bf16, products accumulated and results kept in float32; the bias gradient
    sums the rounded output gradient, as the engine's does."""

    @staticmethod
    def forward(ctx, x, w, b):
        rx, rw = bf16_round(x), bf16_round(w)
        ctx.save_for_backward(rx, rw)
        return rx @ rw.t() + b

    @staticmethod
    def backward(ctx, g):
        rx, rw = ctx.saved_tensors
        rg = bf16_round(g)
        return rg @ rw, rg.t() @ rx, rg.sum(0)


def bf16_trajectory(name, o, s, seed, x, y, mode):
    """Losses of BF16_STEPS updates in torch: mode "fp32", "autocast" or
    "definition" (Bf16Linear in place of every nn.Linear)."""
    layers, in_shape, loss = MODELS[name]
    model, _ = init_model(layers, in_shape, seed)
    init = state_arrays(model)
    if mode == "definition":
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.forward = (lambda mod: lambda t: Bf16Linear.apply(t, mod.weight, mod.bias))(m)
    opt = torch_optimizer(model.parameters(), OPTIMIZERS[o])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: lr_factor(SCHEDULES[s], t, BF16_STEPS))
    model.train()
    losses = []
    for t in range(BF16_STEPS):
        opt.zero_grad()
        xt, yt = torch.from_numpy(x[t]), torch.from_numpy(y[t])
        if mode == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                L = loss_fn(loss, model(xt), yt)
        else:
            L = loss_fn(loss, model(xt), yt)
        L.backward()
        opt.step()
        sched.step()
        losses.append(L.item())
    return init, losses


def mean_gap(a, b, steps=None):
    """Mean over the first steps (all by default) of |a - b| / |b|; inf when a
    has a non-finite value or another length."""
    if len(a) != len(b) or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in a):
        return float("inf")
    a, b = a[:steps or len(b)], b[:steps or len(b)]
    return sum(abs(p - q) / max(abs(q), 1e-6) for p, q in zip(a, b)) / len(b)


def check_bf16(args, rep, tmp, seed):
    name, o, s = "mlp", "adam", "cosine_w5"
    layers, in_shape, loss = MODELS[name]
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((int(np.prod(in_shape)), CLASSES)).astype(np.float32)
    x, y = make_inputs(rng, in_shape, [BF16_STEPS, N], teacher)
    batches = os.path.join(tmp, "bf16.batches.safetensors")
    st_write(batches, {"x": x, "y": y})
    init, want32 = bf16_trajectory(name, o, s, seed, x, y, "fp32")
    _, auto = bf16_trajectory(name, o, s, seed, x, y, "autocast")
    _, defn = bf16_trajectory(name, o, s, seed, x, y, "definition")
    cmd = ["traj"]
    for k, mseed in enumerate((seed, seed + 1)):
        base = os.path.join(tmp, f"bf16_{k}")
        spec = make_spec(f"bf16-{k}", layers, in_shape, loss, OPTIMIZERS[o], SCHEDULES[s], mseed)
        spec["steps"] = BF16_STEPS
        spec["precision"] = "bf16"
        with open(base + ".json", "w") as f:
            json.dump(spec, f)
        st_write(base + ".init.safetensors",
                 init if k == 0 else state_arrays(init_model(layers, in_shape, mseed)[0]))
        cmd += [base + ".json", base + ".init.safetensors"]
    out = os.path.join(tmp, "bf16.losses.json")
    if not run_driver(args, cmd + [batches, out], rep, "bf16", "mlp bf16"):
        return
    got = read_losses(rep, "mlp bf16", out)
    if not isinstance(got, list) or len(got) != 2 or not isinstance(got[0], list):
        rep.fail("bf16", "mlp bf16", "expected 2 loss lists")
        return
    fb = [float("nan") if v is None else v for v in got[0]]
    g_def, g_auto = mean_gap(fb, defn, BF16_DEF_STEPS), mean_gap(fb, auto)
    g_fb32, g_auto32 = mean_gap(fb, want32), mean_gap(auto, want32)
    note = (f"{BF16_STEPS} steps, loss {want32[0]:.4f} -> fp32 {want32[-1]:.4f}, "
            f"bf16 {fb[-1]:.4f}, autocast {auto[-1]:.4f}")
    rep.add("bf16", f"mlp fusebox vs definition, {BF16_DEF_STEPS} steps", g_def, BF16_DEF_TOL,
            note)
    rep.add("bf16", "mlp fusebox vs autocast", g_auto, BF16_TOL)
    rep.add_min("bf16", "mlp fusebox vs fp32", g_fb32, BF16_FLOOR)
    rep.add_min("bf16", "mlp autocast vs fp32", g_auto32, BF16_FLOOR)
    ratio = max(g_fb32, g_auto32) / max(min(g_fb32, g_auto32), 1e-12)
    rep.add("bf16", "mlp fp32 gaps, larger / smaller", ratio, BF16_RATIO)


def check_traj(args, rep, tmp, name, seed):
    layers, in_shape, loss = MODELS[name]
    rng = np.random.default_rng(seed + 1000)
    teacher = rng.standard_normal((int(np.prod(in_shape)), CLASSES)).astype(np.float32)
    # a pool of POOL batches visited in turn, so that even the small CNNs fit
    # it within STEPS updates and the losses travel far from where they start
    x, y = make_inputs(rng, in_shape, [POOL, N], teacher)
    x, y = x[np.arange(STEPS) % POOL], y[np.arange(STEPS) % POOL]
    batches = os.path.join(tmp, f"traj_{name}.batches.safetensors")
    st_write(batches, {"x": x, "y": y})

    members = []  # (label, spec path, init path, torch losses, optimizer type)
    for i, (o, s) in enumerate(TRAJECTORIES[name]):
        mseed = seed + 17 * (i + 1)
        init, losses = torch_trajectory(name, o, s, mseed, x, y)
        base = os.path.join(tmp, f"traj_{name}_{o}_{s}")
        with open(base + ".json", "w") as f:
            json.dump(make_spec(f"{name}-{o}-{s}", layers, in_shape, loss, OPTIMIZERS[o],
                                SCHEDULES[s], mseed), f)
        st_write(base + ".init.safetensors", init)
        members.append((f"{name} {o} {s}", base + ".json", base + ".init.safetensors", losses,
                        OPTIMIZERS[o]["type"]))

    # each member alone
    for label, spec, init, want, _ in members:
        out = spec[:-5] + ".losses.json"
        if run_driver(args, ["traj", spec, init, batches, out], rep, "traj", label):
            got = read_losses(rep, label, out)
            if got is not None:
                compare_traj(rep, label, got, want, 1)

    # members sharing an optimizer type, fused into one array
    for kind in ("sgd", "adam", "adamw"):
        group = [m for m in members if m[4] == kind]
        if len(group) < 2:
            continue
        out = os.path.join(tmp, f"traj_{name}_{kind}_fused.losses.json")
        cmd = ["traj"] + [p for m in group for p in (m[1], m[2])] + [batches, out]
        what = f"{name} {kind} fused"
        if run_driver(args, cmd, rep, "traj", what):
            got = read_losses(rep, what, out)
            if got is None:
                continue
            if not isinstance(got, list) or len(got) != len(group):
                rep.fail("traj", what, f"expected {len(group)} loss lists")
                continue
            for (label, _, _, want, _), g in zip(group, got):
                compare_traj(rep, label + " (fused)", g, want, len(group))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--driver", required=True, help="path of the torch_driver executable")
    ap.add_argument("--backend", default=os.environ.get("FUSEBOX_TEST_BACKEND") or "cpu",
                    choices=["cpu", "cpu-ref", "cuda"],
                    help="default: $FUSEBOX_TEST_BACKEND, else cpu")
    ap.add_argument("--keep", help="write the files into this directory and keep them")
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--no-traj", action="store_true", help="skip the trajectories")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 comparison")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if not os.access(args.driver, os.X_OK):
        print(f"FAIL: driver {args.driver} is not executable")
        return 1

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    only = set(args.only.split(",")) if args.only else None
    rep = Report()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="fb-torch-") as tmpd:
        tmp = args.keep or tmpd
        os.makedirs(tmp, exist_ok=True)
        for i, name in enumerate(MODELS):
            if only and name not in only:
                continue
            check_grad(args, rep, tmp, name, 100 + 10 * i)
        if not args.no_traj:
            for i, name in enumerate(TRAJECTORIES):
                if only and name not in only:
                    continue
                check_traj(args, rep, tmp, name, 500 + 10 * i)
        if not args.no_bf16 and (not only or "mlp" in only):
            check_bf16(args, rep, tmp, 900)

    print(f"fusebox vs PyTorch {torch.__version__}, backend {args.backend}, "
          f"N={N}, {STEPS} steps, tolerances grad {GRAD_TOL:g} traj {TRAJ_TOL:g} (at every step)")
    w = max(len(r[1]) for r in rep.rows) if rep.rows else 10
    print(f"{'check':5s}  {'what':{w}s}  {'rel err':>9s}  {'tol':>7s}  status  note")
    for kind, what, err, tol, status, note in rep.rows:
        print(f"{kind:5s}  {what:{w}s}  {err:9.2e}  {tol:7.0e}  {status:6s}  {note}")
    print(f"{len(rep.rows) - rep.failed}/{len(rep.rows)} checks passed in {time.time() - t0:.1f} s")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
