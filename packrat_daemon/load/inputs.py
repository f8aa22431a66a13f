"""What `packrat load` sends: each request's tensors, made from the daemon's `info` and nothing else.

A model of one input gets one array (protocol version 1), a model of several a dict of them by name (version 2),
each generated from its declaration: floats from a normal, token ids below the input's `high` (its vocabulary), a
mask input (`attention_mask`) all ones. With a distribution of lengths (`packrat_daemon.load.lengths`), every
request draws one length and each input along the sequence axis takes it:

- a model that declares a free axis (`info`'s shape holds -1 there, with its `max_length` and `min_length`): every
  input of a free axis is sent at the request's length;
- a model of fixed shapes (today's text daemons, one padded length each): the integer inputs share the sequence
  axis (each sample's last); a request of length L is padded to the model's length, its first L tokens real, the
  rest token 0, and its mask marks the first L. That is what a client of such a daemon has to do, so one traffic
  can be sent to both kinds of daemon and compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from packrat_daemon.load.lengths import Lengths
from packrat_daemon.wire.errors import ConfigError

# What a request is: one array (version 1) or named arrays (version 2), and the wire dtype labels it needs.
Request = np.ndarray | dict[str, np.ndarray]
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
# The dtypes numpy holds each wire dtype in (bfloat16: its raw bits).
NUMPY_DTYPES = {"bfloat16": "uint16"}
# Inputs that mark a sequence's real tokens (1) from its padding (0): Hugging Face's `attention_mask`, the older
# exports' `input_mask`, and the like.
MASK_SUFFIX = "mask"


@dataclass(frozen=True)
class Declared:
    """One input as the daemon's `info` declares it: per-sample `shape` at its longest, and the axis that varies."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    high: int | None = None
    free_axis: int | None = None  # the per-sample axis whose size varies, up to shape[free_axis]
    min_length: int = 1

    @classmethod
    def from_info(cls, entry: dict[str, Any], name: str) -> Declared:
        shape = [int(size) for size in entry["shape"]]
        free = [axis for axis, size in enumerate(shape) if size == -1]
        if len(free) > 1:
            raise ConfigError(f"input {name!r} has {len(free)} free axes; packrat load varies one, the sequence")
        if not free:
            return cls(name, str(entry["dtype"]), tuple(shape), entry.get("high"))
        if entry.get("max_length") is None:
            raise ConfigError(
                f"input {name!r} declares a free axis without its longest (max_length); serve it with an input "
                "such as --input int64:1..128"
            )
        shape[free[0]] = int(entry["max_length"])
        return cls(name, str(entry["dtype"]), tuple(shape), entry.get("high"), free[0], int(entry.get("min_length", 1)))

    @property
    def longest(self) -> int:
        """The most tokens along the free axis (the sequence's last axis when it has none)."""
        return self.shape[-1 if self.free_axis is None else self.free_axis]

    @property
    def is_mask(self) -> bool:
        return self.name.endswith(MASK_SUFFIX) and (self.dtype in INTEGER_DTYPES or self.dtype == "bool")

    @property
    def is_tokens(self) -> bool:
        """Integer ids along a sequence: the inputs a fixed-shape model pads (each sample's last axis)."""
        return self.dtype in INTEGER_DTYPES and len(self.shape) >= 1


def declared_inputs(info: dict[str, Any]) -> tuple[list[Declared], bool]:
    """The model's inputs as `info` declares them, and whether they are named (a model of several: version 2)."""
    entries = info.get("inputs")
    if not entries:  # a daemon from before named inputs: its one `input`
        return [Declared.from_info(info["input"], "input")], False
    return [Declared.from_info(entry, str(entry["name"])) for entry in entries], len(entries) > 1


