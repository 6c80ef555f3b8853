r"""Text from run folders is data: one escaping function per output (issue 16).

Run names, file names, metric names, tensor names and messages come from untrusted files. Each
output has exactly one function here, applied at its render boundary:

- HTML (:func:`html_text`, the Jinja ``finalize`` of the HTML environment before autoescape):
  bidirectional controls (U+202E reverses the run name in a header) and other invisible format
  characters are shown as ``<U+202E>``; control characters as ``\xNN``; autoescape does the rest.
- Markdown (:func:`md_text` for prose, :func:`md_code` for a code span, :func:`md_name` for a metric or
  setting name inside prose): every ASCII punctuation
  character with a meaning in CommonMark or GFM is backslash-escaped, so no raw HTML (``<script>``,
  ``<img onerror>``), no link or image (``javascript:``, remote images) and no emphasis can come
  from a name; a code span is fenced with one backtick more than the longest run inside it, so a
  backtick in a name cannot close it.
- Terminal (:func:`terminal`): control characters (ESC of cursor movement, OSC title and OSC 52
  clipboard sequences, BEL, CR, newline) and bidi controls replaced before rich or click prints.
- matplotlib: text is never parsed as mathtext (``text.parse_math: False`` in the chart style).
"""

from __future__ import annotations

import re
import unicodedata

_BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
_INVISIBLE = {0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, *_BIDI}
INVISIBLE = frozenset(_INVISIBLE)
"""Code points shown as ``<U+XXXX>``: bidi controls (U+202A-202E, U+2066-2069, marks) and zero-width ones."""


def _visible(text: str, keep_newline: bool) -> str:
    out = []
    for c in text:
        o = ord(c)
        if o in _INVISIBLE:
            out.append(f"<U+{o:04X}>")
        elif (o < 0x20 and not (keep_newline and c in "\n\t")) or o == 0x7F or 0x80 <= o < 0xA0:
            out.append(f"\\x{o:02x}")
        elif 0xD800 <= o <= 0xDFFF:
            out.append(f"\\u{o:04x}")
        elif unicodedata.category(c) == "Cf" and o > 0xFF:
            out.append(f"<U+{o:04X}>")
        else:
            out.append(c)
    return "".join(out)


def _plain(text: str) -> bool:
    return text.isascii() and text.isprintable()


def html_text(text: str) -> str:
    """Text for an HTML page before autoescape: bidi/invisible format characters and controls made visible.

    Newlines and tabs are kept (``<pre>`` blocks); everything else Jinja's autoescape handles.
    """
    return text if _plain(text) else _visible(text, keep_newline=True)


def html_code_spans(text: object) -> object:
    """HTML for a sentence whose `backticked` spans are commands or names: escaped, the spans as ``<code>``.

    The planner and the criteria write commands in backticks (Markdown's code span); the HTML page shows them
    as code instead of literal backticks. Everything else is escaped as autoescape would (bidi and invisible
    characters made visible first, :func:`html_text`).
    """
    from markupsafe import Markup, escape

    if not isinstance(text, str) or isinstance(text, Markup) or "`" not in text:
        return text
    safe = str(escape(html_text(text)))
    return Markup(_CODE_SPAN.sub(r"<code>\1</code>", safe))


_CODE_SPAN = re.compile(r"`([^`<>]+)`")
"""A Markdown code span (after escaping, so no tag can be inside)."""


def terminal(text: str) -> str:
    r"""Text safe to print on a terminal: no escape sequence, no carriage return, one line per newline given.

    Control characters (C0 except newline and tab, DEL, C1) become ``\xNN``; bidi and invisible
    format characters ``<U+XXXX>``.
    """
    return text if _plain(text) else _visible(text, keep_newline=True)


def terminal_line(text: str) -> str:
    """:func:`terminal` on one line: a newline in a file name cannot forge a second output line."""
    return text if _plain(text) else _visible(text, keep_newline=False)


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>!|&~$])")
_MD_LEAD = re.compile(r"^(\s*)([#+\-=>]|\d+(?=[.)]))")


def md_text(text: str) -> str:
    """Text for Markdown prose: CommonMark-safe (every meaningful ASCII punctuation backslash-escaped).

    No raw HTML, link, image, emphasis, heading or table cell can come out of ``text``; newlines are
    collapsed to spaces (one item stays one line).
    """
    text = " ".join(_visible(str(text), keep_newline=False).split())
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return _MD_LEAD.sub(lambda m: m.group(1) + (m.group(2) if m.group(2).isdigit() else "\\" + m.group(2))
                        + ("\\" if m.group(2).isdigit() else ""), text)


def md_code(text: str) -> str:
    """A Markdown code span that ``text`` cannot close: fenced by more backticks than any run inside it.

    One line (whitespace collapsed); padded with a space when it starts or ends with a backtick.
    A ``|`` is replaced by U+2502 so the span is also safe inside a table cell (GFM splits cells
    on ``|`` even inside code spans).
    """
    text = " ".join(_visible(str(text), keep_newline=False).split()).replace("|", "\u2502")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_]*[A-Za-z0-9])?"
_MD_NAME = re.compile(rf"(?!www\.)(?=[A-Za-z]){_PART}(?:[./-]{_PART})*")


def md_name(text: str) -> str:
    """A metric or setting name in Markdown prose: as is when it cannot mean anything there, else a code span.

    As is: ASCII letters, digits and ``_``, parts joined by ``.``, ``/`` or ``-``, starting with a letter and
    ending with a letter or digit (``attn_logit_max``, ``train/loss``): an intraword ``_`` opens no emphasis
    in CommonMark. Anything else (markup, backticks, controls, a leading ``_``) goes through :func:`md_code`.
    """
    text = str(text)
    return text if _MD_NAME.fullmatch(text) else md_code(text)


def md_cell(text: str) -> str:
    """Markdown prose inside a table cell (:func:`md_text`; ``|`` is escaped by it too)."""
    return md_text(text)
