"""fusebox.to_torch, from_torch, load and the safetensors reader, without a server.

- to_torch builds, for every layer type (residual blocks with and without a
  shortcut included), the module whose state_dict names and shapes are
  fusebox's (docs/jobspec.md, "Weights files"), with the spec's output shape;
- from_torch of that module gives the spec back with every default written
  out, and a module written in PyTorch round-trips through its spec with the
  same outputs;
- bad input, as tables: unsupported or misfitting torch modules and
  non-sequential modules name the module's place and class; specs with
  unknown, missing or wrong fields name the field's JSON path; damaged files,
  files without fusebox metadata and tensors that do not fit the spec name
  the file;
- load of a file laid out as fusebox writes it (tensors plus the metadata of
  docs/checkpoints.md) returns the module with its weights, the spec, the
  metrics and the preprocessing, which divides uint8 samples by 255 exactly
  as fusebox's loaders do.
"""

import json
import os
import struct
import tempfile
import unittest

import torch
import torch.nn as nn

import fusebox
from fusebox import metrics as M
from fusebox import safetensors

CNN = {"input": [1, 12, 12], "layers": [
    {"type": "conv2d", "out": 8, "kernel": 3, "padding": 1, "bias": False},
    {"type": "batchnorm"}, {"type": "relu"},
    {"type": "maxpool2d", "kernel": 3, "stride": 2, "padding": 1},
    {"type": "conv2d", "out": 6, "kernel": [3, 1], "stride": [1, 2], "padding": [1, 0]},
    {"type": "tanh"}, {"type": "avgpool2d", "kernel": 2},
    {"type": "layernorm", "eps": 1e-3}, {"type": "flatten"}, {"type": "dropout", "p": 0.2},
    {"type": "linear", "out": 16}, {"type": "gelu", "approximate": "tanh"},
    {"type": "batchnorm", "momentum": 0.2, "affine": False}, {"type": "sigmoid"},
    {"type": "linear", "out": 10, "bias": False}]}

RESNET = {"input": [3, 8, 8], "layers": [
    {"type": "conv2d", "out": 4, "kernel": 3, "padding": 1, "bias": False},
    {"type": "residual",
     "body": [{"type": "conv2d", "out": 4, "kernel": 3, "padding": 1, "bias": False},
              {"type": "batchnorm"}, {"type": "relu"},
              {"type": "residual", "body": [{"type": "gelu"}]}]},
    {"type": "residual",
     "body": [{"type": "conv2d", "out": 8, "kernel": 3, "stride": 2, "padding": 1}],
     "shortcut": [{"type": "conv2d", "out": 8, "kernel": 1, "stride": 2, "bias": False},
                  {"type": "batchnorm"}]},
    {"type": "global_avgpool"}, {"type": "linear", "out": 5}]}

MLP = {"input": [16], "layers": [{"type": "linear", "out": 32}, {"type": "relu"},
                                 {"type": "linear", "out": 4}]}

# (model, the state_dict names of its parameters and buffers, output shape)
MODELS = [
    (MLP, ["0.weight", "0.bias", "2.weight", "2.bias"], [4]),
    (CNN, ["0.weight", "1.weight", "1.bias", "1.running_mean", "1.running_var",
           "1.num_batches_tracked", "4.weight", "4.bias", "7.weight", "7.bias", "10.weight",
           "10.bias", "12.running_mean", "12.running_var", "12.num_batches_tracked",
           "14.weight"], [10]),
    (RESNET, ["0.weight", "1.body.0.weight", "1.body.1.weight", "1.body.1.bias",
              "1.body.1.running_mean", "1.body.1.running_var", "1.body.1.num_batches_tracked",
              "2.body.0.weight", "2.body.0.bias", "2.shortcut.0.weight", "2.shortcut.1.weight",
              "2.shortcut.1.bias", "2.shortcut.1.running_mean", "2.shortcut.1.running_var",
              "2.shortcut.1.num_batches_tracked", "4.weight", "4.bias"], [5]),
]


