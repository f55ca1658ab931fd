"""The judge <-> worker wire: framing, and the plain encoding of results.

A message is an 8-byte big-endian length followed by a torch.save payload that holds plain data only: dicts,
lists, tuples, str, int, float, bool, None, dtypes and tensors. It is always read back with
torch.load(weights_only=True), so nothing a worker sends is ever unpickled as an arbitrary object.

Richer values travel as tagged dicts, {"kind": ..., ...}; every user dict travels as a list of pairs, so a tag
can never be forged by a dict that happens to hold the key "kind". Results come back through `to_plain` (the
worker's side) and `from_plain` (the judge's side): tensors keep dtype, device and requires_grad; dataclasses
and simple objects become attribute bags; anything else becomes an `Opaque` naming its type.
"""
import dataclasses
import io
import struct

import torch

HEADER = struct.Struct(">Q")
MAX_FRAME = 256 * 2**20          # larger frames are refused: a worker cannot make the judge allocate without bound
MAX_DEPTH = 12                   # nesting deeper than this is sent as Opaque


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message."""


def pack(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    return HEADER.pack(len(payload)) + payload


def unpack(payload: bytes):
    try:
        return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as exc:  # any decoding failure of untrusted bytes is a protocol error, nothing more
        raise ProtocolError(f"undecodable message ({type(exc).__name__}: {str(exc)[:200]})") from None


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
    return {"kind": "tensor", "data": data.clone(), "requires_grad": bool(t.requires_grad),
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
    if isinstance(value, (list, tuple)):
        return {"kind": type(value).__name__ if type(value) in (list, tuple) else "list",
                "items": [to_plain(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"kind": "dict", "items": [(to_plain(k, depth + 1), to_plain(v, depth + 1)) for k, v in value.items()]}
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "name": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
        return {"kind": "object", "type": type(value).__name__,
                "fields": [(k, to_plain(v, depth + 1)) for k, v in fields.items()]}
    return opaque(value)


def opaque(value) -> dict:
    try:
        text = repr(value)[:200]
    except Exception:
        text = "<unprintable>"
    return {"kind": "opaque", "type": type(value).__name__, "repr": text}


class Returned:
    """An object the implementation returned (a dataclass such as a Rollout), as attributes."""

    def __init__(self, type_name: str, fields: dict):
        self.__dict__.update(fields)
        self._type = type_name

    def __repr__(self):
        return f"{self._type}({', '.join(k for k in self.__dict__ if k != '_type')})"


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
            return getattr(torch, str(value["name"]).removeprefix("torch."), str(value["name"]))
        if kind == "object":
            return Returned(str(value["type"]), {str(k): from_plain(v, depth + 1) for k, v in value["fields"]})
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
