"""The judge <-> worker wire: framing, and the plain encoding of results.

A message is an 8-byte big-endian length and a payload laid out as safetensors lays out a file, extended to a
tree: a JSON header (the tree of dicts, lists, str, int, float, bool and None, with each tensor replaced by a
reference, and each tensor's dtype, shape and byte range) followed by the tensors' raw bytes. Nothing is ever
unpickled: a worker's message is parsed as JSON and raw numbers, every length and dtype checked, so it can say
nothing but data. (torch.save with weights_only=True would be as safe; its unpickler costs milliseconds a
message, this costs microseconds.)

What a worker sends is bounded before the judge holds it: a frame of at most MAX_FRAME bytes with a header of at
most MAX_HEADER, at most MAX_TENSORS tensors whose byte ranges tile the data in order (none overlaps another or
leaves it, and each is used once in the tree, so the tensors the judge builds never hold more bytes than the
frame it read) and whose shapes count at most MAX_ELEMENTS elements even where a size of 0 leaves them empty, lists
and dicts of at most MAX_ITEMS entries, integers within 64 bits, strings cut to MAX_STRING characters with any lone
surrogate replaced (so no report the judge writes can fail to encode), and dtypes only from DTYPES: no name a worker
sends is ever looked up as an attribute of anything. Every number of the header is
checked for its type and range; `count` checks one a caller uses as a count.

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
MAX_HEADER = 2**20               # bytes of a frame's JSON header (the checks' largest is 23 kB)
MAX_TENSORS = 4096               # tensors in one frame (the checks' largest reply holds 162)
MAX_DIMS = 32                    # dimensions of one tensor
MAX_ELEMENTS = 2**20             # elements of one tensor, each size of 0 counted as 1: what quoting it would make
                                 # (an empty tensor of shape (2048, 4096, 0) is 8 million empty lists to .tolist()
                                 # and took the judge from 275 MB to 1.5 GB; the checks' largest holds 16,384)
MAX_INT = 2**63                  # an integer in a frame is within 64 bits, as every one a tensor or a count can be
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
        if len(payload) < JSON_LENGTH.size:
            raise ProtocolError("a message shorter than its header's length")
        (n,) = JSON_LENGTH.unpack(payload[:JSON_LENGTH.size])
        if n > MAX_HEADER or JSON_LENGTH.size + n > len(payload):
            raise ProtocolError(f"a header of {n} bytes (the limit is {MAX_HEADER}, the message has {len(payload)})")
        header = json.loads(payload[JSON_LENGTH.size:JSON_LENGTH.size + n])
        if not isinstance(header, dict) or set(header) != {"tree", "tensors"}:
            raise ProtocolError("a header that is not {tree, tensors}")
        tensors = _tensors(header["tensors"], memoryview(payload)[JSON_LENGTH.size + n:])
        used = [False] * len(tensors)
        tree = _from_json(header["tree"], tensors, used, 0)
        if not all(used):
            raise ProtocolError(f"tensor {used.index(False)} is sent but never used")
        return tree
    except ProtocolError:
        raise
    except Exception as exc:  # any decoding failure of untrusted bytes is a protocol error, nothing more
        raise ProtocolError(f"undecodable message ({type(exc).__name__}: {str(exc)[:200]})") from None


def _tensors(index, data) -> list:
    """The tensors an index lists, in order: their byte ranges must follow each other from the data's start to its
    end, so that together they hold exactly the data's bytes, each byte once."""
    if not isinstance(index, list) or len(index) > MAX_TENSORS:
        raise ProtocolError(f"a tensor index that is not a list of at most {MAX_TENSORS} entries")
    tensors, end = [], 0
    for i, entry in enumerate(index):
        if not isinstance(entry, list) or len(entry) != 4:
            raise ProtocolError(f"tensor {i}: an entry that is not [dtype, shape, offset, length]")
        name, shape, offset, n = entry
        if not isinstance(name, str) or name not in DTYPES:
            raise ProtocolError(f"tensor {i}: unknown dtype {str(name)[:40]!r}")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise ProtocolError(f"tensor {i}: a shape that is not a list of at most {MAX_DIMS} sizes")
        for d in shape:
            count(d, f"tensor {i}: a size", MAX_FRAME)
        quoted = math.prod(max(d, 1) for d in shape)
        if quoted > MAX_ELEMENTS:
            raise ProtocolError(f"tensor {i}: a shape of {quoted} elements, each size of 0 counted as 1 (the limit is "
                                f"{MAX_ELEMENTS})")
        count(offset, f"tensor {i}: an offset", len(data))
        count(n, f"tensor {i}: a length", len(data))
        if offset != end:
            raise ProtocolError(f"tensor {i}: byte range {offset}..{offset + n} does not start where the one "
                                f"before it ends ({end}): ranges may not overlap, repeat or leave gaps")
        dt = DTYPES[name]
        if math.prod(shape) * dt.itemsize != n or end + n > len(data):
            raise ProtocolError(f"tensor {i}: {n} bytes at {offset} for a {name} tensor of shape {shape} in "
                                f"{len(data)} bytes of data")
        end += n
        tensors.append(torch.empty(shape, dtype=dt) if n == 0 else
                       torch.frombuffer(bytearray(data[offset:end]), dtype=dt).view(shape))
    if end != len(data):
        raise ProtocolError(f"{len(data) - end} bytes of data that no tensor holds")
    return tensors


def count(value, what: str, top: int) -> int:
    """value, when it is an integer from 0 to top (not a bool, a float, infinity or NaN); else a ProtocolError
    that names it as `what`."""
    if type(value) is not int or not 0 <= value <= top:
        raise ProtocolError(f"{what} is {str(value)[:40]}, not a whole number from 0 to {top}")
    return value


def _from_json(v, tensors, used, depth):
    if depth > 64:
        raise ProtocolError("nesting too deep")
    if isinstance(v, str):
        return text(v)
    if type(v) is int and not -MAX_INT <= v < MAX_INT:
        raise ProtocolError(f"an integer beyond 64 bits ({str(v)[:40]}...)")
    if isinstance(v, (list, dict)) and len(v) > MAX_ITEMS:
        raise ProtocolError(f"a list or dict of {len(v)} entries (the limit is {MAX_ITEMS})")
    if isinstance(v, list):
        return [_from_json(x, tensors, used, depth + 1) for x in v]
    if not isinstance(v, dict):
        return v
    if "__t" in v:
        i = count(v["__t"], "a tensor reference", len(tensors) - 1) if tensors else None
        if i is None or used[i]:
            raise ProtocolError(f"a reference to tensor {str(v['__t'])[:40]}, which is not there or used already")
        used[i] = True
        return tensors[i]
    if "__dtype" in v:
        return dtype(v["__dtype"])
    if "__pairs" in v:
        pairs = v["__pairs"]
        if not isinstance(pairs, list) or len(pairs) > MAX_ITEMS or not all(
                isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ProtocolError(f"pairs that are not a list of at most {MAX_ITEMS} [key, value] pairs")
        return {_hashable(_from_json(k, tensors, used, depth + 1)): _from_json(x, tensors, used, depth + 1)
                for k, x in pairs}
    return {text(k): _from_json(x, tensors, used, depth + 1) for k, x in v.items()}


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
