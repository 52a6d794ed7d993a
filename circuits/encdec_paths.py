"""Path expansion of an attention-only encoder–decoder model's logits, attention patterns frozen.

Elhage et al. (2021), §"Path expansion of logits", extended to cross-attention as the seed note
(`shared/seeds/002_76b955394c28d955.txt`) writes it: a decoder layer's cross-attention adds
`Σ_h A_cross^h ⊗ W_OV^h` applied to the encoder's output, so with every pattern (encoder self-attention, decoder
self-attention, cross-attention) and every norm denominator taken from the real forward pass the logits are a sum of
terms, one per path. A term starting in the source (token or position) passes some encoder heads, exactly one
cross-attention head (the only way into the decoder), then decoder self-attention heads of later layers; a term
starting in the target passes decoder self-attention heads only. Each layer's step is `circuits.paths.head_outputs`,
the decoder-only expansion's own.

Term names: heads later first, joined by "∘": `E{l}H{h}` an encoder self-attention head, `D{l}H{h}` a decoder
self-attention head, `C{l}H{h}` a cross-attention head ("C0H1∘E0H0[src]": source tokens through encoder head
E0H0, then cross-attention head C0H1); "direct" for the empty path; the source in brackets: none for target tokens,
"[pos]" target positions, "[src]" source tokens, "[src pos]" source positions (positions added to the residual
stream: standard, sinusoidal), "[bias]" every constant (biases, LayerNorm biases, `b_U` in "direct[bias]").
The result is a `circuits.PathExpansion` (`terms`, `total()`, `reconstruction_error`).
"""

from __future__ import annotations

import torch

from models.errors import ConfigError

from .checks import check_int
from .cross_attention import check_encoder_decoder
from .interface import PARAMETER_FREE, NormParams
from .paths import PathExpansion, head_outputs

SOURCES = ("tok", "pos", "src", "src_pos", "bias")
_SUFFIX = {"tok": "", "pos": "[pos]", "src": "[src]", "src_pos": "[src pos]", "bias": "[bias]"}


def encdec_term_name(path: tuple[str, ...], source: str) -> str:
    """Name of the term for `path` (head labels, earliest first) from `source` (module docstring)."""
    return ("∘".join(reversed(path)) if path else "direct") + _SUFFIX[source]


def _norm(module) -> NormParams:
    kind = getattr(module, "kind", None)
    kind = PARAMETER_FREE.get(kind, kind)  # parameter-free: the same centring and scale
    w, b = getattr(module, "w", None), getattr(module, "b", None)
    return NormParams(kind, None if w is None else w.detach(), None if b is None else b.detach(),
                      float(getattr(module, "eps", 1e-5)))


def _layer(state: dict, max_order: int, norm: NormParams | None, resid: torch.Tensor | None, A: torch.Tensor,
           W: dict, l: int, bias: bool, tag: str) -> dict:
    """Head outputs of attention layer `l` (weights `W`: prefix_W_V etc.) on `state`, values through the frozen
    `norm` of `resid` (None: the values are read as they are, as cross-attention reads the encoder's output)."""
    scale = norm.scale(resid) if norm is not None and norm.kind else None
    const = None
    if bias:
        const = W["b_V"][l]
        if norm is not None and norm.b is not None:
            const = const + torch.einsum("d,hde->he", norm.b, W["W_V"][l])
    value_input = (lambda x: x) if norm is None else (lambda x: norm.linear(x, scale))
    return head_outputs(state, max_order, value_input, A, W["W_V"][l], W["W_O"][l], const, lambda h: f"{tag}{l}H{h}")


