"""The judge <-> worker wire: framing, and the plain encoding of results.

A message is an 8-byte big-endian length and a payload laid out as safetensors lays out a file, extended to a
tree: a JSON header (the tree of dicts, lists, str, int, float, bool and None, with each tensor replaced by a
reference, and each tensor's dtype, shape and byte range) followed by the tensors' raw bytes. Nothing is ever
unpickled: a worker's message is parsed as JSON and raw numbers, every length and dtype checked, so it can say
nothing but data. (torch.save with weights_only=True would be as safe; its unpickler costs milliseconds a
message, this costs microseconds.)

What a worker sends is bounded before the judge holds it: a frame of at most MAX_FRAME bytes, lists and dicts of
at most MAX_ITEMS entries, strings cut to MAX_STRING characters with any lone surrogate replaced (so no report
the judge writes can fail to encode), and dtypes only from DTYPES: no name a worker sends is ever looked up as
an attribute of anything.

Richer values travel as tagged dicts, {"kind": ..., ...}; every user dict travels as a list of pairs, so a tag
can never be forged by a dict that happens to hold the key "kind". Results come back through `to_plain` (the
worker's side) and `from_plain` (the judge's side): tensors keep dtype, device and requires_grad; records (a
dataclass, a NamedTuple, any object with attributes) become attribute bags that keep their fields; anything else
becomes an `Opaque` naming its type.
"""
import ctypes
import dataclasses
import json
import math
import re
import struct

import torch

HEADER = struct.Struct(">Q")
JSON_LENGTH = struct.Struct(">I")
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
MAX_FRAME = 16 * 2**20           # larger frames are refused (the checks' largest reply is under 1 MiB)
MAX_ITEMS = 10_000               # entries of one list or dict; more is refused
MAX_STRING = 10_000              # characters of one string; longer ones are cut
MAX_DEPTH = 12                   # nesting deeper than this is sent as Opaque
SURROGATE = re.compile("[\ud800-\udfff]")   # a lone one cannot be encoded as UTF-8


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message."""


def pack(obj) -> bytes:
    tensors = []
    tree = _to_json(obj, tensors)
    blobs, index, offset = [], [], 0
    for t in tensors:
        t = t.detach()
        t = (t.cpu() if t.device.type != "cpu" else t).contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise TypeError(f"cannot send a tensor of dtype {t.dtype}")
        n = t.numel() * t.element_size()
        blobs.append(ctypes.string_at(t.data_ptr(), n) if n else b"")
        index.append([dtype, list(t.shape), offset, n])
        offset += n
    header = json.dumps({"tree": tree, "tensors": index}, separators=(",", ":")).encode()
    payload = JSON_LENGTH.pack(len(header)) + header + b"".join(blobs)
    return HEADER.pack(len(payload)) + payload


def _to_json(v, tensors):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.Tensor):
        tensors.append(v)
        return {"__t": len(tensors) - 1}
    if isinstance(v, torch.dtype):
        return {"__dtype": str(v).removeprefix("torch.")}
    if isinstance(v, (list, tuple)):
        return [_to_json(x, tensors) for x in v]
    if isinstance(v, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in v):
            return {k: _to_json(x, tensors) for k, x in v.items()}
        return {"__pairs": [[_to_json(k, tensors), _to_json(x, tensors)] for k, x in v.items()]}
    raise TypeError(f"cannot send a {type(v).__name__}")


def unpack(payload: bytes):
    """A message's tree. Untrusted: anything malformed is a ProtocolError, never any other exception."""
    try:
        (n,) = JSON_LENGTH.unpack(payload[:JSON_LENGTH.size])
        header = json.loads(payload[JSON_LENGTH.size:JSON_LENGTH.size + n])
        data = memoryview(payload)[JSON_LENGTH.size + n:]
        tensors = [_tensor(entry, data) for entry in header["tensors"]]
        return _from_json(header["tree"], tensors, 0)
    except ProtocolError:
        raise
    except Exception as exc:  # any decoding failure of untrusted bytes is a protocol error, nothing more
        raise ProtocolError(f"undecodable message ({type(exc).__name__}: {str(exc)[:200]})") from None


