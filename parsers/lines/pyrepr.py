"""A tolerant parser for Python reprs and JSON-ish text as trainers print them.

``ast.literal_eval`` fails on ``{'loss': nan}`` (HF stdout), ``Namespace(lr=0.1, ...)``,
``TrainingArguments(..., lr_scheduler_type=<SchedulerType.LINEAR: 'linear'>)`` and ``Counter({5: 1})``;
this parser reads all of them: ``nan``/``inf``/``NaN``/``Infinity`` become floats, a call
``Name(a, k=v)`` becomes a dict of its keyword arguments (positional ones under ``"_args"``),
``<...>`` and bare names become strings. Never raises: :func:`parse` returns ``default`` on failure.
"""

from __future__ import annotations

import math
import re
from typing import Any

_NUM = re.compile(r"[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)")
_IDENT = re.compile(r"[A-Za-z_][\w.]*")
_KW = re.compile(r"([A-Za-z_]\w*)\s*=(?!=)")
_CONST = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None,
          "nan": math.nan, "NaN": math.nan, "inf": math.inf, "Infinity": math.inf, "infinity": math.inf}
_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "0": "\0"}


class _Fail(Exception):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.depth = 0

    def ws(self) -> None:
        s, i = self.s, self.i
        while i < len(s) and s[i] in " \t\n\r":
            i += 1
        self.i = i

    def peek(self) -> str:
        self.ws()
        return self.s[self.i] if self.i < len(self.s) else ""

    def value(self) -> Any:
        self.depth += 1
        if self.depth > 200:
            raise _Fail
        try:
            return self._value()
        finally:
            self.depth -= 1

    def _value(self) -> Any:
        c = self.peek()
        if c == "{":
            return self.mapping()
        if c == "[":
            return self.seq("]")
        if c == "(":
            return self.seq(")")
        if c in "'\"":
            return self.string()
        if c == "<":
            j = self.s.find(">", self.i)
            if j < 0:
                raise _Fail
            out = self.s[self.i + 1:j]
            self.i = j + 1
            return out
        if c in "-+" and self.s[self.i + 1:self.i + 2].isalpha():
            sign = -1.0 if c == "-" else 1.0
            self.i += 1
            v = self.ident()
            if isinstance(v, float):
                return sign * v
            raise _Fail
        m = _NUM.match(self.s, self.i)
        if m and m.group():
            self.i = m.end()
            txt = m.group().replace("_", "")
            if re.fullmatch(r"[-+]?\d+", txt):
                return int(txt)
            return float(txt)
        if c and (c.isalpha() or c == "_"):
            if c in "brfu" and self.s[self.i + 1:self.i + 2] in ("'", '"'):
                self.i += 1
                return self.string()
            return self.ident()
        raise _Fail

    def ident(self) -> Any:
        m = _IDENT.match(self.s, self.i)
        if not m:
            raise _Fail
        self.i = m.end()
        name = m.group()
        if self.i < len(self.s) and self.s[self.i] == "(":
            return self.call()
        return _CONST.get(name, name)

    def call(self) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        args: list[Any] = []
        while True:
            if self.peek() == ")":
                self.i += 1
                break
            m = _KW.match(self.s, self.i)
            if m:
                self.i = m.end()
                out[m.group(1)] = self.value()
            else:
                args.append(self.value())
            c = self.peek()
            if c == ",":
                self.i += 1
            elif c != ")":
                raise _Fail
        if args:
            out["_args"] = args
        return out

    def mapping(self) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        while True:
            if self.peek() == "}":
                self.i += 1
                return out
            k = self.value()
            if self.peek() != ":":
                raise _Fail
            self.i += 1
            out[k if isinstance(k, str) else str(k)] = self.value()
            c = self.peek()
            if c == ",":
                self.i += 1
            elif c != "}":
                raise _Fail

    def seq(self, close: str) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        while True:
            if self.peek() == close:
                self.i += 1
                return out
            out.append(self.value())
            c = self.peek()
            if c == ",":
                self.i += 1
            elif c != close:
                raise _Fail

    def string(self) -> str:
        q = self.s[self.i]
        self.i += 1
        buf: list[str] = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\\" and self.i + 1 < len(s):
                buf.append(_ESC.get(s[self.i + 1], "\\" + s[self.i + 1]))
                self.i += 2
                continue
            if c == q:
                self.i += 1
                return "".join(buf)
            buf.append(c)
            self.i += 1
        raise _Fail


def parse(text: str, default: Any = None) -> Any:
    """Parse one Python repr / JSON-ish value.

    Args:
        text: E.g. ``"{'loss': nan, 'epoch': 0.5}"`` or ``"Namespace(lr=0.1, betas=(0.9, 0.98))"``.
        default: Returned when the text is not one complete value.

    Returns:
        The value: dicts, lists (tuples become lists), str, int, float, bool or ``None``.
    """
    p = _Parser(text.strip())
    try:
        v = p.value()
        p.ws()
        if p.i != len(p.s):
            return default
        return v
    except (_Fail, ValueError, IndexError, RecursionError):
        return default


def to_float(v: Any) -> float | None:
    """A logged value as float: numbers and numeric strings (``"0.5"``, ``"nan"``); else ``None``.

    Booleans are not numbers here.
    """
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        t = v.strip().replace(",", "")
        try:
            return float(t)
        except ValueError:
            return None
    return None


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts with dotted keys (for diffing configurations)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
