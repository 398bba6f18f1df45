"""Safetensors files in plain Python.

A safetensors file is an 8-byte little-endian header length n, n bytes of a
JSON header (tensor name -> dtype, shape, data_offsets; "__metadata__" ->
string to string) and the tensors' raw little-endian bytes.  Debian 12 has
no safetensors package, so this module reads and writes the format itself:
the header needs only the standard library, the tensors torch
(torch.frombuffer, on a little-endian host as every fusebox platform is).
"""

import json
import os
import struct

from .errors import FileFormatError

# the reference implementation's bound on the header
MAX_HEADER = 100 * 1000 * 1000

_DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U8": ("uint8", 1), "BOOL": ("bool", 1),
}


def _read_bytes(source):
    """(bytes, name for messages) of a path or of bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "<bytes>"
    try:
        with open(source, "rb") as f:
            return f.read(), os.fspath(source)
    except OSError as e:
        raise FileFormatError(source, f"cannot read: {e.strerror or e}") from None


def _parse_header(raw, name):
    if len(raw) < 8:
        raise FileFormatError(name, f"{len(raw)} bytes: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n < 2 or n > MAX_HEADER:
        raise FileFormatError(name, f"header length {n} is out of range (2..{MAX_HEADER})")
    if 8 + n > len(raw):
        raise FileFormatError(name, f"truncated: the header needs {n} bytes, "
                                    f"the file has {len(raw) - 8} after the length")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FileFormatError(name, f"the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise FileFormatError(name, "the header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FileFormatError(name, "__metadata__ is not an object of strings")
    data_len = len(raw) - 8 - n
    for tname, h in header.items():
        where = f"tensor {tname}"
        if not isinstance(h, dict) or set(h) != {"dtype", "shape", "data_offsets"}:
            raise FileFormatError(name, f"{where}: needs exactly dtype, shape and data_offsets")
        if h["dtype"] not in _DTYPES:
            raise FileFormatError(name, f"{where}: unknown dtype {h['dtype']!r}")
        shape, offs = h["shape"], h["data_offsets"]
        if (not isinstance(shape, list) or
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise FileFormatError(name, f"{where}: shape {shape!r} is not a list of sizes")
        if (not isinstance(offs, list) or len(offs) != 2 or
                not all(isinstance(o, int) and not isinstance(o, bool) for o in offs) or
                not 0 <= offs[0] <= offs[1] <= data_len):
            raise FileFormatError(name, f"{where}: data_offsets {offs!r} are outside the "
                                        f"{data_len} data bytes (truncated?)")
        numel = 1
        for d in shape:
            numel *= d
        if offs[1] - offs[0] != numel * _DTYPES[h["dtype"]][1]:
            raise FileFormatError(name, f"{where}: {offs[1] - offs[0]} bytes for {h['dtype']} "
                                        f"{shape}")
    return header, meta, 8 + n


def read_metadata(source):
    """The "__metadata__" of a safetensors file (a path or bytes), as a dict of
    strings ({} without one), after checking the whole header; needs no torch."""
    raw, name = _read_bytes(source)
    return _parse_header(raw, name)[1]


def read(source):
    """(tensors, metadata) of a safetensors file (a path or bytes): tensors maps
    names to torch tensors (in the file's order), metadata names to strings.
    Raises FileFormatError naming the file when it is not valid safetensors."""
    import torch

    raw, name = _read_bytes(source)
    header, meta, start = _parse_header(raw, name)
    out = {}
    for tname, h in header.items():
        b, e = h["data_offsets"]
        dtype = getattr(torch, _DTYPES[h["dtype"]][0])
        chunk = bytearray(raw[start + b:start + e])  # writable, and owned by the tensor
        if len(chunk) == 0:
            t = torch.zeros(h["shape"], dtype=dtype)
        else:
            t = torch.frombuffer(chunk, dtype=dtype).reshape(h["shape"])
        out[tname] = t
    return out, meta


def write(path, tensors, metadata=None):
    """Writes {name: torch tensor} (and metadata, a dict of strings) as a
    safetensors file, names sorted, atomically (a temporary file, renamed)."""
    names = {v[0]: k for k, v in _DTYPES.items()}
    header, blobs, off = {}, [], 0
    for tname in sorted(tensors):
        t = tensors[tname].detach().cpu().contiguous()
        dt = str(t.dtype).replace("torch.", "")
        if dt not in names or dt == "bfloat16":  # numpy, which writes the bytes, has no bf16
            raise ValueError(f"tensor {tname}: dtype {t.dtype} is not written here")
        data = t.numpy().tobytes()
        header[tname] = {"dtype": names[dt], "shape": list(t.shape),
                         "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
