"""fusebox model specs and PyTorch modules, both ways, and fusebox's files.

A fusebox model spec ({"input": [...], "layers": [...]}, docs/jobspec.md)
describes an nn.Sequential whose state_dict names are the tensor names of
fusebox's weights files: top-level layer i is module i; a residual block is
a Residual module with body and shortcut sub-sequences (i.body.j,
i.shortcut.k); layers without parameters keep their index.  A token model
({"input": {"tokens": T, "vocab": V}, ...}) starts with an nn.Embedding that
takes ids as integers or exact floats [N, T]; a transformer_block i is a
module with ln1, attn (nn.MultiheadAttention), ln2 and mlp (i.attn.in_proj_weight,
i.mlp.0.weight, ...); a language model returns logits [N, T, V].

  to_torch(model_spec)          the nn.Sequential of a spec
  from_torch(module, input)     the spec of an nn.Sequential of supported layers
  load(path)                    (module, spec) of a model or checkpoint file

torch is imported when one of these is first called, so the client and the
command line work without it.
"""

import json
import math

from . import safetensors
from .errors import FileFormatError, SpecError, UnsupportedModule

MAX_WINDOW = 1024
MAX_DIM = 1 << 20
MAX_NESTING = 4

# type -> {field: (kind, default)}; "required" defaults must be given
_REQUIRED = object()
_LAYER_FIELDS = {
    "linear": {"out": ("size", _REQUIRED), "bias": ("bool", True)},
    "conv2d": {"out": ("size", _REQUIRED), "kernel": ("window", _REQUIRED),
               "stride": ("window", 1), "padding": ("padding", 0), "bias": ("bool", True)},
    "maxpool2d": {"kernel": ("window", _REQUIRED), "stride": ("window", None),
                  "padding": ("padding", 0)},
    "avgpool2d": {"kernel": ("window", _REQUIRED), "stride": ("window", None),
                  "padding": ("padding", 0)},
    "global_avgpool": {},
    "flatten": {},
    "relu": {}, "tanh": {}, "sigmoid": {},
    "gelu": {"approximate": ("approximate", "none")},
    "dropout": {"p": ("p", 0.5)},
    "batchnorm": {"eps": ("positive", 1e-5), "momentum": ("unit", 0.1), "affine": ("bool", True)},
    "layernorm": {"eps": ("positive", 1e-5), "affine": ("bool", True)},
    "residual": {"body": ("layers", _REQUIRED), "shortcut": ("layers", [])},
    # token models (docs/jobspec.md, "Token models")
    "embedding": {"dim": ("dim", _REQUIRED)},
    "positional": {"max_len": ("tokens", None)},
    "transformer_block": {"heads": ("heads", _REQUIRED), "mlp_ratio": ("ratio", 4),
                          "causal": ("bool", True), "dropout": ("p", 0.0)},
    "pool": {"mode": ("mode", "mean")},
}
MAX_TOKENS = 8192
MAX_VOCAB = 1 << 24
_MODEL_FIELDS = ("input", "layers")


def _torch():
    import torch
    import torch.nn as nn
    return torch, nn


_RESIDUAL = None
_GLOBAL_AVGPOOL = None


def _classes():
    """The two modules fusebox has that torch.nn lacks (made once, on first use)."""
    global _RESIDUAL, _GLOBAL_AVGPOOL
    if _RESIDUAL is None:
        _, nn = _torch()

        class Residual(nn.Module):
            """body(x) + shortcut(x); an empty shortcut is the identity."""

            def __init__(self, body, shortcut=None):
                super().__init__()
                self.body = body
                self.shortcut = shortcut if shortcut is not None else nn.Sequential()

            def forward(self, x):
                return self.body(x) + self.shortcut(x)

        class GlobalAvgPool(nn.Module):
            """The mean over H and W: (N, C, H, W) -> (N, C); no parameters."""

            def forward(self, x):
                return x.mean(dim=(2, 3))

        Residual.__module__ = GlobalAvgPool.__module__ = __name__
        _RESIDUAL, _GLOBAL_AVGPOOL = Residual, GlobalAvgPool
    return _RESIDUAL, _GLOBAL_AVGPOOL