def fusebox_like_file(path, model, module, extra_meta=None, drop=None, optim=False):
    """A file laid out as fusebox writes one: the module's tensors and the
    metadata of docs/checkpoints.md."""
    tensors = dict(module.state_dict())
    if optim:
        for k, v in list(tensors.items()):
            if v.dtype == torch.float32 and "running" not in k:
                tensors["optim.exp_avg." + k] = torch.zeros_like(v)
    if drop:
        del tensors[drop]
    spec = {"name": "unit", "dataset": "synth", "model": model, "batch_size": 8, "steps": 3}
    meta = {"spec": json.dumps(spec, sort_keys=True), "step": "3",
            "preprocess": json.dumps({"uint8_scale": 1 / 255}),
            "fusebox_version": "0.1.0",
            "metrics": json.dumps({M.LOSS: 0.5, M.ACCURACY: 0.75, M.VAL_LOSS: 0.6,
                                   M.VAL_ACCURACY: 0.7, M.VAL_STEP: 3})}
    if optim:
        meta["format"] = "fusebox-checkpoint-1"
    meta.update(extra_meta or {})
    safetensors.write(path, tensors, {k: v for k, v in meta.items() if v is not None})


class ToTorch(unittest.TestCase):
    def test_names_shapes_and_back(self):
        for model, names, out in MODELS:
            with self.subTest(model=names[0]):
                torch.manual_seed(0)
                m = fusebox.to_torch(model)
                self.assertIsInstance(m, nn.Sequential)
                self.assertEqual(list(m.state_dict()), names)
                self.assertEqual(fusebox.output_shape(model), out)
                m.eval()
                y = m(torch.randn([2] + model["input"]))
                self.assertEqual(list(y.shape), [2] + out)
                # from_torch gives the spec back, defaults written out; it rebuilds the same
                spec = fusebox.from_torch(m, input=model["input"])
                m2 = fusebox.to_torch(spec)
                m2.load_state_dict(m.state_dict(), strict=True)
                m2.eval()
                self.assertTrue(torch.equal(m2(torch.ones([1] + model["input"])),
                                            m(torch.ones([1] + model["input"]))))
                self.assertEqual(fusebox.from_torch(m2, model["input"]), spec)

    def test_job_spec_and_defaults(self):
        # a whole job spec works too; defaults are fusebox's
        m = fusebox.to_torch({"name": "j", "model": {"input": [1, 6, 6], "layers": [
            {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "dropout"},
            {"type": "linear", "out": 3}]}})
        self.assertEqual(m[0].stride, (2, 2))
        self.assertEqual(m[2].p, 0.5)
        self.assertEqual(m[3].in_features, 9)

    def test_user_module_round_trip(self):
        torch.manual_seed(1)
        net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
            fusebox.Residual(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.GELU())),
            nn.MaxPool2d(2), fusebox.GlobalAvgPool(), nn.Linear(4, 3))
        spec = fusebox.from_torch(net, input=[1, 8, 8])
        self.assertEqual([L["type"] for L in spec["layers"]],
                         ["conv2d", "batchnorm", "relu", "residual", "maxpool2d",
                          "global_avgpool", "linear"])
        self.assertEqual(spec["layers"][3]["shortcut"], [])
        back = fusebox.to_torch(spec)
        back.load_state_dict(net.state_dict(), strict=True)
        net.eval()
        back.eval()
        x = torch.randn(3, 1, 8, 8)
        self.assertTrue(torch.allclose(back(x), net(x)))
        json.dumps(spec)  # a spec is plain JSON


class Lstm(nn.Module):
    def forward(self, x):
        return x


class MyLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def unsupported_cases():
    # (what, module, input, path named, words of the reason)
    R = fusebox.Residual
    return [
        ("an LSTM", nn.Sequential(nn.Flatten(), nn.LSTM(4, 4)), [4], "module[1] (LSTM)",
         "not a layer fusebox supports"),
        ("dilation", nn.Sequential(nn.Conv2d(1, 2, 3, dilation=2)), [1, 8, 8],
         "module[0] (Conv2d)", "dilation"),
        ("groups", nn.Sequential(nn.Conv2d(2, 2, 3, groups=2)), [2, 8, 8],
         "module[0] (Conv2d)", "groups=2"),
        ("padding same", nn.Sequential(nn.Conv2d(1, 2, 3, padding="same")), [1, 8, 8],
         "module[0] (Conv2d)", "padding='same'"),
        ("reflect padding", nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")),
         [1, 8, 8], "module[0] (Conv2d)", "padding_mode"),
        ("ceil mode", nn.Sequential(nn.MaxPool2d(2, ceil_mode=True)), [1, 8, 8],
         "module[0] (MaxPool2d)", "ceil_mode"),
        ("avgpool without pad", nn.Sequential(nn.AvgPool2d(3, 1, 1, count_include_pad=False)),
         [1, 8, 8], "module[0] (AvgPool2d)", "count_include_pad"),
        ("partial flatten", nn.Sequential(nn.Flatten(2)), [1, 8, 8], "module[0] (Flatten)",
         "start_dim=2"),
        ("partial layernorm", nn.Sequential(nn.LayerNorm(8)), [1, 8, 8],
         "module[0] (LayerNorm)", "whole sample"),
        ("identity", nn.Sequential(nn.Identity()), [4], "module[0] (Identity)", "not a layer"),
        ("nested sequential", nn.Sequential(nn.Sequential(nn.ReLU())), [4],
         "module[0] (Sequential)", "nested"),
        ("inside a block", nn.Sequential(nn.ReLU(), R(nn.Sequential(nn.Identity()))), [4],
         "module[1].body[0] (Identity)", "not a layer"),
        ("a block's shortcut", nn.Sequential(R(nn.Sequential(nn.ReLU()), nn.Sequential(
            nn.Linear(4, 4), nn.ELU()))), [4], "module[0].shortcut[1] (ELU)", "not a layer"),
        ("mismatched block", nn.Sequential(R(nn.Sequential(nn.Linear(4, 3)))), [4],
         "module[0] (Residual)", "differs from the shortcut"),
        ("wrong in_features", nn.Sequential(nn.Flatten(), nn.Linear(100, 2)), [1, 8, 8],
         "module[1] (Linear)", "in_features is 100, the input there has 64"),
        ("linear on an image", nn.Sequential(nn.Linear(8, 2)), [1, 8, 8], "module[0] (Linear)",
         "needs a feature (F) input"),
        ("batchnorm1d on an image", nn.Sequential(nn.BatchNorm1d(1)), [1, 8, 8],
         "module[0] (BatchNorm1d)", "needs a feature (F) input"),
        ("no running stats", nn.Sequential(nn.BatchNorm1d(4, track_running_stats=False)), [4],
         "module[0] (BatchNorm1d)", "track_running_stats"),
        ("dropout2d", nn.Sequential(nn.Dropout2d()), [1, 8, 8], "module[0] (Dropout2d)",
         "not a layer"),
        ("a subclass of Linear", nn.Sequential(MyLinear(4, 2)), [4], "module[0] (MyLinear)",
         "not a layer"),
        ("not sequential", Lstm(), [4], "module (Lstm)", "expected an nn.Sequential"),
        ("a bare layer", nn.Linear(4, 2), [4], "module (Linear)", "expected an nn.Sequential"),
        ("empty", nn.Sequential(), [4], "module (Sequential)", "no layers"),
        ("kernel too large", nn.Sequential(nn.Conv2d(1, 1, 9)), [1, 8, 8], "module[0]",
         "larger than its padded input"),
    ]


