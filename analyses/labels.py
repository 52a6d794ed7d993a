"""Token text is data from a model folder: the one place that makes it safe wherever it lands.

- `token_label(s)`: the visible form for the terminal, figure labels and interactive views: `token_label("\\n  ")`
  is `"⏎␣␣"`, `token_label(" self")` is `"␣self"`, a tab is the two characters `\\t`, other control and format
  characters (ESC, C1 controls, bidi overrides, U+2028/U+2029) are `\\xNN` / `\\uNNNN`; `token_labels(model, ids)`
  does it for token ids, writing a byte-level token that is only part of a UTF-8 character (which decodes to
  U+FFFD) as its byte, `<0xE2>`, instead of a stray glyph; `util.token_str` is `token_labels` of one id.
- `markdown_text(s)`: text as Markdown that renders as exactly that text (no link, image, HTML tag, emphasis or
  math), control characters made visible; report.md's tables pass every text cell through it, and report.html
  renders that Markdown with raw HTML off.
- `html_text(s)`: text as HTML, for CircuitsVis, whose components render a token's text as HTML.
- `figure_text(s)`: a label matplotlib draws as plain text (a `$` would start mathtext).
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

#: Visible stand-ins: newline ⏎ (U+23CE), space ␣ (U+2423); both are in matplotlib's default DejaVu Sans.
NEWLINE, SPACE = "⏎", "␣"


def _invisible(c: str) -> bool:
    """A control or format character (C0/C1 controls, ESC, bidi overrides, zero-width marks) or a line/paragraph
    separator: it would act on a terminal or a page instead of showing."""
    return unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")


def _escaped(c: str) -> str:
    return f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"


def visible_controls(s: str) -> str:
    """`s` with every control or format character written as `\\xNN` / `\\uNNNN` (nothing else changed)."""
    return "".join(_escaped(c) if _invisible(c) else c for c in s)


#: Characters with a meaning in Markdown or HTML (links, images, tags, entities, emphasis, code, tables, math,
#: strikethrough); CommonMark lets a backslash escape any ASCII punctuation.
_MARKDOWN_SPECIAL = set("\\`*_[]<>&!|~$")


def markdown_text(s) -> str:
    """`s` (any value; its `str`) as Markdown that renders as that text: control characters made visible
    (`visible_controls`), then each Markdown/HTML special character backslash-escaped. The one escaping of data
    into report.md (and through it report.html)."""
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in visible_controls(str(s)))


def html_text(s) -> str:
    """`s` as HTML that shows that text: control characters made visible, `& < > " '` as entities. For token labels
    handed to CircuitsVis, whose components set a token's text as HTML (`dangerouslySetInnerHTML`)."""
    import html

    return html.escape(visible_controls(str(s)), quote=True)


def figure_text(s: str) -> str:
    """A label that matplotlib draws as plain text: `$` escaped (two would parse as mathtext, and `$a^{$` fails)."""
    return str(s).replace("$", "\\$")


def token_label(s: str, max_len: int = 12) -> str:
    """A token's text with its whitespace made visible (runs of 4 or more spaces as `␣×n`), control characters
    escaped, and at most `max_len` characters (longer ones end in `…`)."""
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == " ":
            j = i
            while j < len(s) and s[j] == " ":
                j += 1
            n = j - i
            out.append(SPACE * n if n < 4 else f"{SPACE}×{n}")
            i = j
            continue
        if c == "\n":
            out.append(NEWLINE)
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif _invisible(c):
            out.append(_escaped(c))
        else:
            out.append(c)
        i += 1
    text = "".join(out) or "∅"
    return text if len(text) <= max_len else text[: max_len - 1] + "…"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (printable bytes as themselves, the rest shifted to U+0100…), inverted:
    the table byte-level BPE tokenizers (`tokenizers.pre_tokenizers.ByteLevel`) store their pieces in."""
    from models.data.tokenizer import byte_level_unicode

    return {ch: b for b, ch in byte_level_unicode().items()}


def _raw_bytes(tok, i: int) -> bytes | None:
    """The bytes of token `i` when the tokenizer can say (byte-level BPE or raw bytes), else None."""
    inner = getattr(tok, "tok", None)
    if inner is not None and hasattr(inner, "id_to_token"):
        piece = inner.id_to_token(int(i))
        dec = _byte_decoder()
        if piece is not None and all(ch in dec for ch in piece):
            return bytes(dec[ch] for ch in piece)
    if getattr(tok, "kind", None) == "bytes" and 0 <= int(i) < 256:
        return bytes([int(i)])
    return None


def token_labels(model, ids, max_len: int = 12) -> list[str]:
    """`token_label` of each id's decoding with `model.tokenizer` (`#id` without one); a token that decodes to
    U+FFFD (part of a UTF-8 character) is shown as its bytes, `<0xE2>`; an id the tokenizer lacks (the model's
    vocabulary is larger) as `<id N>` (`models.arch.tokens.unknown_id_text`)."""
    from models.arch.tokens import unknown_id_text

    tok = getattr(model, "tokenizer", None)
    n_known = getattr(tok, "vocab_size", None)
    out = []
    for i in (int(x) for x in ids):
        if tok is None:
            out.append(f"#{i}")
            continue
        if isinstance(n_known, int) and not 0 <= i < n_known:
            out.append(unknown_id_text(i))
            continue
        try:
            s = tok.decode([i])
        except Exception:  # a tokenizer that cannot decode one id
            out.append(f"#{i}")
            continue
        raw = _raw_bytes(tok, i) if "\ufffd" in s else None
        out.append("".join(f"<0x{b:02X}>" for b in raw) if raw else token_label(s, max_len))
    return out