_TOKEN_CLASSES = None


def _token_classes():
    """The modules of token models (made once, on first use): an nn.Embedding
    that takes ids as floats too (fusebox delivers them so), the learned
    positions, a pre-LayerNorm transformer block and the pool."""
    global _TOKEN_CLASSES
    if _TOKEN_CLASSES is None:
        torch, nn = _torch()

        class TokenEmbedding(nn.Embedding):
            """nn.Embedding over ids given as integers or exact floats, [N, T] -> [N, T, D]."""

            def forward(self, x):
                return super().forward(x.long())

        class Positional(nn.Module):
            """x + weight[:T]: a learned table of max_len positions, [N, T, D]."""

            def __init__(self, max_len, dim):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(max_len, dim) * 0.02)

            def forward(self, x):
                return x + self.weight[: x.shape[1]]

        class TransformerBlock(nn.Module):
            """x + drop(attn(ln1(x))), then x + drop(mlp(ln2(x))), exact GELU, [N, T, D]."""

            def __init__(self, dim, heads, mlp_ratio=4, causal=True, dropout=0.0):
                super().__init__()
                self.causal = causal
                self.ln1 = nn.LayerNorm(dim)
                self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
                self.drop1 = nn.Dropout(dropout)
                self.ln2 = nn.LayerNorm(dim)
                self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                         nn.Linear(mlp_ratio * dim, dim))
                self.drop2 = nn.Dropout(dropout)

            def forward(self, x):
                t = x.shape[1]
                mask = (torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
                        if self.causal else None)
                h = self.ln1(x)
                a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
                x = x + self.drop1(a)
                return x + self.drop2(self.mlp(self.ln2(x)))

        class SeqPool(nn.Module):
            """[N, T, D] -> [N, D]: the mean over positions, or position 0."""

            def __init__(self, mode="mean"):
                super().__init__()
                self.mode = mode

            def forward(self, x):
                return x.mean(dim=1) if self.mode == "mean" else x[:, 0]

        for c in (TokenEmbedding, Positional, TransformerBlock, SeqPool):
            c.__module__ = __name__
        _TOKEN_CLASSES = (TokenEmbedding, Positional, TransformerBlock, SeqPool)
    return _TOKEN_CLASSES


def Residual(body, shortcut=None):
    """A fusebox residual block: body(x) + shortcut(x), both nn.Sequential
    (shortcut None or empty: the identity)."""
    return _classes()[0](body, shortcut)


def GlobalAvgPool():
    """fusebox's global_avgpool: the mean over H and W, (N, C, H, W) -> (N, C)."""
    return _classes()[1]()


# ------------------------------------------------------------- spec -> torch

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _pair(v):
    return (v, v) if _is_int(v) else tuple(v)


def _shape_text(shape):
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _field(path, kind, v):
    """Checks one layer field's value; returns it normalised."""
    if kind == "size":
        if not _is_int(v):
            raise SpecError(path, f"expected an integer, got {json.dumps(v)}")
        if not 1 <= v <= MAX_DIM:
            raise SpecError(path, f"{v} is out of range (1..{MAX_DIM})")
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            raise SpecError(path, f"expected true or false, got {json.dumps(v)}")
        return v
    if kind in ("window", "padding"):
        lo = 1 if kind == "window" else 0
        if _is_int(v):
            v = [v, v]
        if not (isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v)):
            raise SpecError(path, f"expected an integer or an [h, w] pair, got {json.dumps(v)}")
        if not all(lo <= x <= MAX_WINDOW for x in v):
            raise SpecError(path, f"{v} is out of range ({lo}..{MAX_WINDOW})")
        return v
    if kind == "approximate":
        if v not in ("none", "tanh"):
            raise SpecError(path, f"expected \"none\" or \"tanh\", got {json.dumps(v)}")
        return v
    if kind in ("p", "unit", "positive"):
        if not _is_num(v):
            raise SpecError(path, f"expected a number, got {json.dumps(v)}")
        lo, hi = {"p": (0, 0.99), "unit": (0, 1), "positive": (0, 1)}[kind]
        if not (lo <= v <= hi) or (kind == "positive" and v == 0):
            raise SpecError(path, f"{v} is out of range ({lo}..{hi})")
        return float(v)
    if kind in ("dim", "heads", "ratio", "tokens"):
        hi = {"dim": 65536, "heads": 1024, "ratio": 16, "tokens": MAX_TOKENS}[kind]
        if not _is_int(v):
            raise SpecError(path, f"expected an integer, got {json.dumps(v)}")
        if not 1 <= v <= hi:
            raise SpecError(path, f"{v} is out of range (1..{hi})")
        return v
    if kind == "mode":
        if v not in ("mean", "first"):
            raise SpecError(path, f"expected \"mean\" or \"first\", got {json.dumps(v)}")
        return v
    if kind == "layers":
        if not isinstance(v, list):
            raise SpecError(path, f"expected an array of layers, got {json.dumps(v)}")
        return v
    raise AssertionError(kind)