def spec_error_cases():
    lin = {"type": "linear", "out": 4}
    # (what, model, field named, words)
    return [
        ("unknown model field", {"input": [4], "layers": [lin], "extra": 1}, "model.extra",
         "unknown field"),
        ("unknown layer field", {"input": [4], "layers": [{"type": "linear", "outs": 4}]},
         "model.layers[0].outs", "unknown field of a linear layer"),
        ("unknown type", {"input": [4], "layers": [{"type": "conv3d"}]}, "model.layers[0].type",
         "unknown layer type \"conv3d\""),
        ("no type", {"input": [4], "layers": [{"out": 4}]}, "model.layers[0].type",
         "missing field"),
        ("missing out", {"input": [4], "layers": [{"type": "linear"}]}, "model.layers[0].out",
         "missing field"),
        ("out a string", {"input": [4], "layers": [{"type": "linear", "out": "8"}]},
         "model.layers[0].out", "expected an integer"),
        ("bias not a bool", {"input": [4], "layers": [{"type": "linear", "out": 2, "bias": 1}]},
         "model.layers[0].bias", "expected true or false"),
        ("p out of range", {"input": [4], "layers": [{"type": "dropout", "p": 1.0}]},
         "model.layers[0].p", "out of range"),
        ("gelu approximate", {"input": [4], "layers": [{"type": "gelu", "approximate": "erf"}]},
         "model.layers[0].approximate", "\"none\" or \"tanh\""),
        ("linear on an image", {"input": [1, 4, 4], "layers": [lin]}, "model.layers[0]",
         "add a flatten layer"),
        ("kernel too large", {"input": [1, 4, 4], "layers": [
            {"type": "conv2d", "out": 2, "kernel": 5}]}, "model.layers[0]",
         "conv2d: kernel [5, 5] is larger than its padded input"),
        ("pool padding", {"input": [1, 4, 4], "layers": [
            {"type": "maxpool2d", "kernel": 2, "padding": 2}]}, "model.layers[0].padding",
         "more than half the kernel"),
        ("residual shapes", {"input": [4], "layers": [
            {"type": "residual", "body": [{"type": "linear", "out": 3}]}]}, "model.layers[0]",
         "differs from the shortcut"),
        ("nested unknown field", {"input": [4], "layers": [
            {"type": "residual", "body": [{"type": "relu"}, {"type": "relu", "inplace": True}]}]},
         "model.layers[0].body[1].inplace", "unknown field of a relu layer"),
        ("bad input", {"input": [1, 2], "layers": [lin]}, "model.input", "[F] or [C, H, W]"),
        ("no layers", {"input": [4], "layers": []}, "model.layers", "non-empty"),
        ("missing input", {"layers": [lin]}, "model.input", "missing field"),
    ]


class BadInput(unittest.TestCase):
    def test_unsupported_modules(self):
        for what, module, shape, path, words in unsupported_cases():
            with self.subTest(what):
                with self.assertRaises(fusebox.UnsupportedModule) as cm:
                    fusebox.from_torch(module, input=shape)
                msg = str(cm.exception)
                self.assertTrue(msg.startswith(path), f"{msg!r} does not start with {path!r}")
                self.assertIn(words, msg)
                self.assertEqual(cm.exception.path, path.split(" ")[0])

    def test_bad_input_shape(self):
        with self.assertRaises(fusebox.SpecError) as cm:
            fusebox.from_torch(nn.Sequential(nn.ReLU()), input=[1, 2])
        self.assertEqual(cm.exception.field, "model.input")

    def test_spec_errors(self):
        for what, model, field, words in spec_error_cases():
            with self.subTest(what):
                with self.assertRaises(fusebox.SpecError) as cm:
                    fusebox.to_torch(model)
                self.assertEqual(cm.exception.field, field.split(" ")[0])
                self.assertTrue(str(cm.exception).startswith(field.split(" ")[0]))
                self.assertIn(words, str(cm.exception))