def _tensor(entry, data) -> torch.Tensor:
    dtype, shape, offset, n = entry
    if dtype not in DTYPES or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError(f"a tensor of dtype {dtype!r} and shape {shape!r}")
    dt = DTYPES[dtype]
    if math.prod(shape) * dt.itemsize != n or not (0 <= offset and offset + n <= len(data)):
        raise ProtocolError("a tensor whose bytes do not match its shape")
    if n == 0:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(data[offset:offset + n]), dtype=dt).view(shape)


def _from_json(v, tensors, depth):
    if depth > 64:
        raise ProtocolError("nesting too deep")
    if isinstance(v, str):
        return text(v)
    if isinstance(v, (list, dict)) and len(v) > MAX_ITEMS:
        raise ProtocolError(f"a list or dict of {len(v)} entries (the limit is {MAX_ITEMS})")
    if isinstance(v, list):
        return [_from_json(x, tensors, depth + 1) for x in v]
    if not isinstance(v, dict):
        return v
    if "__t" in v:
        return tensors[v["__t"]]
    if "__dtype" in v:
        return dtype(v["__dtype"])
    if "__pairs" in v:
        return {_hashable(_from_json(k, tensors, depth + 1)): _from_json(x, tensors, depth + 1) for k, x in v["__pairs"]}
    return {text(k): _from_json(x, tensors, depth + 1) for k, x in v.items()}


def text(s: str) -> str:
    """A string as the judge keeps it: at most MAX_STRING characters, lone surrogates replaced by U+FFFD."""
    if len(s) > MAX_STRING:
        s = f"{s[:MAX_STRING]}... ({len(s)} characters)"
    return SURROGATE.sub("\ufffd", s)


def dtype(name) -> torch.dtype:
    """The dtype a wire name stands for: only the ones in DTYPES."""
    if not isinstance(name, str) or name.removeprefix("torch.") not in DTYPES:
        raise ProtocolError(f"unknown dtype {str(name)[:40]!r}")
    return DTYPES[name.removeprefix("torch.")]


def _hashable(k):
    return tuple(_hashable(x) for x in k) if isinstance(k, list) else k


def frame_length(header: bytes) -> int:
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        raise ProtocolError(f"a message of {n} bytes (the limit is {MAX_FRAME})")
    return n


def send(sock, obj) -> None:
    sock.sendall(pack(obj))


def recv_blocking(sock):
    """One message, waiting as long as it takes (the worker's side; the judge reads with budgets)."""
    header = _read_exactly(sock, HEADER.size)
    return unpack(_read_exactly(sock, frame_length(header)))


