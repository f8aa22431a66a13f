"""Triton's `config.pbtxt` read as what it is, protobuf's text format, into plain Python: a message is a dict of
field name → list of values (a field may repeat), a value a str, int, float, bool, enum name (str) or a nested
message (dict). Only the syntax is known here, no schema: `repository.triton` says what each field means to
Packrat. Comments (`#`) and both separators (`:` and none before a message, `,` or `;` between fields) are taken.
"""

from __future__ import annotations

import re
from typing import Any

from packrat_daemon.repository.errors import RepositoryError

Message = dict[str, list[Any]]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<comment>\#[^\n]*)
      | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<number>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)[fF]?)
      | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
      | (?P<punct>[{}\[\]:,;<>])
    )""",
    re.VERBOSE,
)


def _tokens(text: str, source: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            if text[position:].strip() == "":
                break
            position += len(text[position:]) - len(text[position:].lstrip())
            line = text.count("\n", 0, position) + 1
            raise RepositoryError(
                f"{source}, line {line}: cannot read {text[position : position + 20]!r}; "
                "config.pbtxt is protobuf's text format (docs/repository.md)"
            )
        position = match.end()
        kind = match.lastgroup
        if kind is not None and kind != "comment":
            tokens.append((kind, match.group(kind)))
    return tokens


def parse(text: str, source: str = "config.pbtxt") -> Message:
    """The message `text` holds; RepositoryError naming `source` where it cannot be read."""
    tokens = _tokens(text, source)
    message, end = _message(tokens, 0, None, source)
    if end != len(tokens):
        raise RepositoryError(f"{source}: unexpected {tokens[end][1]!r} after the configuration")
    return message


def _message(tokens: list[tuple[str, str]], at: int, close: str | None, source: str) -> tuple[Message, int]:
    message: Message = {}
    while at < len(tokens):
        kind, text = tokens[at]
        if close is not None and text == close:
            return message, at + 1
        if kind != "word":
            raise RepositoryError(f"{source}: expected a field name, found {text!r}")
        at += 1
        if at < len(tokens) and tokens[at][1] == ":":
            at += 1
        values, at = _value(tokens, at, source, text)
        message.setdefault(text, []).extend(values)
        if at < len(tokens) and tokens[at][1] in (",", ";"):
            at += 1
    if close is not None:
        raise RepositoryError(f"{source}: a message is not closed (missing {close!r})")
    return message, at


def _value(tokens: list[tuple[str, str]], at: int, source: str, field: str) -> tuple[list[Any], int]:
    if at >= len(tokens):
        raise RepositoryError(f"{source}: field {field!r} has no value")
    kind, text = tokens[at]
    if text in ("{", "<"):
        nested, at = _message(tokens, at + 1, "}" if text == "{" else ">", source)
        return [nested], at
    if text == "[":
        values: list[Any] = []
        at += 1
        while at < len(tokens) and tokens[at][1] != "]":
            if tokens[at][1] == ",":
                at += 1
                continue
            more, at = _value(tokens, at, source, field)
            values += more
        if at >= len(tokens):
            raise RepositoryError(f"{source}: the list of {field!r} is not closed (missing ']')")
        return values, at + 1
    return [_scalar(kind, text)], at + 1


def _scalar(kind: str, text: str) -> Any:
    if kind == "string":
        return bytes(text[1:-1], "utf-8").decode("unicode_escape")
    if kind == "number":
        stripped = text.rstrip("fF")
        return float(stripped) if any(c in stripped for c in ".eE") else int(stripped)
    if kind == "word" and text in ("true", "True"):
        return True
    if kind == "word" and text in ("false", "False"):
        return False
    return text  # an enum's name (TYPE_FP32, KIND_CPU)


def first(message: Message, field: str, default: Any = None) -> Any:
    """The field's (last) value, as protobuf reads a repeated scalar given to a singular field."""
    values = message.get(field)
    return values[-1] if values else default