class Files(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="fb-py-")
        self.dir = self.tmp.name
        torch.manual_seed(2)
        self.module = fusebox.to_torch(CNN)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_load(self):
        for optim in (False, True):
            with self.subTest(checkpoint=optim):
                p = self.path(f"m{optim}.safetensors")
                fusebox_like_file(p, CNN, self.module, optim=optim)
                m, spec = fusebox.load(p)
                self.assertFalse(m.training)
                for k, v in self.module.state_dict().items():
                    self.assertTrue(torch.equal(m.state_dict()[k], v), k)
                self.assertEqual(spec["name"], "unit")
                self.assertEqual(spec["model"], CNN)
                self.assertEqual(spec.step, 3)
                self.assertEqual(spec.checkpoint, optim)
                self.assertEqual(spec.fusebox_version, "0.1.0")
                self.assertEqual(spec.metrics[M.VAL_ACCURACY], 0.7)
                self.assertEqual(spec.metrics[M.VAL_STEP], 3)
                self.assertEqual(fusebox.read_spec(p), spec)  # no torch needed for this
                self.assertEqual(fusebox.read_spec(p).metrics, spec.metrics)

    def test_preprocess(self):
        p = self.path("m.safetensors")
        fusebox_like_file(p, CNN, self.module)
        _, spec = fusebox.load(p)
        raw = torch.arange(2 * 144, dtype=torch.int64).remainder(256).to(torch.uint8)
        x = spec.preprocess(raw.reshape(2, 12, 12))
        self.assertEqual(list(x.shape), [2, 1, 12, 12])
        self.assertEqual(x.dtype, torch.float32)
        # exactly fusebox's loaders: (float)v / 255.0f
        want = raw.to(torch.float32) / torch.tensor(255.0, dtype=torch.float32)
        self.assertTrue(torch.equal(x.reshape(-1), want))
        f = torch.rand(2, 144)
        self.assertTrue(torch.equal(spec.preprocess(f), f.reshape(2, 1, 12, 12)))
        with self.assertRaises(ValueError):
            spec.preprocess(torch.zeros(2, 10, dtype=torch.uint8))
        with self.assertRaises(TypeError):
            spec.preprocess(torch.zeros(2, 144, dtype=torch.int32))

    def test_bad_files(self):
        good = self.path("good.safetensors")
        fusebox_like_file(good, CNN, self.module)
        with open(good, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])

        def plain(p):
            safetensors.write(p, dict(self.module.state_dict()))

        def bytes_of(data):
            def make(p):
                with open(p, "wb") as f:
                    f.write(data)
            return make

        def with_meta(**meta):
            return lambda p: fusebox_like_file(p, CNN, self.module, extra_meta=meta)

        bad_model = dict(CNN, extra=1)
        # (what, how the file is made, the error class, words of the message)
        cases = [
            ("no metadata", plain, fusebox.FileFormatError, "no fusebox metadata"),
            ("metadata without spec", with_meta(spec=None), fusebox.FileFormatError,
             "no fusebox metadata"),
            ("truncated data", bytes_of(raw[:-10]), fusebox.FileFormatError, "truncated"),
            ("truncated header", bytes_of(raw[:8 + n // 2]), fusebox.FileFormatError,
             "truncated: the header needs"),
            ("too short", bytes_of(raw[:5]), fusebox.FileFormatError, "too short"),
            ("header length huge", bytes_of(struct.pack("<Q", 1 << 40) + raw[8:]),
             fusebox.FileFormatError, "out of range"),
            ("header not JSON", bytes_of(raw[:8] + b"{" * n + raw[8 + n:]),
             fusebox.FileFormatError, "not JSON"),
            ("spec not JSON", with_meta(spec="{"), fusebox.FileFormatError,
             "metadata spec is not JSON"),
            ("no preprocess", with_meta(preprocess=None), fusebox.FileFormatError,
             "metadata preprocess is missing"),
            ("bad preprocess", with_meta(preprocess='{"uint8_scale": 0}'),
             fusebox.FileFormatError, "uint8_scale"),
            ("missing tensor", lambda p: fusebox_like_file(p, CNN, self.module, drop="14.weight"),
             fusebox.FileFormatError, "missing 14.weight"),
            ("optimizer state in a model", lambda p: fusebox_like_file(
                p, CNN, self.module, optim=True, extra_meta={"format": None}),
             fusebox.FileFormatError, "unknown optim.exp_avg"),
            ("another model", with_meta(spec=json.dumps({"model": MLP})),
             fusebox.FileFormatError, "do not fit"),
            ("unknown spec field", with_meta(spec=json.dumps({"model": bad_model})),
             fusebox.SpecError, "model.extra: unknown field"),
        ]
        for what, make, cls, words in cases:
            with self.subTest(what):
                p = self.path(what.replace(" ", "_") + ".safetensors")
                make(p)
                with self.assertRaises(cls) as cm:
                    fusebox.load(p)
                self.assertIn(words, str(cm.exception))
                if cls is fusebox.FileFormatError:
                    self.assertTrue(str(cm.exception).startswith(p), str(cm.exception))
        with self.assertRaises(fusebox.FileFormatError) as cm:
            fusebox.load(self.path("absent.safetensors"))
        self.assertIn("absent.safetensors: cannot read", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
