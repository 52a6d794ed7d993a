"""Readable token labels for figures and interactive views: whitespace as visible marks, partial UTF-8 as bytes.

`token_label("\\n        ")` is `"⏎␣×8"`, `token_label(" self")` is `"␣self"`, a tab is the two characters `\\t`, other
control characters are `\\xNN`; `token_labels(model, ids)` does it for token ids, writing a byte-level token that
is only part of a UTF-8 character (which decodes to U+FFFD) as its byte, `<0xE2>`, instead of a stray glyph.
"""

from __future__ import annotations

from functools import lru_cache

#: Visible stand-ins: newline ⏎ (U+23CE), space ␣ (U+2423); both are in matplotlib's default DejaVu Sans.
NEWLINE, SPACE = "⏎", "␣"


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
        elif ord(c) < 32 or ord(c) == 127:
            out.append(f"\\x{ord(c):02x}")
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
    U+FFFD (part of a UTF-8 character) is shown as its bytes, `<0xE2>`."""
    tok = getattr(model, "tokenizer", None)
    out = []
    for i in (int(x) for x in ids):
        if tok is None:
            out.append(f"#{i}")
            continue
        try:
            s = tok.decode([i])
        except Exception:  # a tokenizer that cannot decode one id
            out.append(f"#{i}")
            continue
        raw = _raw_bytes(tok, i) if "\ufffd" in s else None
        out.append("".join(f"<0x{b:02X}>" for b in raw) if raw else token_label(s, max_len))
    return out
