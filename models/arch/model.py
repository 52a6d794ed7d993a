"""`HookedTransformer`: a small, hookable decoder (or encoder) transformer for circuit analysis.

Built on TransformerLens' `HookedRootModule` / `HookPoint`, so `run_with_hooks`, `hooks()`, `reset_hooks`
and `ActivationCache` work as they did with TransformerLens' former `HookedTransformer`.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ..generation.generate import beam_search as beam_search_of
from ..generation.generate import generate as generate_from
from . import weight_processing
from .attention import soft_cap
from .components import BlockInputs, Embed, PosEmbed, TransformerBlock, Unembed, final_norm
from .config import HookedTransformerConfig
from .hook_switches import HookSwitches
from .initialization import (
    TL_INIT_MODES,
    init_weights_gpt2_scaled,
    init_weights_transformer_lens,
    seed_everywhere,
    zero_weights,
)
from .inputs import check_tokens
from .persist import save as save_folder
from .sae_interface import SAEInterface
from .score_bias import attention_mask as attention_mask_of
from .score_bias import combine
from .tl_compat import ActivationCache, FactoredMatrix, HookedRootModule, HookPoint
from .tokens import TextMixin, int_ids  # noqa: F401  (int_ids: re-exported)
from .watch import decide, forced, watched

IGNORE = -100  # F.cross_entropy's ignore_index

RETURN_TYPES = ("logits", "loss", "both", None)


def head_label(layer: int, head: int) -> str:
    """`"L{layer}H{head}"`, the name of a head everywhere in this toolkit (ARENA writes `layer.head`)."""
    return f"L{layer}H{head}"


class HookedTransformer(TextMixin, HookSwitches, SAEInterface, HookedRootModule):
    """A transformer whose every activation is a named `HookPoint` (names as in TransformerLens).

    `forward(tokens)` takes int64 `[batch, pos]` (or `[pos]`) token ids, or text when a tokenizer is
    attached. Weight properties (`W_E, W_pos, W_Q, …, QK, OV`) are stacked over layers in TransformerLens'
    layout (`W_Q [n_layers, n_heads, d_model, d_head]`, `W_O [n_layers, n_heads, d_head, d_model]`); with
    grouped-query attention `W_K, W_V, b_K, b_V` are expanded to `n_heads`.
    """

    _in_run_with_cache = False  # set while `run_with_cache` runs: the hooked path (`models.arch.watch.forced`)

    def __init__(self, cfg: HookedTransformerConfig | dict, tokenizer=None):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = HookedTransformerConfig.from_dict(cfg)
        self.cfg = cfg
        self.tokenizer = tokenizer
        if cfg.use_hook_tokens:
            self.hook_tokens = HookPoint()  # [batch, pos], int64 ids
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if cfg.positions.table:
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([TransformerBlock(cfg, l) for l in range(cfg.n_layers)])
        self.ln_final = final_norm(cfg)
        self.unembed = Unembed(cfg)
        if cfg.seed is not None and cfg.init_mode in TL_INIT_MODES:
            seed_everywhere(cfg.seed)  # TransformerLens 2.18's config seeds torch, random and numpy
        if cfg.init_weights:
            self.init_weights()
        else:
            zero_weights(self)
        self.to(cfg.device)
        self.setup()

    # ------------------------------------------------------------------------------------------------
    def init_weights(self) -> None:
        """Draw the weights as `cfg.init_mode` says (`models.arch.initialization`): TransformerLens 2.18's modes
        bitwise as 2.18 draws them (reseeding torch's global generator with `cfg.seed` when set), or "gpt2_scaled"."""
        if self.cfg.init_mode in TL_INIT_MODES:
            init_weights_transformer_lens(self)
        else:
            init_weights_gpt2_scaled(self, self.cfg.init_range, self.cfg.n_layers, self.cfg.seed)

    def forward(self, input=None, return_type: str | None = "logits", loss_per_token: bool = False,
                prepend_bos: bool | None = None, padding_side: str | None = None, start_at_layer: int | None = None,
                tokens: torch.Tensor | None = None, shortformer_pos_embed: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, stop_at_layer: int | None = None, past_kv_cache=None):
        """Run the model (TransformerLens 2.x's arguments). Returns logits `[batch, pos, d_vocab]`, the mean
        next-token loss (or per-token `[batch, pos-1]` with `loss_per_token`), both as a tuple, or None.

        `input`: token ids `[batch, pos]` / `[pos]` or text (`prepend_bos`, `padding_side` apply to text), or, with
        `start_at_layer`, the residual stream `[batch, pos, d_model]` entering that block (then `tokens` is needed
        for a loss, and `shortformer_pos_embed` / `attention_mask` come from `input_to_embed`). `stop_at_layer=l`
        returns the residual stream entering block l (negative: counted from the end). `attention_mask [batch, pos]`:
        1 for real tokens, 0 for padding (masked keys, zero positions, no loss). `past_kv_cache`: a
        `HookedTransformerKeyValueCache`; the input is the positions after those it holds."""
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type={return_type!r} is not supported; allowed: {RETURN_TYPES}")
        hooked = decide(self)  # one decision for every layer: hooked path or fast path (models.arch.watch)
        if input is None and start_at_layer is None:
            input, tokens = tokens, None  # forward(tokens=...) as before
        if start_at_layer is None:
            resid, tokens, pos_qk, attention_mask = self.input_to_embed(
                input, prepend_bos, padding_side, attention_mask, past_kv_cache)
        else:
            if not isinstance(input, torch.Tensor) or input.ndim != 3:
                raise ValueError("with start_at_layer, input must be the residual stream [batch, pos, d_model]")
            resid, pos_qk = input, shortformer_pos_embed
            if tokens is not None:
                tokens = self.validate_tokens(tokens)
        if attention_mask is not None:
            n_past = attention_mask.shape[1] - resid.shape[1]
        else:
            n_past = past_kv_cache.n_past if past_kv_cache is not None else 0
        side = self._block_inputs(resid, pos_qk, attention_mask, n_past, hooked)
        for i in range(self.cfg.n_layers)[slice(start_at_layer, stop_at_layer)]:
            entry = None if past_kv_cache is None else past_kv_cache[i]
            resid = self.blocks[i](resid, side if entry is None else replace(side, cache=entry))
        if stop_at_layer is not None:
            return resid
        logits = self.head(resid, hooked)  # [batch, pos, d_vocab_out], soft-capped with output_logits_soft_cap
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if tokens is None:
            raise ValueError("a loss needs the tokens: pass tokens= with start_at_layer")
        mask = None if attention_mask is None else attention_mask[:, -tokens.shape[1]:]
        loss = lm_cross_entropy(logits, tokens, per_token=loss_per_token, attention_mask=mask)
        return loss if return_type == "loss" else (logits, loss)

    def loss_fn(self, logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                per_token: bool = False) -> torch.Tensor:
        """TransformerLens 2.x's `loss_fn`: the next-token cross-entropy of `logits` on `tokens`
        (`lm_cross_entropy`; `attention_mask` and `per_token` as there)."""
        tokens = torch.as_tensor(tokens).to(logits.device)
        if logits.ndim == 2:  # one sequence `[pos, vocab]`, as TransformerLens 2.x's loss reads it
            loss = self.loss_fn(logits[None], tokens.reshape(1, -1), attention_mask, per_token)
            return loss[0] if per_token else loss
        if tokens.ndim == 1:
            tokens = tokens[None]
        return lm_cross_entropy(logits, tokens, per_token=per_token, attention_mask=attention_mask)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """`nn.Module.load_state_dict`, also taking a TransformerLens 2.x state dict as saved: the buffers 2.x keeps
        and we recompute (`blocks.*.attn.mask`, `IGNORE`, `rotary_sin`, `rotary_cos`) are checked against this
        model's own and dropped (`models.arch.state_dict.drop_recomputed_buffers`: `CheckpointError` naming one that
        differs), and its `attn._W_K`-style names read as ours. Every other name, shape and missing key is checked as
        `nn.Module` checks it (`strict`)."""
        from .state_dict import drop_recomputed_buffers

        return super().load_state_dict(drop_recomputed_buffers(self, state_dict), strict=strict, assign=assign)

    def head(self, resid: torch.Tensor, hooked: bool | None = None) -> torch.Tensor:
        """Logits `[batch, pos, d_vocab_out]` from the last residual stream: `unembed(ln_final(resid))`, soft-capped
        with `cfg.output_logits_soft_cap` (`soft_cap`)."""
        return soft_cap(self.unembed(self.ln_final(resid, hooked)), self.cfg.output_logits_soft_cap)

    def input_to_embed(self, input, prepend_bos: bool | None = None, padding_side: str | None = None,
                       attention_mask: torch.Tensor | None = None, past_kv_cache=None):
        """Text or ids to `(residual, tokens, shortformer_pos_embed, attention_mask)` as TransformerLens 2.x: the
        residual stream entering block 0, the ids, the positions added to queries and keys only (Shortformer) or
        None, and the attention mask of every position (cached ones included), None when nothing is masked and
        there is no cache. Without a mask, left-padded text (`padding_side="left"`) and cached runs derive one from
        the pad id (`models.arch.padding.infer_attention_mask`)."""
        from .padding import infer_attention_mask, padding_side_of

        if isinstance(input, str) or (isinstance(input, list) and input and isinstance(input[0], str)):
            input = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side, truncate="last")
        tokens = self.validate_tokens(input)  # [batch, pos]
        if self.cfg.use_hook_tokens:
            tokens = self.hook_tokens(tokens)
        B, P = tokens.shape
        if attention_mask is None and (past_kv_cache is not None or padding_side_of(self, padding_side) == "left"):
            attention_mask = infer_attention_mask(self, tokens, prepend_bos, padding_side)
        if attention_mask is not None:
            attention_mask = torch.as_tensor(attention_mask, device=tokens.device)
            if attention_mask.shape != tokens.shape:
                raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, the tokens "
                                 f"{tuple(tokens.shape)}")
            if past_kv_cache is not None:
                attention_mask = past_kv_cache.append_attention_mask(attention_mask)
        n_past = 0 if attention_mask is None else attention_mask.shape[1] - P
        resid, pos_qk = self.get_residual(self.hook_embed(self.embed(tokens)), n_past, attention_mask=attention_mask)
        return resid, tokens, pos_qk, attention_mask

    def get_residual(self, embed: torch.Tensor, pos_offset: int = 0, prepend_bos=None, attention_mask=None,
                     tokens=None, return_shortformer_pos_embed: bool = True):
        """TransformerLens 2.x's `get_residual`: token embeddings `[batch, pos, d_model]` of positions `pos_offset…`
        (the first after a key/value cache of that length) with their positions: `(residual, shortformer_pos_embed)`,
        or the residual alone with `return_shortformer_pos_embed=False`. A positional table's rows pass
        `hook_pos_embed` and are added to the residual stream or, for Shortformer, returned for the query/key inputs
        (None otherwise). `attention_mask [batch, pos_offset + pos]`: positions count real tokens only and padding
        gets none. `prepend_bos` and `tokens` are unused, as in TransformerLens (which reads only their shape)."""
        resid, pos_qk = embed, None
        positions = self.cfg.positions
        if not positions.table:
            return (resid, pos_qk) if return_shortformer_pos_embed else resid
        # PosEmbed reads only the [batch, pos] shape of its first argument
        rows = self.pos_embed(embed[..., 0], pos_offset, attention_mask)
        if watched(self.hook_pos_embed) and rows._base is not None:  # a view of W_pos: watchers get a copy
            rows = rows.clone()
        pos = self.hook_pos_embed(rows)  # [batch, pos, d_model]
        if positions.adds_to == "residual":
            resid = embed + pos
        else:  # "query_key": the query/key inputs only, the residual stream carries no position
            pos_qk = pos
        return (resid, pos_qk) if return_shortformer_pos_embed else resid

    def _block_inputs(self, resid: torch.Tensor, pos_qk, attention_mask, n_past: int,
                      hooked: bool | None = None) -> BlockInputs:
        """What every block reads besides the residual stream: the score bias (attention mask, positional bias,
        padding), the Shortformer positions, the rotation of `n_past + pos` positions and the path decision."""
        from .score_bias import Padding

        padding = Padding(attention_mask) if attention_mask is not None and not bool(attention_mask.all()) else None
        positions = self.cfg.positions
        return BlockInputs(combine(attention_mask_of(self.cfg), positions.score_bias(), padding), pos_qk,
                           positions.rotation(n_past + resid.shape[1], resid.dtype, resid.device), hooked=hooked)

    def validate_tokens(self, tokens, check_length: bool = True) -> torch.Tensor:
        """Coerce input to an int64 `[batch, pos]` tensor on the model's device, or raise `ValueError` (`InputError`
        from `models.arch.inputs.check_tokens` for shape, dtype, range and length, shared with the encoder–decoder).
        `check_length=False` lets ids run past a learned positional table (generation slides a window over them)."""
        if isinstance(tokens, (str, list)) and (isinstance(tokens, str) or (tokens and isinstance(tokens[0], str))):
            tokens = self.to_tokens(tokens, truncate="last")  # then validated (the tokenizer may exceed d_vocab)
        if hasattr(tokens, "__array__") and not isinstance(tokens, torch.Tensor):  # numpy arrays and memmaps
            import numpy as np

            arr = np.asarray(tokens)
            if arr.dtype.kind not in "iufcb":
                raise ValueError(f"tokens must be integer ids, got a numpy array of dtype {arr.dtype}")
            tokens = torch.from_numpy(arr.astype(np.int64) if arr.dtype.kind in "iu" else arr)  # floats: refused below
        if isinstance(tokens, (list, tuple)):
            try:
                tokens = torch.tensor(tokens)
            except (TypeError, ValueError) as e:
                raise ValueError(f"tokens must be a rectangular list of ints: {e}") from None
        if not isinstance(tokens, torch.Tensor):
            raise ValueError(f"tokens must be an int64 tensor [batch, pos], got {type(tokens).__name__}")
        limit = self.cfg.positions.max_context if check_length else None
        return check_tokens(tokens, "tokens", self.cfg.d_vocab, limit, self.W_E.device,
                            self.cfg.positional_embedding_type)

    def run_with_cache(self, *args, return_cache_object: bool = True, **kwargs):
        """`HookedRootModule.run_with_cache`, returning a TransformerLens `ActivationCache`."""
        with forced(self):  # the hooked path whatever names are cached (models.arch.watch)
            out, cache = super().run_with_cache(*args, **kwargs)
        if return_cache_object:
            cache = ActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))
            # shortformer: hook_pos_embed is cached but never enters the residual stream, so
            # decompose_resid must not count it as a component
            cache.has_pos_embed = cache.has_pos_embed and self.cfg.positions.adds_to == "residual"
        return out, cache

    # --- weights, stacked over layers -----------------------------------------------------------------
    def _stack(self, get) -> torch.Tensor:
        if not self.blocks:
            raise AttributeError("a 0-layer model has no attention or MLP weights")
        return torch.stack([get(b) for b in self.blocks])

    def _kv(self, t: torch.Tensor) -> torch.Tensor:  # expand kv heads to query heads (GQA)
        return t.repeat_interleave(self.cfg.n_heads // self.cfg.n_key_value_heads, dim=1)

    @property
    def W_E(self) -> torch.Tensor:  # [d_vocab, d_model]
        return self.embed.W_E

    @property
    def W_pos(self) -> torch.Tensor:  # [n_ctx, d_model]
        if not hasattr(self, "pos_embed"):
            raise AttributeError(
                f"positional_embedding_type={self.cfg.positional_embedding_type!r} has no W_pos table"
            )
        return self.pos_embed.W_pos

    @property
    def W_E_pos(self) -> torch.Tensor:  # [d_vocab + n_ctx, d_model]: tokens then positions, as TransformerLens
        return torch.cat([self.W_E, self.W_pos], dim=0)

    @property
    def W_U(self) -> torch.Tensor:  # [d_model, d_vocab]
        return self.unembed.W_U

    @property
    def b_U(self) -> torch.Tensor:
        return self.unembed.b_U

    W_Q = property(lambda self: self._stack(lambda b: b.attn.W_Q))  # [layer, head, d_model, d_head]
    W_K = property(lambda self: self._kv(self._stack(lambda b: b.attn.W_K)))
    W_V = property(lambda self: self._kv(self._stack(lambda b: b.attn.W_V)))
    W_O = property(lambda self: self._stack(lambda b: b.attn.W_O))  # [layer, head, d_head, d_model]
    b_Q = property(lambda self: self._stack(lambda b: b.attn.b_Q))  # [layer, head, d_head]
    b_K = property(lambda self: self._kv(self._stack(lambda b: b.attn.b_K)))
    b_V = property(lambda self: self._kv(self._stack(lambda b: b.attn.b_V)))
    b_O = property(lambda self: self._stack(lambda b: b.attn.b_O))  # [layer, d_model]
    W_in = property(lambda self: self._stack(lambda b: b.mlp.W_in))  # [layer, d_model, d_mlp]
    b_in = property(lambda self: self._stack(lambda b: b.mlp.b_in))
    W_out = property(lambda self: self._stack(lambda b: b.mlp.W_out))  # [layer, d_mlp, d_model]
    b_out = property(lambda self: self._stack(lambda b: b.mlp.b_out))

    @property
    def QK(self) -> FactoredMatrix:  # [layer, head, d_model, d_model] = W_Q W_Kᵀ
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:  # [layer, head, d_model, d_model] = W_V W_O
        return FactoredMatrix(self.W_V, self.W_O)

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """Sum of the biases written to the residual stream before block `layer` (b_O, and b_out unless
        `include_mlp_biases=False`); with `mlp_input`, also block `layer`'s b_O. `[d_model]`."""
        acc = torch.zeros(self.cfg.d_model, dtype=self.W_E.dtype, device=self.W_E.device)
        for block in self.blocks[:layer]:
            acc = acc + block.attn.b_O
            if include_mlp_biases and not self.cfg.attn_only:
                acc = acc + block.mlp.b_out
        if mlp_input:
            if layer >= self.cfg.n_layers:
                raise ValueError(f"mlp_input needs layer < n_layers={self.cfg.n_layers}, got {layer}")
            acc = acc + self.blocks[layer].attn.b_O
        return acc

    def tokens_to_residual_directions(self, tokens) -> torch.Tensor:
        """Unembedding directions W_U[:, t] of token(s) t: `[d_model]` for one token (a string, an int or a one-element
        tensor of any shape), `[..., d_model]` otherwise."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = tokens if isinstance(tokens, int) else torch.as_tensor(tokens, device=self.W_U.device)
        if isinstance(tokens, int) or tokens.numel() == 1:  # one token, in any shape: [d_model], as TransformerLens
            return self.W_U[:, int(tokens)]
        return self.W_U[:, tokens].movedim(0, -1)

    def all_head_labels(self) -> list[str]:
        return [head_label(l, h) for l in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]

    # --- weight processing, generation, persistence: each a function of the model, in its own module -----------
    def process_weights_(self, fold_ln: bool = True, center_writing_weights: bool = True, center_unembed: bool = True,
                         fold_value_biases: bool = True, refactor_factored_attn_matrices: bool = False):
        """Fold the norms into the weights that read them (then LN → LNPre, RMS → RMSPre), centre the weights that
        write to the residual stream and the unembedding, fold value biases into b_O and optionally re-factor QK / OV
        evenly, in place, as TransformerLens 2.18 (`models.arch.weight_processing.process_weights_`). Outputs are
        unchanged up to float error (logits up to a per-position constant with `center_unembed`);
        `WeightProcessingError` names a step that TransformerLens refuses or that would change them. Returns the
        model."""
        return weight_processing.process_weights_(self, fold_ln, center_writing_weights, center_unembed,
                                                  fold_value_biases, refactor_factored_attn_matrices)

    def load_and_process_state_dict(self, state_dict: dict, fold_ln: bool = True, center_writing_weights: bool = True,
                                    center_unembed: bool = True, fold_value_biases: bool = True,
                                    refactor_factored_attn_matrices: bool = False):
        """TransformerLens 2.18's `load_and_process_state_dict`
        (`models.arch.weight_processing.load_and_process_state_dict`). Returns the model."""
        return weight_processing.load_and_process_state_dict(
            self, state_dict, fold_ln, center_writing_weights, center_unembed, fold_value_biases,
            refactor_factored_attn_matrices)

    def generate(self, input=None, max_new_tokens: int = 20, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, tokens=None, **kw):
        """`models.generation.generate.generate` (TransformerLens 2.x's arguments; `tokens=` is `input=`)."""
        return generate_from(self, tokens if input is None else input, max_new_tokens, temperature, top_k, top_p,
                             seed, **kw)

    def beam_search(self, tokens, beams: int = 4, max_new_tokens: int = 20):
        """`models.generation.generate.beam_search`."""
        return beam_search_of(self, tokens, beams, max_new_tokens)

    def save(self, path) -> None:
        """`models.save(self, path)` (`models.arch.persist.save`)."""
        save_folder(self, path)

    @property
    def device(self) -> torch.device:
        return self.W_E.device


def lm_cross_entropy(logits: torch.Tensor, tokens: torch.Tensor, per_token: bool = False,
                     label_smoothing: float = 0.0, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy: −log softmax(logits[:, i])[tokens[:, i+1]], in float32 or wider; optionally
    label-smoothed (Szegedy et al. 2016: the target puts 1−ε on the true token and ε spread uniformly over the
    vocabulary).

    Returns the mean over the `batch × (pos−1)` predictions, or `[batch, pos-1]` with `per_token`. The last
    position has no target: it is ignored (`ignore_index`) rather than sliced off, so the `[batch, pos, vocab]`
    logits are read in place, with no copy in the forward pass and no zero-filled gradient in the backward.
    With `attention_mask [batch, pos]` (TransformerLens 2.x), a prediction counts only where both its position and
    the next are real tokens (1): padding adds nothing to the mean and reads 0 per token."""
    if tokens.shape[1] < 2:
        raise ValueError("a loss needs at least 2 tokens per sequence (it predicts token i+1 from i)")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    target = F.pad(tokens[:, 1:], (0, 1), value=IGNORE)  # [batch, pos]; F.cross_entropy's ignore_index
    if attention_mask is not None:
        real = attention_mask.bool()
        target = target.masked_fill(~F.pad(real[:, :-1] & real[:, 1:], (0, 1), value=False), IGNORE)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE,
                           reduction="none" if per_token else "mean", label_smoothing=label_smoothing)
    return loss.view(tokens.shape)[:, :-1] if per_token else loss
