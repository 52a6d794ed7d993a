"""Reading the residual stream through the unembedding: direct logit attribution and the logit lens.

Both are TransformerLens 4.3's own (`transformer_lens.tools.analysis.direct_logit_attribution` and `logit_lens`,
built on `ActivationCache.decompose_resid`, `stack_head_results`, `accumulated_resid` and `apply_ln_to_stack`).
Added here: norm weights folded first on our models (TransformerLens' attribution projects each component on W_U
with only the final norm's scale applied, which is exact only once the norm's weight and bias live in W_U and b_U;
on a bridge it refuses unless compatibility mode folded them), answers from `patching.metrics`, and one result
holding the lens' top predictions and the probability of each next token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .inputs import PatchingError, prepare, prompt_tokens, single_token

UNITS = {"head": "head", "layer": "component"}


def _readable(model):
    """Our model as TransformerLens' compatibility mode would present it: norm weights folded
    (`circuits.fold_layer_norm`) and value biases folded into b_O (a head's b_V·W_O is the same at every position,
    since attention weights sum to 1, so it moves to the remainder). A copy when anything changes; a bridge is
    returned as it is (TransformerLens checks it itself)."""
    import copy

    from models.arch.config import HookedTransformerConfig

    if not isinstance(model.cfg, HookedTransformerConfig):  # a bridge: its own processing applies
        return model
    from circuits.fold import fold_layer_norm
    from circuits.interface import norms_are_trivial

    m = model if norms_are_trivial(model) else fold_layer_norm(model)
    if any(bool(b.attn.b_V.any()) for b in m.blocks):  # TransformerLens' fold_value_biases (arch.weight_processing)
        m = copy.deepcopy(m) if m is model else m
        m.process_weights_(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=True)
    return m.eval()


def direct_logit_attribution(model, tokens, answer, wrong=None, by: str = "head", pos=-1):
    """Each component's direct contribution to the logit of `answer` (or to logit[answer] − logit[wrong]): its
    output, scaled by the final norm of the run, dotted with W_U[:, answer] (− W_U[:, wrong]) (Elhage et al. 2021's
    direct path; Wang et al. 2022 §3 use it per head). `by="head"`: every head plus a 'remainder' (embeddings,
    biases, MLPs); `by="layer"`: the embeddings and each layer's attention (and MLP) output, which sum to the
    logit (difference) minus b_U. `answer`/`wrong`: one token (id or one-token string) or ids `[batch]`, or
    `[batch, pos]` with `pos=None` (every position). Returns TransformerLens' `DirectLogitAttribution`
    (`attribution [component, batch(, pos)]`, `labels`)."""
    from models.arch.tl_compat import analysis_tool

    prepare(model)
    if by not in UNITS:
        raise PatchingError(f"unknown unit {by!r}; allowed: {', '.join(UNITS)}")
    tokens = prompt_tokens(model, tokens)

    def ids(x, name):
        if isinstance(x, (str, int)):
            return single_token(model, x, name)
        t = torch.as_tensor(x).long()
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= model.cfg.d_vocab):
            raise PatchingError(f"{name} holds ids outside 0..{model.cfg.d_vocab - 1}")
        return t.to(tokens.device)

    answer_ids, wrong_ids = ids(answer, "answer"), None if wrong is None else ids(wrong, "wrong answer")
    tl_dla = analysis_tool("direct_logit_attribution").direct_logit_attribution
    m = _readable(model)
    try:
        _, cache = m.run_with_cache(tokens)
        return tl_dla(m, None, answer_ids, wrong_ids, unit=UNITS[by], pos=pos, cache=cache)
    except (ValueError, IndexError, RuntimeError) as e:
        raise PatchingError(f"direct logit attribution: {e}") from None


@dataclass
class LensResult:
    """The logit lens on one prompt: for each stack entry (`labels`: '0_pre' … 'final_post') and position, the `top`
    predicted ids and their probabilities `[entry, pos, k]`, and `next_prob [entry, pos − 1]`, the probability given
    to the token that actually follows. `tokens [pos]` the prompt's ids; `strings` and `top_strings` their text
    (None without a tokenizer)."""

    labels: list[str]
    tokens: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    next_prob: torch.Tensor
    strings: list[str] | None = None
    top_strings: list | None = None  # [entry][pos][k] decoded top predictions
    final_norm: str | None = None  # the model's final norm type (None: it has none, W_U reads the stream as is)

    def to_dict(self) -> dict:
        return {"labels": self.labels, "tokens": self.tokens.tolist(), "strings": self.strings,
                "top_ids": self.top_ids.tolist(), "top_probs": self.top_probs.tolist(),
                "top_strings": self.top_strings, "next_token_prob": self.next_prob.tolist()}


def logit_lens(model, tokens, top_k: int = 3) -> LensResult:
    """nostalgebraist's logit lens (2020, "interpreting GPT: the logit lens"): the residual stream before each layer
    and after the last, read through the final norm (statistics recomputed, as TransformerLens does) and the
    unembedding, as if the model stopped there. `tokens`: one prompt (ids or text). The last entry is the model's
    own prediction."""
    from models.arch.tl_compat import analysis_tool

    from .activation import token_strings

    prepare(model)
    tokens = prompt_tokens(model, tokens)
    if tokens.shape[0] != 1:
        raise PatchingError(f"the logit lens reads one prompt; got {tokens.shape[0]}")
    if not 1 <= int(top_k) <= model.cfg.d_vocab:
        raise PatchingError(f"top_k must be in 1..{model.cfg.d_vocab}, got {top_k}")
    tl_lens = analysis_tool("logit_lens").logit_lens
    names = [f"blocks.{l}.hook_resid_pre" for l in range(model.cfg.n_layers)]
    names.append(f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        top = tl_lens(cache, positions=None, top_k=int(top_k), return_type="probs")
        following = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)  # the last position has none: dropped below
        nxt = tl_lens(cache, positions=None, targets=following, return_type="probs")
    r = top.readout
    next_prob = nxt.readout.values[:, 0, :-1, 0]
    top_ids = r.top_ids[:, 0].cpu()
    tok = getattr(model, "tokenizer", None)
    words = None if tok is None else [[[tok.decode([i]) for i in row] for row in e] for e in top_ids.tolist()]
    return LensResult(list(top.labels), tokens[0].cpu(), top_ids, r.values[:, 0].float().cpu(),
                      next_prob.float().cpu(), token_strings(model, tokens), words,
                      getattr(model.cfg, "normalization_type", None) or None)