def _values(tensor: Declared, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values of `tensor` in `shape`: a mask all ones, ids below `high`, floats from a normal."""
    dtype = tensor.dtype
    if tensor.is_mask:
        return np.ones(shape, dtype=dtype)
    if dtype == "bfloat16":  # numpy has no bfloat16: its raw bits (the top half of a float32) as uint16
        return (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype.startswith("float"):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, tensor.high or 100, shape).astype(dtype)


class Inputs:
    """Each request's tensors: random values made once, as large as the largest request at the longest length;
    a request sends its first rows (a view) and, with lengths, its first tokens along the sequence axis."""

    def __init__(self, info: dict[str, Any], largest: int, seed: int = 0, lengths: Lengths | None = None) -> None:
        max_batch = int(info["max_batch"])
        if largest > max_batch:
            raise ConfigError(
                f"requests of {largest} samples are more than the daemon's max_batch {max_batch}; "
                "send smaller requests or serve with a larger --max-batch"
            )
        self.tensors, self.named = declared_inputs(info)
        self.lengths = lengths
        self.padded_to = self._check_lengths(lengths)
        rng = np.random.default_rng(seed)
        self._base = {t.name: _values(t, (largest, *t.shape), rng) for t in self.tensors}
        bf16 = {t.name: "bfloat16" for t in self.tensors if t.dtype == "bfloat16"}
        self.wire_dtype: str | dict[str, str] | None = None
        if bf16:
            self.wire_dtype = bf16 if self.named else "bfloat16"
        self._length_rng = np.random.default_rng([seed, 1])  # apart from the values': one draw per request
        self._drawn: list[int] = []

    @property
    def dtype(self) -> str:
        """The first input's dtype (a model of one input: its only one)."""
        return self.tensors[0].dtype

    @property
    def varies(self) -> list[Declared]:
        """The inputs a request's length sets: those of a free axis, or when padding, the integer ones."""
        if self.padded_to is not None:
            return [t for t in self.tensors if t.is_tokens]
        return [t for t in self.tensors if t.free_axis is not None]

    def _check_lengths(self, lengths: Lengths | None) -> int | None:
        """The length a fixed-shape model pads each request to (None: it has a free axis, or no lengths given);
        ConfigError for lengths the model cannot take."""
        free = [t for t in self.tensors if t.free_axis is not None]
        if free:
            longest, shortest = min(t.longest for t in free), max(t.min_length for t in free)
            if lengths is not None and not shortest <= lengths.shortest <= lengths.longest <= longest:
                raise ConfigError(
                    f"--lengths {lengths.describe()} sends {lengths.shortest} to {lengths.longest} tokens; the model "
                    f"takes {shortest} to {longest}: keep the lengths within them"
                )
            return None
        if lengths is None:
            return None
        tokens = [t for t in self.tensors if t.is_tokens]
        if not tokens:
            listed = ", ".join(f"{t.name} {t.dtype}" for t in self.tensors)
            raise ConfigError(f"--lengths needs a model of token inputs (integers along a sequence); it takes {listed}")
        sizes = {t.shape[-1] for t in tokens}
        if len(sizes) > 1:
            raise ConfigError(
                "--lengths: the model's integer inputs differ in length ("
                + ", ".join(f"{t.name} {t.shape[-1]}" for t in tokens) + "), so they share no sequence axis"
            )  # fmt: skip
        padded = sizes.pop()
        if lengths.longest > padded:
            raise ConfigError(
                f"--lengths {lengths.describe()} sends up to {lengths.longest} tokens, but the model takes {padded}, "
                f"fixed: send at most {padded}, or serve it with a free axis (e.g. --input int64:1..{lengths.longest})"
            )
        return padded

    def length(self) -> int | None:
        """The next request's length (None without lengths): drawn in order, a thousand at a time."""
        if self.lengths is None:
            return None
        if not self._drawn:
            self._drawn = self.lengths.sample(self._length_rng, 1000).tolist()[::-1]
        return self._drawn.pop()

    def request(self, samples: int, length: int | None = None) -> Request:
        """The tensors of a request of `samples` rows at `length` tokens (None: the model's longest)."""
        arrays = {}
        for tensor in self.tensors:
            rows = self._base[tensor.name][:samples]  # a view: no copy per request
            if length is not None:
                rows = self._at_length(tensor, rows, length)
            arrays[tensor.name] = rows
        return arrays if self.named else arrays[self.tensors[0].name]

    def _at_length(self, tensor: Declared, rows: np.ndarray, length: int) -> np.ndarray:
        if self.padded_to is not None:
            if not tensor.is_tokens or length >= self.padded_to:
                return rows
            padded = rows.copy()
            padded[..., length:] = 0  # padding: token 0, and a mask that marks it so
            return padded
        if tensor.free_axis is None:
            return rows
        return np.take(rows, np.arange(length), axis=1 + tensor.free_axis)

    def rows(self, samples: int) -> np.ndarray:
        """A model of one input: its first `samples` rows."""
        request = self.request(samples)
        if isinstance(request, dict):
            raise TypeError("a model of several inputs takes named arrays: use request()")
        return request

    def describe(self) -> dict[str, Any]:
        """What the report says of the inputs sent."""
        described: dict[str, Any] = {"inputs": [t.name for t in self.tensors]}
        if self.lengths is not None:
            described["lengths"] = self.lengths.describe()
            described["padded_to"] = self.padded_to
        return described