def _read_exactly(sock, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# --- values -------------------------------------------------------------------------------------------

def tensor_to_plain(t: torch.Tensor) -> dict:
    data = t.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    return {"kind": "tensor", "data": data, "requires_grad": bool(t.requires_grad),
            "device": str(t.device)}


def tensor_from_plain(d: dict) -> torch.Tensor:
    t = d["data"]
    if not isinstance(t, torch.Tensor):
        raise ProtocolError("a tensor entry without tensor data")
    device = d.get("device", "cpu")
    if isinstance(device, str) and device != "cpu" and device.startswith("cuda") and torch.cuda.is_available():
        t = t.to(device)
    if d.get("requires_grad") is True and (t.is_floating_point() or t.is_complex()):
        t = t.requires_grad_(True)
    return t


def to_plain(value, depth: int = 0):
    """A result as plain data (the worker's side)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return tensor_to_plain(value)
    if depth >= MAX_DEPTH:
        return opaque(value)
    fields = record_fields(value)
    if fields is not None:
        return {"kind": "object", "type": type(value).__name__, "sequence": isinstance(value, tuple),
                "fields": [(k, to_plain(v, depth + 1)) for k, v in fields.items()]}
    if isinstance(value, (list, tuple)):
        return {"kind": "tuple" if isinstance(value, tuple) else "list",
                "items": [to_plain(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"kind": "dict", "items": [(to_plain(k, depth + 1), to_plain(v, depth + 1)) for k, v in value.items()]}
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "name": str(value)}
    return opaque(value)


def record_fields(value) -> dict | None:
    """The named fields of a record, or None for a plain container or a value without attributes: a NamedTuple's
    fields in order, a dataclass's, or an object's public attributes (its __dict__, __slots__ and properties)."""
    kind = type(value)
    if kind in (list, tuple, dict) or isinstance(value, (type, torch.dtype)) or callable(value):
        return None
    if isinstance(value, tuple) and isinstance(getattr(kind, "_fields", None), tuple):
        return dict(zip(kind._fields, value))
    if isinstance(value, (list, tuple, dict)):
        return None
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
    names = list(getattr(value, "__dict__", {}))
    for cls in kind.__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
        names += [k for k, v in cls.__dict__.items() if isinstance(v, property)]
    fields = {}
    for name in dict.fromkeys(names):
        if not name.startswith("_"):
            try:
                fields[name] = getattr(value, name)
            except Exception:  # a property that raises, a slot never set: not a field it has
                continue
    return fields or None


def opaque(value) -> dict:
    try:
        text = repr(value)[:200]
    except Exception:
        text = "<unprintable>"
    return {"kind": "opaque", "type": type(value).__name__, "repr": text}


class Returned:
    """A record the implementation returned (a Rollout as a dataclass, a NamedTuple, a plain class), as its
    attributes; one that was a tuple also unpacks and indexes as one, in field order."""

    def __init__(self, type_name: str, fields: dict, sequence: bool = False):
        self.__dict__.update(fields)
        self._type, self._sequence = type_name, list(fields.values()) if sequence else None

    def __repr__(self):
        return f"{self._type}({', '.join(k for k in self.__dict__ if not k.startswith('_'))})"

    def __bool__(self):
        return True

    def _items(self) -> list:
        if self._sequence is None:
            raise TypeError(f"a {self._type} is not a sequence")
        return self._sequence

    def __iter__(self):
        return iter(self._items())

    def __getitem__(self, i):
        return self._items()[i]

    def __len__(self):
        return len(self._items())


@dataclasses.dataclass(frozen=True)
class Opaque:
    """A value that cannot cross the wire as data: only its type and repr."""
    type: str
    repr: str

    def __str__(self):
        return f"<{self.type}: {self.repr}>"


def from_plain(value, depth: int = 0):
    """A result from the worker (the judge's side). Untrusted: anything malformed is a ProtocolError."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > MAX_DEPTH + 2 or not isinstance(value, dict):
        raise ProtocolError(f"unexpected {type(value).__name__} in a result")
    kind = value.get("kind")
    try:
        if kind == "tensor":
            return tensor_from_plain(value)
        if kind in ("list", "tuple"):
            items = [from_plain(v, depth + 1) for v in value["items"]]
            return items if kind == "list" else tuple(items)
        if kind == "dict":
            return {_key(from_plain(k, depth + 1)): from_plain(v, depth + 1) for k, v in value["items"]}
        if kind == "dtype":
            return dtype(value["name"])
        if kind == "object":
            fields = {str(k): from_plain(v, depth + 1) for k, v in value["fields"] if not str(k).startswith("_")}
            return Returned(str(value["type"]), fields, value.get("sequence") is True)
        if kind == "opaque":
            return Opaque(str(value["type"]), str(value["repr"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed {kind!r} entry ({exc})") from None
    raise ProtocolError(f"unknown entry kind {kind!r}")


def _key(k):
    try:
        hash(k)
        return k
    except TypeError:
        return repr(k)