def encdec_path_expansion(model, src, tgt, src_mask=None, tgt_mask=None,
                          max_order: int | None = None) -> PathExpansion:
    """Every path term of an attention-only, pre-norm (or norm-free) encoder–decoder model's logits on
    `(src, tgt)` (masks as for `model.forward`), attention patterns and norm scales frozen from the real forward
    pass (module docstring). Terms with at most `max_order` heads are kept (default: all); with all kept,
    `total()` equals the model's logits up to rounding. Computed in the model's dtype."""
    check_encoder_decoder(model, "encdec_path_expansion")
    c = model.cfg
    if not c.attn_only:
        raise ConfigError("path expansion needs an attention-only model (d_mlp=None); this model has MLPs")
    if c.normalization_type is not None and c.normalization_position != "pre":
        raise ConfigError("path expansion needs pre-norm blocks (normalization_position='pre') or no norms: a "
                          "post-norm rescales every path by the whole residual after each sublayer")
    max_order = 1 << 30 if max_order is None else check_int(max_order, "max_order", low=0)
    src, src_mask = model.validate_src(src, src_mask)
    tgt, tgt_mask = model.validate_tgt(tgt, tgt_mask)
    Le, Ld = c.n_encoder_layers, c.n_decoder_layers
    names = ({f"encoder.{l}.attn.hook_pattern" for l in range(Le)} | {f"encoder.{l}.hook_resid_pre" for l in range(Le)}
             | {f"decoder.{l}.{m}" for l in range(Ld) for m in ("attn.hook_pattern", "cross_attn.hook_pattern",
                                                                 "hook_resid_pre", "hook_resid_mid")}
             | {f"encoder.{Le - 1}.hook_resid_post", f"decoder.{Ld - 1}.hook_resid_post"})
    with torch.no_grad():
        logits, cache = model.run_with_cache(src, tgt, src_mask, tgt_mask, names_filter=lambda n: n in names,
                                             return_cache_object=False)
        W = {s: {n: getattr(model, f"{s}_{n}").detach() for n in ("W_V", "W_O", "b_V", "b_O")}
             for s in ("enc", "dec", "cross")}
        bias = any(bool(torch.any(t != 0)) for t in [model.b_U.detach()] + [w[n] for w in W.values()
                                                                             for n in ("b_V", "b_O")])
        bias = bias or c.normalization_type == "LN"
        patterns = []

        def start(tokens, embed, which, tok, pos):
            scheme = (c.encoder_cfg if which == "src" else c.decoder_cfg).positions
            x = embed.detach()[tokens]
            state = {((), tok): x}
            if scheme.table and scheme.adds_to == "residual":
                rows = scheme.rows(getattr(model, f"W_pos_{which}").detach(), tokens.shape[1])
                state[((), pos)] = rows.expand_as(x)
            if bias:
                state[((), "bias")] = torch.zeros_like(x)
            return state

        enc = start(src, model.W_E_src, "src", "src", "src_pos")
        for l in range(Le):
            A = cache[f"encoder.{l}.attn.hook_pattern"].to(logits.dtype)
            patterns.append(A)
            new = _layer(enc, max_order, _norm(model.encoder[l].ln1), cache[f"encoder.{l}.hook_resid_pre"], A,
                         W["enc"], l, bias, "E")
            if bias:
                enc[((), "bias")] = enc[((), "bias")] + W["enc"]["b_O"][l]
            enc.update(new)
        final = _norm(model.encoder_ln_final)
        fscale = final.scale(cache[f"encoder.{Le - 1}.hook_resid_post"]) if final.kind else None
        memory = {k: final.linear(v, fscale) for k, v in enc.items()}
        if bias and final.b is not None:
            memory[((), "bias")] = memory[((), "bias")] + final.b
        dec = start(tgt, model.W_E_tgt, "tgt", "tok", "pos")
        for l in range(Ld):
            block = model.decoder[l]
            A = cache[f"decoder.{l}.attn.hook_pattern"].to(logits.dtype)
            new = _layer(dec, max_order, _norm(block.ln1), cache[f"decoder.{l}.hook_resid_pre"], A, W["dec"], l,
                         bias, "D")
            if bias:
                dec[((), "bias")] = dec[((), "bias")] + W["dec"]["b_O"][l]
            dec.update(new)
            A_cross = cache[f"decoder.{l}.cross_attn.hook_pattern"].to(logits.dtype)
            patterns += [A, A_cross]
            new = _layer(memory, max_order, None, None, A_cross, W["cross"], l, bias, "C")
            if bias:
                dec[((), "bias")] = dec[((), "bias")] + W["cross"]["b_O"][l]
            dec.update(new)
        final = _norm(model.decoder_ln_final)
        fscale = final.scale(cache[f"decoder.{Ld - 1}.hook_resid_post"]) if final.kind else None
        streams, orders, sources = {}, {}, {}
        for path, s in sorted(dec, key=lambda k: (len(k[0]), SOURCES.index(k[1]), k[0])):
            x = final.linear(dec[(path, s)], fscale)
            if s == "bias" and not path and final.b is not None:
                x = x + final.b
            name = encdec_term_name(path, s)
            streams[name], orders[name], sources[name] = x, len(path), s
    return PathExpansion(streams, orders, sources, model.W_U.detach(), model.b_U.detach(), logits.detach(),
                         patterns, max_order)
