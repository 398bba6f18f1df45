"""fusebox from Python: models between PyTorch and fusebox, its files, its API.

    import fusebox
    spec = fusebox.from_torch(torch_module, input=[1, 28, 28])   # a model spec
    module = fusebox.to_torch(spec)                               # and back
    module, spec = fusebox.load("model.safetensors")              # a fusebox file
    client = fusebox.Client(url, key)                             # the REST API

See docs/python.md.  torch is needed by to_torch, from_torch and load only.
"""

from . import metrics
from .client import Client
from .errors import ApiError, FileFormatError, FuseboxError, SpecError, UnsupportedModule
from .model import (FileSpec, GlobalAvgPool, Preprocess, Residual, from_torch, load,
                    output_shape, read_spec, to_torch)

__version__ = "0.1.0"

__all__ = [
    "ApiError", "Client", "FileFormatError", "FileSpec", "FuseboxError", "GlobalAvgPool",
    "Preprocess", "Residual", "SpecError", "UnsupportedModule", "from_torch", "load", "metrics",
    "output_shape", "read_spec", "to_torch",
]