def _layer_fields(L, path):
    """The fields of layer L with its defaults filled in; refuses unknown and missing ones."""
    if not isinstance(L, dict):
        raise SpecError(path, f"expected a layer object, got {json.dumps(L)}")
    if "type" not in L:
        raise SpecError(f"{path}.type", "missing field")
    t = L["type"]
    if t not in _LAYER_FIELDS:
        raise SpecError(f"{path}.type", f"unknown layer type {json.dumps(t)} (one of "
                                        f"{', '.join(sorted(_LAYER_FIELDS))})")
    spec = _LAYER_FIELDS[t]
    for k in L:
        if k != "type" and k not in spec:
            raise SpecError(f"{path}.{k}", f"unknown field of a {t} layer"
                                           f"{' (it has ' + ', '.join(spec) + ')' if spec else ''}")
    out = {"type": t}
    for k, (kind, default) in spec.items():
        if k in L:
            out[k] = _field(f"{path}.{k}", kind, L[k])
        elif default is _REQUIRED:
            raise SpecError(f"{path}.{k}", f"missing field (a {t} layer needs it)")
        else:
            out[k] = default
    if t in ("maxpool2d", "avgpool2d"):
        k = _pair(out["kernel"])
        if out["stride"] is None:
            out["stride"] = list(k)
        if any(p > kk // 2 for p, kk in zip(_pair(out["padding"]), k)):
            raise SpecError(f"{path}.padding", f"{out['padding']} is more than half the kernel "
                                               f"{list(k)}")
    return out


def _window_out(shape, k, s, p):
    """(H', W') of a window over shape, or a str saying why the window does not fit."""
    hw = []
    for i in range(2):
        size = shape[1 + i] + 2 * p[i]
        if k[i] > size:
            return f"kernel {list(k)} is larger than its padded input {_shape_text(shape)}"
        hw.append((size - k[i]) // s[i] + 1)
    return hw


def _token_layer(L, lp, shape, vocab, first):
    """(module, output shape) of a token-model layer; a sequence is [T, D]."""
    Emb, Pos, Block, Pool = _token_classes()
    t = L["type"]
    if t == "embedding":
        if not vocab or not first:
            raise SpecError(lp, "embedding: must be the first layer, over a token input "
                                "(model.input {\"tokens\": T, \"vocab\": V})")
        return Emb(vocab, L["dim"]), [shape[0], L["dim"]]
    if len(shape) != 2:
        raise SpecError(lp, f"{t}: needs a sequence input (T, D) from an embedding, got "
                            f"{_shape_text(shape)}")
    T, D = shape
    if t == "positional":
        n = L["max_len"] or T
        if n < T:
            raise SpecError(f"{lp}.max_len", f"{n} is below the sequence length {T}")
        return Pos(n, D), shape
    if t == "transformer_block":
        if D % L["heads"]:
            raise SpecError(f"{lp}.heads", f"{L['heads']} does not divide the model dimension {D}")
        return Block(D, L["heads"], L["mlp_ratio"], L["causal"], L["dropout"]), shape
    return Pool(L["mode"]), [D]


def _build(layers, shape, path, depth=0, vocab=0):
    """(nn.Sequential, output shape) of a layer list on samples of shape
    (a token model's: [T] with its vocab)."""
    torch, nn = _torch()
    Res, GAP = _classes()
    if depth > MAX_NESTING:
        raise SpecError(path, f"residual blocks nest more than {MAX_NESTING} deep")
    mods = []
    for i, raw in enumerate(layers):
        lp = f"{path}[{i}]"
        L = _layer_fields(raw, lp)
        t = L["type"]
        first = vocab and depth == 0 and i == 0
        if first and t != "embedding":
            raise SpecError(lp, f"{t}: a token input (model.input.tokens) needs an embedding first")
        if t in ("embedding", "positional", "transformer_block", "pool"):
            m, shape = _token_layer(L, lp, shape, vocab, first)
        elif t == "linear":
            if len(shape) == 3:
                raise SpecError(lp, f"{t}: needs a feature input (F), got {_shape_text(shape)}; "
                                    "add a flatten layer before it")
            # on a sequence (T, D): the same map at every position, as nn.Linear does
            m = nn.Linear(shape[-1], L["out"], bias=L["bias"])
            shape = list(shape[:-1]) + [L["out"]]
        elif t in ("conv2d", "maxpool2d", "avgpool2d", "global_avgpool"):
            if len(shape) != 3:
                raise SpecError(lp, f"{t}: needs an image input (C, H, W), got "
                                    f"{_shape_text(shape)}")
            if t == "global_avgpool":
                m = GAP()
                shape = [shape[0]]
            else:
                k, s, p = _pair(L["kernel"]), _pair(L["stride"]), _pair(L["padding"])
                hw = _window_out(shape, k, s, p)
                if isinstance(hw, str):
                    raise SpecError(lp, f"{t}: {hw}")
                if t == "conv2d":
                    m = nn.Conv2d(shape[0], L["out"], k, s, p, bias=L["bias"])
                    shape = [L["out"]] + hw
                else:
                    m = (nn.MaxPool2d(k, s, p) if t == "maxpool2d"
                         else nn.AvgPool2d(k, s, p, count_include_pad=True))
                    shape = [shape[0]] + hw
        elif t in ("flatten", "batchnorm") and len(shape) == 2:
            raise SpecError(lp, f"{t}: not over a sequence (T, D); use "
                                f"{'pool' if t == 'flatten' else 'layernorm'}")
        elif t == "flatten":
            m = nn.Flatten()
            shape = [math.prod(shape)]
        elif t == "relu":
            m = nn.ReLU()
        elif t == "tanh":
            m = nn.Tanh()
        elif t == "sigmoid":
            m = nn.Sigmoid()
        elif t == "gelu":
            m = nn.GELU(approximate=L["approximate"])
        elif t == "dropout":
            m = nn.Dropout(L["p"])
        elif t == "batchnorm":
            if len(shape) not in (1, 3):
                raise SpecError(lp, f"{t}: needs (F) or (C, H, W), got {_shape_text(shape)}")
            cls = nn.BatchNorm1d if len(shape) == 1 else nn.BatchNorm2d
            m = cls(shape[0], eps=L["eps"], momentum=L["momentum"], affine=L["affine"])
        elif t == "layernorm":
            # a sequence normalises each position over its D features
            m = nn.LayerNorm(list(shape[-1:] if len(shape) == 2 else shape), eps=L["eps"],
                             elementwise_affine=L["affine"])
        elif t == "residual":
            body, out = _build(L["body"], shape, f"{lp}.body", depth + 1)
            sc, sc_out = _build(L["shortcut"], shape, f"{lp}.shortcut", depth + 1)
            if list(out) != list(sc_out):
                raise SpecError(lp, f"residual: the body's output {_shape_text(out)} differs from "
                                    f"the shortcut's {_shape_text(sc_out)}")
            m = Res(body, sc)
            shape = out
        mods.append(m)
    return nn.Sequential(*mods), list(shape)


def _model_of(spec):
    """(model dict, its JSON path) of a model spec or of a job spec holding one."""
    if not isinstance(spec, dict):
        raise SpecError("model", f"expected a model spec object, got {type(spec).__name__}")
    if "layers" not in spec and "model" in spec:
        model = spec["model"]
        if not isinstance(model, dict):
            raise SpecError("model", f"expected an object, got {json.dumps(model)}")
        return model, "model"
    return spec, "model"


def output_shape(model_spec):
    """The shape of one sample's output of a model spec (a list)."""
    return _to_torch(model_spec)[1]


def _to_torch(model_spec):
    model, path = _model_of(model_spec)
    for k in model:
        if k not in _MODEL_FIELDS:
            raise SpecError(f"{path}.{k}", "unknown field of a model (it has input, layers)")
    for k in _MODEL_FIELDS:
        if k not in model:
            raise SpecError(f"{path}.{k}", "missing field")
    shape, vocab = model["input"], 0
    if isinstance(shape, dict):
        for k in shape:
            if k not in ("tokens", "vocab"):
                raise SpecError(f"{path}.input.{k}", "unknown field (it has tokens, vocab)")
        T, vocab = shape.get("tokens"), shape.get("vocab")
        if not (_is_int(T) and 1 <= T <= MAX_TOKENS):
            raise SpecError(f"{path}.input.tokens", f"expected an integer 1..{MAX_TOKENS}, got "
                                                    f"{json.dumps(T)}")
        if not (_is_int(vocab) and 2 <= vocab <= MAX_VOCAB):
            raise SpecError(f"{path}.input.vocab", f"expected an integer 2..{MAX_VOCAB}, got "
                                                   f"{json.dumps(vocab)}")
        shape = [T]
    elif (not isinstance(shape, list) or len(shape) not in (1, 3) or
            not all(_is_int(d) and 1 <= d <= MAX_DIM for d in shape)):
        raise SpecError(f"{path}.input", f"expected [F] or [C, H, W] of sizes 1..{MAX_DIM}, or "
                                         f"{{\"tokens\": T, \"vocab\": V}}, got {json.dumps(shape)}")
    layers = model["layers"]
    if not isinstance(layers, list) or not layers:
        raise SpecError(f"{path}.layers", "expected a non-empty array of layers")
    return _build(layers, list(shape), f"{path}.layers", vocab=vocab)


def to_torch(model_spec):
    """The torch.nn.Sequential a fusebox model spec describes.

    model_spec is {"input": [...], "layers": [...]} (or a whole job spec, whose
    "model" is used).  The module's state_dict names and shapes are those of
    fusebox's weights files, so module.load_state_dict(tensors) takes a
    fusebox model; its initial weights are torch's defaults, not fusebox's.
    Raises SpecError naming the field (model.layers[2].out) for a spec
    fusebox would refuse: unknown or missing fields, wrong types or ranges,
    shapes that do not fit.
    """
    return _to_torch(model_spec)[0]


# ------------------------------------------------------------- torch -> spec

def _from_module(m, shape, path, depth):
    """(layer dict, output shape) of module m on samples of shape."""
    torch, nn = _torch()
    Res, GAP = _classes()
    t = type(m)

    def bad(reason):
        return UnsupportedModule(path, m, reason)

    def need(n, what):
        if len(shape) != n:
            raise bad(f"needs {what} input, the input there is {_shape_text(shape)}")

    def window(v):
        return list(_pair(v))

    if t is nn.Linear:
        need(1, "a feature (F)")
        if m.in_features != shape[0]:
            raise bad(f"in_features is {m.in_features}, the input there has {shape[0]} features")
        return {"type": "linear", "out": m.out_features, "bias": m.bias is not None}, \
            [m.out_features]
    if t is nn.Conv2d:
        need(3, "an image (C, H, W)")
        if m.in_channels != shape[0]:
            raise bad(f"in_channels is {m.in_channels}, the input there has {shape[0]} channels")
        if isinstance(m.padding, str):
            raise bad(f"padding={m.padding!r} is not supported; give the padding as numbers")
        for attr, ok, want in (("groups", m.groups == 1, "1"),
                               ("dilation", tuple(m.dilation) == (1, 1), "1"),
                               ("padding_mode", m.padding_mode == "zeros", "'zeros'")):
            if not ok:
                raise bad(f"{attr}={getattr(m, attr)!r} is not supported (only {want})")
        L = {"type": "conv2d", "out": m.out_channels, "kernel": window(m.kernel_size),
             "stride": window(m.stride), "padding": window(m.padding), "bias": m.bias is not None}
        hw = _window_out(shape, L["kernel"], L["stride"], L["padding"])
        if isinstance(hw, str):
            raise bad(hw)
        return L, [m.out_channels] + hw
    if t in (nn.MaxPool2d, nn.AvgPool2d):
        need(3, "an image (C, H, W)")
        if m.ceil_mode:
            raise bad("ceil_mode=True is not supported")
        if t is nn.MaxPool2d and (tuple(window(m.dilation)) != (1, 1) or m.return_indices):
            raise bad("dilation and return_indices are not supported")
        if t is nn.AvgPool2d and (not m.count_include_pad or m.divisor_override is not None):
            raise bad("only count_include_pad=True without divisor_override is supported")
        k, s, p = window(m.kernel_size), window(m.stride if m.stride is not None else
                                                m.kernel_size), window(m.padding)
        if any(pp > kk // 2 for pp, kk in zip(p, k)):
            raise bad(f"padding {p} is more than half the kernel {k}")
        L = {"type": "maxpool2d" if t is nn.MaxPool2d else "avgpool2d", "kernel": k,
             "stride": s, "padding": p}
        hw = _window_out(shape, k, s, p)
        if isinstance(hw, str):
            raise bad(hw)
        return L, [shape[0]] + hw
    if t is GAP:
        need(3, "an image (C, H, W)")
        return {"type": "global_avgpool"}, [shape[0]]
    if t is nn.Flatten:
        if m.start_dim != 1 or m.end_dim != -1:
            raise bad(f"start_dim={m.start_dim}, end_dim={m.end_dim}: only the whole sample "
                      "flattens (start_dim=1, end_dim=-1)")
        return {"type": "flatten"}, [math.prod(shape)]
    simple = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid"}
    if t in simple:
        return {"type": simple[t]}, shape
    if t is nn.GELU:
        return {"type": "gelu", "approximate": getattr(m, "approximate", "none")}, shape
    if t is nn.Dropout:
        if not 0 <= m.p <= 0.99:
            raise bad(f"p={m.p} is out of range (0..0.99)")
        return {"type": "dropout", "p": float(m.p)}, shape
    if t in (nn.BatchNorm1d, nn.BatchNorm2d):
        need(1 if t is nn.BatchNorm1d else 3,
             "a feature (F)" if t is nn.BatchNorm1d else "an image (C, H, W)")
        if m.num_features != shape[0]:
            raise bad(f"num_features is {m.num_features}, the input there has {shape[0]}")
        if not m.track_running_stats or m.momentum is None:
            raise bad("only track_running_stats=True with a momentum is supported")
        return {"type": "batchnorm", "eps": float(m.eps), "momentum": float(m.momentum),
                "affine": bool(m.affine)}, shape
    if t is nn.LayerNorm:
        if list(m.normalized_shape) != list(shape):
            raise bad(f"normalized_shape is {list(m.normalized_shape)}; fusebox normalises the "
                      f"whole sample, {list(shape)}")
        return {"type": "layernorm", "eps": float(m.eps),
                "affine": bool(m.elementwise_affine)}, shape
    if t is Res:
        if depth >= MAX_NESTING:
            raise bad(f"residual blocks nest more than {MAX_NESTING} deep")
        body, out = _from_sequential(m.body, shape, f"{path}.body", depth + 1)
        sc, sc_out = _from_sequential(m.shortcut, shape, f"{path}.shortcut", depth + 1)
        if out != sc_out:
            raise bad(f"the body's output {_shape_text(out)} differs from the shortcut's "
                      f"{_shape_text(sc_out)}")
        return {"type": "residual", "body": body, "shortcut": sc}, out
    if isinstance(m, nn.Sequential):
        raise bad("a nested nn.Sequential has no fusebox layer (the weights' names number "
                  "the top level); flatten it, or use fusebox.Residual for a block")
    raise bad("not a layer fusebox supports (Linear, Conv2d, MaxPool2d, AvgPool2d, "
              "fusebox.GlobalAvgPool, Flatten, ReLU, GELU, Tanh, Sigmoid, Dropout, "
              "BatchNorm1d, BatchNorm2d, LayerNorm, fusebox.Residual)")


def _from_sequential(seq, shape, path, depth):
    _, nn = _torch()
    if type(seq) is not nn.Sequential:
        raise UnsupportedModule(path, seq, "expected an nn.Sequential: fusebox models are "
                                           "sequences of layers")
    layers = []
    for i, m in enumerate(seq):
        L, shape = _from_module(m, shape, f"{path}[{i}]", depth)
        layers.append(L)
    return layers, shape


def from_torch(module, input):
    """The fusebox model spec ({"input", "layers"}) of an nn.Sequential.

    input is the shape of one sample ([F] or [C, H, W]).  Every module must be
    one fusebox has (Linear, Conv2d, MaxPool2d, AvgPool2d, GlobalAvgPool,
    Flatten, ReLU, GELU, Tanh, Sigmoid, Dropout, BatchNorm1d/2d, LayerNorm
    over the whole sample, Residual) and fit the shape it receives; otherwise
    UnsupportedModule names the first one that does not (module[3], or
    module[2].body[0] inside a block) and why.  to_torch of the result has
    the module's state_dict names and shapes, so the module's weights fit
    the job's files.
    """
    if not (isinstance(input, (list, tuple)) and len(input) in (1, 3) and
            all(_is_int(d) and 1 <= d <= MAX_DIM for d in input)):
        raise SpecError("model.input", f"expected [F] or [C, H, W] of sizes 1..{MAX_DIM}, got "
                                       f"{input!r}")
    layers, _ = _from_sequential(module, list(input), "module", 0)
    if not layers:
        raise UnsupportedModule("module", module, "an empty nn.Sequential has no layers")
    return {"input": list(input), "layers": layers}


# --------------------------------------------------------------------- files

class Preprocess:
    """The input preprocessing a fusebox file records: call it on a batch of
    raw samples [N, ...] (uint8 or float32, any layout of the model's input
    size) to get the float32 [N, *input] the model was trained on.

    uint8 samples are divided by 1 / uint8_scale (255: exactly fusebox's
    (float)v / 255.0f); float32 samples are used as stored.
    """

    def __init__(self, info, input_shape):
        self.uint8_scale = info["uint8_scale"]
        self.input = list(input_shape)
        d = 1.0 / self.uint8_scale
        self._divisor = float(round(d)) if abs(d - round(d)) < 1e-9 * d else None

    def __call__(self, x):
        import torch

        x = torch.as_tensor(x)
        if x.dtype == torch.uint8:
            x = x.to(torch.float32)
            x = x / self._divisor if self._divisor else x * self.uint8_scale
        elif x.dtype != torch.float32:
            raise TypeError(f"samples of dtype {x.dtype}: fusebox datasets hold uint8 or float32")
        numel = math.prod(self.input)
        if x.dim() < 1 or x[0].numel() != numel:
            raise ValueError(f"samples of shape {list(x.shape[1:])} do not hold the model's input "
                             f"{self.input} ({numel} values)")
        return x.reshape([x.shape[0]] + self.input)

    def __repr__(self):
        return f"Preprocess(uint8_scale={self.uint8_scale!r}, input={self.input})"


class FileSpec(dict):
    """The job spec of a fusebox file (a dict, as the file holds it), with what
    else the file says: preprocess (a Preprocess), metrics (a dict named as in
    fusebox.metrics), step, fusebox_version, checkpoint (whether the file is a
    full-state checkpoint) and path."""

    preprocess = None
    metrics = None
    step = None
    fusebox_version = None
    checkpoint = False
    path = None


def _meta_json(meta, key, path, kind):
    if key not in meta:
        raise FileFormatError(path, f"metadata {key} is missing")
    try:
        v = json.loads(meta[key])
    except ValueError as e:
        raise FileFormatError(path, f"metadata {key} is not JSON ({e})") from None
    if not isinstance(v, kind):
        raise FileFormatError(path, f"metadata {key} is not a JSON {kind.__name__}")
    return v


def read_spec(source):
    """The FileSpec of a fusebox model or checkpoint file (a path or bytes),
    from its metadata alone (no torch needed).  FileFormatError naming the file
    for a file that is not safetensors or has no fusebox metadata."""
    path = "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else str(source)
    meta = safetensors.read_metadata(source)
    return _file_spec(meta, path)


def _file_spec(meta, path):
    if "spec" not in meta:
        raise FileFormatError(path, "no fusebox metadata (no \"spec\" entry): not a file fusebox "
                                    "wrote, or one written before its files described themselves")
    spec = FileSpec(_meta_json(meta, "spec", path, dict))
    info = _meta_json(meta, "preprocess", path, dict)
    scale = info.get("uint8_scale")
    if not (_is_num(scale) and scale > 0):
        raise FileFormatError(path, f"metadata preprocess.uint8_scale is {scale!r}, expected a "
                                    "positive number")
    model = spec.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("input"), (list, dict)):
        raise FileFormatError(path, "metadata spec has no model.input")
    inp = model["input"]
    # a token model reads T ids (as floats, as the loaders deliver them)
    spec.preprocess = Preprocess(info, [inp.get("tokens")] if isinstance(inp, dict) else inp)
    spec.metrics = _meta_json(meta, "metrics", path, dict) if "metrics" in meta else {}
    # a model or checkpoint has its step; a bare weights file (fb_array_save) may not
    if "step" in meta:
        if not meta["step"].isdigit():
            raise FileFormatError(path, f"metadata step is {meta['step']!r}, expected a count")
        spec.step = int(meta["step"])
    spec.fusebox_version = meta.get("fusebox_version")
    spec.checkpoint = meta.get("format", "").startswith("fusebox-checkpoint")
    spec.path = path
    return spec


def load(path):
    """(module, spec) of a fusebox model or checkpoint file.

    module is to_torch of the file's spec with the file's weights loaded
    (strictly: every tensor of the module, no other; a checkpoint's
    optimizer state "optim.*" is left out), in eval mode.  spec is a
    FileSpec: the job spec as a dict, plus spec.preprocess (the callable
    that turns raw uint8 or float32 samples into the model's input),
    spec.metrics, spec.step and spec.fusebox_version.  Raises
    FileFormatError naming the file (not safetensors, truncated, no fusebox
    metadata, tensors that do not fit the spec) or SpecError naming the
    field of a spec this package does not know.
    """
    tensors, meta = safetensors.read(path)
    spec = _file_spec(meta, str(path))
    module = to_torch(spec["model"])
    state = {k: v for k, v in tensors.items() if not (spec.checkpoint and k.startswith("optim."))}
    want = module.state_dict()
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in want]
    if missing or extra:
        raise FileFormatError(path, "tensors do not fit the spec's model: " +
                              "; ".join(filter(None, [
                                  f"missing {', '.join(missing[:5])}" if missing else "",
                                  f"unknown {', '.join(extra[:5])}" if extra else ""])))
    for k, v in want.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise FileFormatError(path, f"tensor {k} has shape {list(state[k].shape)}, the "
                                        f"spec's model has {list(v.shape)}")
    module.load_state_dict(state, strict=True)
    module.eval()
    return module, spec
