"""`HookedEncoderDecoder`: the encoder–decoder transformer of Vaswani et al. (2017), hookable, from the decoder-only
model's layers (`models.arch.components`).

The encoder is a stack of `TransformerBlock`s with bidirectional self-attention over the source; the decoder a stack
of `DecoderBlock`s: causal self-attention, then cross-attention (queries from the decoder, keys and values from the
encoder's output, the "memory"; pattern `[batch, head, target, source]`), then the MLP if any. Hook names follow
TransformerLens' encoder–decoder models: `hook_embed_src`, `hook_pos_embed_src`, `encoder.{l}.hook_resid_pre/post`,
`encoder.{l}.attn.hook_q/k/v/z/attn_scores/pattern/result`, `encoder_ln_final`, `hook_embed_tgt`,
`hook_pos_embed_tgt`, `decoder.{l}.hook_resid_pre/mid/mid_cross/post`, `decoder.{l}.attn.hook_*`,
`decoder.{l}.cross_attn.hook_*`, `decoder.{l}.hook_attn_out/cross_attn_out/mlp_out`, `decoder_ln_final`.
Decoder norms: `ln1` (self-attention), `ln2` (cross-attention), `ln3` (MLP), as TransformerLens' T5 block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import HookSwitchError, InputError
from ..generation.seq2seq import generate_seq2seq
from .components import (
    MLP,
    Attention,
    BlockInputs,
    Embed,
    Norm,
    PosEmbed,
    TransformerBlock,
    Unembed,
    add_output,
    attention_inputs,
    final_norm,
    linear,
    norm_inputs,
)
from .encoder_decoder_config import EncoderDecoderConfig
from .hook_switches import HookSwitches
from .initialization import init_weights_gpt2_scaled
from .inputs import check_mask, check_tokens
from .model import RETURN_TYPES, lm_cross_entropy
from .persist import save as save_folder
from .score_bias import Bidirectional, Causal, KeyPadding, combine
from .tl_compat import ActivationCache, FactoredMatrix, HookedRootModule, HookPoint
from .watch import decide, forced


@dataclass
class Memory:
    """What the decoder's cross-attention reads from the encoder. `values [batch, src_pos, d_model]`: the memory (the
    encoder's final residual stream after its final norm); `keys`: the keys' input (the memory, plus the source
    positions under Shortformer). For per-head inputs (`use_split_qkv_input`): `resid`, the encoder's final residual
    stream before `norm` (the encoder's final norm, applied per head after the hook), and `pos`, the source
    positions (Shortformer) or None. Without `resid` (`decode` given a memory alone) the per-head copies are of
    the memory itself, and `norm` is None."""

    values: torch.Tensor
    keys: torch.Tensor
    resid: torch.Tensor | None = None
    norm: nn.Module | None = None
    pos: torch.Tensor | None = None


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder's output, then (with MLPs) an MLP, each a residual
    sublayer normalised before or after its addition (`norm_inputs`, `add_output`). TransformerLens 2.x's opt-in
    hooks, as the decoder-only block's (`cfg.use_split_qkv_input`, `cfg.use_hook_mlp_in`, switched by the model's
    `set_use_*`): `hook_q_input` / `hook_k_input` / `hook_v_input` (the self-attention's per-head inputs),
    `hook_cross_q_input` (the cross-attention's queries, `[batch, pos, head, d_model]`) and `hook_cross_k_input` /
    `hook_cross_v_input` (its keys and values, `[batch, src_pos, head, d_model]`, the encoder's final residual
    stream before its final norm), `hook_mlp_in` (a copy of the MLP's input, before ln3)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.ln1, self.attn = Norm(cfg), Attention(cfg)
        self.ln2, self.cross_attn = Norm(cfg), Attention(cfg)
        for name in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_cross_attn_out",
                     "hook_resid_mid_cross", "hook_resid_post"):
            setattr(self, name, HookPoint())  # [batch, pos, d_model]
        for name in ("hook_q_input", "hook_k_input", "hook_v_input", "hook_cross_q_input", "hook_cross_k_input",
                     "hook_cross_v_input"):
            setattr(self, name, HookPoint())  # [batch, pos | src_pos, head, d_model], with cfg.use_split_qkv_input
        if not cfg.attn_only:
            self.ln3, self.mlp = Norm(cfg), MLP(cfg)
            self.hook_mlp_in = HookPoint()  # [batch, pos, d_model], with cfg.use_hook_mlp_in
            self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]

    def forward(self, resid: torch.Tensor, side: BlockInputs, cross: BlockInputs, memory: Memory,
                cache=None) -> torch.Tensor:
        """`resid [batch, pos, d_model]`; `side`: the self-attention's mask, positions and rotation; `cross`: the
        cross-attention's score bias (source padding) and the queries' positions (`pos_qk`, Shortformer);
        `memory`: the encoder's output (`Memory`); `cache`: the self-attention's key/value cache entry when decoding
        step by step."""
        cfg = self.cfg
        pos, hooked = cfg.normalization_position, side.hooked
        resid = self.hook_resid_pre(resid)
        x_q, x_k, x_v = attention_inputs(self, self.ln1, resid, resid, side.pos_qk, side.pos_qk, hooked)
        out = self.attn(x_q, x_k, x_v, side.score_bias, side.rotation, cache, hooked)
        resid = self.hook_resid_mid(add_output(self.ln1, resid, out, pos, self.hook_attn_out, hooked))
        if cfg.use_split_qkv_input:
            source, norm = (memory.values, _unnormed) if memory.resid is None else (memory.resid, memory.norm)
            x_q, x_k, x_v = attention_inputs(self, self.ln2, resid, source, cross.pos_qk, memory.pos, hooked,
                                             source_norm=norm, prefix="cross_")
        else:
            x_q, _ = norm_inputs(self.ln2, resid, cross.pos_qk, pos, hooked)
            x_k, x_v = memory.keys, memory.values
        out = self.cross_attn(x_q, x_k, x_v, cross.score_bias, hooked=hooked)
        resid = self.hook_resid_mid_cross(add_output(self.ln2, resid, out, pos, self.hook_cross_attn_out, hooked))
        if cfg.attn_only:
            return self.hook_resid_post(resid)
        mlp_in = self.hook_mlp_in(resid.clone()) if cfg.use_hook_mlp_in else resid
        x, _ = norm_inputs(self.ln3, mlp_in, None, pos, hooked)
        return self.hook_resid_post(add_output(self.ln3, resid, self.mlp(x, hooked), pos, self.hook_mlp_out, hooked))


def _unnormed(x: torch.Tensor, hooked: bool | None = None) -> torch.Tensor:
    """The identity, as a norm's call: the memory given to `decode` is normalised already."""
    return x


class TiedUnembed(nn.Module):
    """The unembedding tied to the target embedding (Press & Wolf 2017): logits = x W_Eᵀ + b_U."""

    def __init__(self, cfg, embed: Embed):
        super().__init__()
        self.embed = [embed]  # a list: not a submodule, so W_E is saved once, under the embedding
        b_U = torch.zeros(cfg.d_vocab, dtype=cfg.torch_dtype)
        if cfg.use_bias:
            self.b_U = nn.Parameter(b_U)
        else:
            self.register_buffer("b_U", b_U)

    @property
    def W_U(self) -> torch.Tensor:  # [d_model, d_vocab]
        return self.embed[0].W_E.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.W_U, self.b_U)


class HookedEncoderDecoder(HookSwitches, HookedRootModule):
    """An encoder–decoder transformer whose every activation is a named `HookPoint` (see the module docstring).

    `forward(src, tgt)` takes int64 source ids `[batch, src_pos]` and target ids `[batch, tgt_pos]` (the decoder's
    input: BOS then the target, shifted right) and returns logits `[batch, tgt_pos, d_vocab_tgt]`, position i
    predicting target token i + 1. Masks (`src_mask`, `tgt_mask`, `[batch, pos]`, True/1 at real tokens, padding on
    the right) keep attention off padded positions. Weight properties are stacked over layers in TransformerLens'
    layout: `enc_W_Q [n_encoder_layers, n_heads, d_model, d_head]`, `dec_W_*` (decoder self-attention), `cross_W_*`.
    """

    _in_run_with_cache = False  # set while `run_with_cache` runs: the hooked path (`models.arch.watch`)

    def _switch_configs(self, name: str) -> tuple:
        """TransformerLens 2.x's opt-in hook switches (`set_use_split_qkv_input`, `set_use_hook_mlp_in`,
        `set_use_attn_result`; `models.arch.hook_switches`) act on both stacks' configs, which their blocks read
        (and on this config where it has the field: `use_attn_result`)."""
        return (self.dec_cfg, self.enc_cfg) + ((self.cfg,) if hasattr(self.cfg, name) else ())

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Not served: the decoder blocks have no `hook_attn_in` (use `set_use_split_qkv_input`)."""
        if use_attn_in:
            raise HookSwitchError("use_attn_in is not served by the encoder–decoder; use set_use_split_qkv_input")

    def set_ungroup_grouped_query_attention(self, ungroup_grouped_query_attention: bool) -> None:
        """Not served: the encoder–decoder has one key/value head per query head."""
        if ungroup_grouped_query_attention:
            raise HookSwitchError("the encoder–decoder has no grouped-query attention to ungroup")

    def __init__(self, cfg: EncoderDecoderConfig | dict, tokenizer=None):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = EncoderDecoderConfig.from_dict(cfg)
        self.cfg, self.tokenizer = cfg, tokenizer
        enc, dec = self.enc_cfg, self.dec_cfg = cfg.encoder_cfg, cfg.decoder_cfg
        self.embed_tgt = Embed(dec)
        if not cfg.share_embeddings:
            self.embed_src = Embed(enc)
        self.hook_embed_src, self.hook_embed_tgt = HookPoint(), HookPoint()  # [batch, pos, d_model]
        if enc.positions.table:
            self.pos_embed_src, self.pos_embed_tgt = PosEmbed(enc), PosEmbed(dec)
            self.hook_pos_embed_src, self.hook_pos_embed_tgt = HookPoint(), HookPoint()  # [batch, pos, d_model]
        self.encoder = nn.ModuleList([TransformerBlock(enc) for _ in range(cfg.n_encoder_layers)])
        self.encoder_ln_final = final_norm(enc)
        self.decoder = nn.ModuleList([DecoderBlock(dec) for _ in range(cfg.n_decoder_layers)])
        self.decoder_ln_final = final_norm(dec)
        self.unembed = TiedUnembed(dec, self.embed_tgt) if cfg.tie_embeddings else Unembed(dec)
        init_weights_gpt2_scaled(self, cfg.init_range, cfg.n_encoder_layers + cfg.n_decoder_layers, cfg.seed)
        self.to(cfg.device)
        self.setup()

    # --- forward ------------------------------------------------------------------------------------------------
    def forward(self, src, tgt, src_mask=None, tgt_mask=None, return_type: str | None = "logits",
                loss_per_token: bool = False, label_smoothing: float = 0.0):
        """Logits `[batch, tgt_pos, d_vocab_tgt]`, the mean next-token loss of the target (masked positions left out;
        per token `[batch, tgt_pos - 1]` with `loss_per_token`), both as a tuple, or None."""
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type={return_type!r} is not supported; allowed: {RETURN_TYPES}")
        src, src_mask = self.validate_src(src, src_mask)
        tgt, tgt_mask = self.validate_tgt(tgt, tgt_mask)
        if src.shape[0] != tgt.shape[0]:
            raise InputError(f"src has {src.shape[0]} sequences but tgt has {tgt.shape[0]}; give one target each")
        hooked = decide(self)  # one decision for the encoder and the decoder (models.arch.watch)
        if self.dec_cfg.use_split_qkv_input:  # per-head cross-attention inputs read the encoder before its norm
            memory, memory_resid = self._encode(src, src_mask, hooked, resid_too=True)
        else:
            memory, memory_resid = self._encode(src, src_mask, hooked), None
        logits = self._decode(tgt, memory, src_mask, tgt_mask, hooked=hooked, memory_resid=memory_resid)
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        loss = lm_cross_entropy(logits, tgt, per_token=loss_per_token, label_smoothing=label_smoothing,
                                attention_mask=tgt_mask)
        return loss if return_type == "loss" else (logits, loss)

    def validate_src(self, src, src_mask=None) -> tuple:
        """`(src, src_mask)` as int64 / bool tensors on the model's device, or an `InputError` naming the problem."""
        src = check_tokens(src, "src", self.cfg.d_vocab_src, self.enc_cfg.positions.max_context, self.device)
        return src, check_mask(src_mask, src, "src_mask", first_kept=False)

    def validate_tgt(self, tgt, tgt_mask=None) -> tuple:
        tgt = check_tokens(tgt, "tgt", self.cfg.d_vocab_tgt, self.dec_cfg.positions.max_context, self.device)
        return tgt, check_mask(tgt_mask, tgt, "tgt_mask", first_kept=True)

    def encode(self, src, src_mask=None) -> torch.Tensor:
        """The encoder's output (the memory the decoder attends to), `[batch, src_pos, d_model]`."""
        src, src_mask = self.validate_src(src, src_mask)
        return self._encode(src, src_mask)

    def decode(self, tgt, memory: torch.Tensor, src_mask=None, tgt_mask=None) -> torch.Tensor:
        """Logits `[batch, tgt_pos, d_vocab_tgt]` of the decoder over `memory` (from `encode`)."""
        tgt, tgt_mask = self.validate_tgt(tgt, tgt_mask)
        if src_mask is not None:
            src_mask = check_mask(src_mask, memory[..., 0], "src_mask", first_kept=False)
        return self._decode(tgt, memory, src_mask, tgt_mask)

    def _positions(self, which: str, n_pos: int, batch: int, offset: int = 0) -> torch.Tensor | None:
        """Rows `offset .. offset + n_pos` of the source or target positional table, hooked, or None without one."""
        if not hasattr(self, "pos_embed_src"):
            return None
        rows = getattr(self, f"pos_embed_{which}").rows(offset + n_pos)[offset:]
        return getattr(self, f"hook_pos_embed_{which}")(rows.expand(batch, n_pos, -1))

    def _embed(self, which: str, tokens: torch.Tensor, offset: int = 0) -> tuple:
        """`(resid, pos_qk)`: the embedded tokens (with positions when the scheme adds them to the residual stream)
        and the positions for the queries and keys (Shortformer) or None."""
        embed = self.embed_src if which == "src" and hasattr(self, "embed_src") else self.embed_tgt
        resid = getattr(self, f"hook_embed_{which}")(embed(tokens))  # [batch, pos, d_model]
        pos = self._positions(which, tokens.shape[1], tokens.shape[0], offset)
        if pos is not None and self.cfg.positions.adds_to == "residual":
            return resid + pos, None
        return resid, pos

    def _encode(self, src: torch.Tensor, src_mask: torch.Tensor | None, hooked: bool | None = None,
                resid_too: bool = False):
        """The memory `[batch, src_pos, d_model]`; with `resid_too`, `(memory, the encoder's final residual stream
        before its final norm)`."""
        hooked = decide(self) if hooked is None else hooked  # the hooked path or the fast one (models.arch.watch)
        scheme = self.enc_cfg.positions
        resid, pos_qk = self._embed("src", src)
        bias = combine(KeyPadding(src_mask) if src_mask is not None else None, scheme.score_bias())
        side = BlockInputs(bias, pos_qk, scheme.rotation(src.shape[1], resid.dtype, resid.device), hooked=hooked)
        for block in self.encoder:
            resid = block(resid, side)
        memory = self.encoder_ln_final(resid, hooked)  # [batch, src_pos, d_model]
        return (memory, resid) if resid_too else memory

    def _decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask, tgt_mask, cache=None, offset: int = 0,
                hooked: bool | None = None, memory_resid: torch.Tensor | None = None) -> torch.Tensor:
        """Decoder logits for target tokens at positions `offset ..` (the earlier ones in `cache`, a
        `models.generation.kv_cache.HookedTransformerKeyValueCache` of the self-attention); `hooked`: the forward
        pass's path decision (None: decided here); `memory_resid`: the encoder's final residual stream before its
        norm, which per-head cross-attention inputs read (`Memory`)."""
        hooked = decide(self) if hooked is None else hooked
        scheme = self.dec_cfg.positions
        resid, pos_qk = self._embed("tgt", tgt, offset)
        n_keys = offset + tgt.shape[1]
        bias = combine(Causal(), KeyPadding(tgt_mask) if tgt_mask is not None else None, scheme.score_bias())
        side = BlockInputs(bias, pos_qk, scheme.rotation(n_keys, resid.dtype, resid.device), hooked=hooked)
        cross = BlockInputs(KeyPadding(src_mask) if src_mask is not None else Bidirectional(), pos_qk, hooked=hooked)
        memory_k, src_pos = memory, None
        if pos_qk is not None:  # Shortformer: the keys of cross-attention carry the source positions
            src_pos = self._positions("src", memory.shape[1], memory.shape[0])
            memory_k = memory + src_pos
        mem = Memory(memory, memory_k, memory_resid, None if memory_resid is None else self.encoder_ln_final, src_pos)
        for layer, block in enumerate(self.decoder):
            resid = block(resid, side, cross, mem, None if cache is None else cache[layer])
        return self.unembed(self.decoder_ln_final(resid, hooked))  # [batch, tgt_pos, d_vocab_tgt]

    def run_with_cache(self, *args, return_cache_object: bool = True, **kwargs):
        """`HookedRootModule.run_with_cache`, returning a TransformerLens `ActivationCache`."""
        with forced(self):  # the hooked path whatever names are cached (models.arch.watch)
            out, cache = super().run_with_cache(*args, **kwargs)
        if return_cache_object:
            cache = ActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))
        return out, cache

    # --- text (a `models.data.seq2seq.Seq2SeqTokenizer`: source and target characters) -------------------------------
    def _vocab(self, which: str):
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer attached; pass token ids, or set model.tokenizer")
        return self.tokenizer.source if which == "src" else self.tokenizer.target

    def to_tokens_src(self, text) -> torch.Tensor:
        """Source text (or a list of texts, right-padded with the pad id) to `[batch, src_pos]` ids; see
        `padding_mask` for the mask."""
        return self._ids([self._vocab("src").encode(t) for t in ([text] if isinstance(text, str) else text)])

    def to_tokens_tgt(self, text, prepend_bos: bool = True) -> torch.Tensor:
        """Target text (or a list, right-padded) to `[batch, tgt_pos]` decoder-input ids, BOS first by default."""
        bos = [self.cfg.bos_token_id] if prepend_bos else []
        return self._ids([bos + self._vocab("tgt").encode(t) for t in ([text] if isinstance(text, str) else text)])

    def _ids(self, rows: list[list[int]]) -> torch.Tensor:
        out = torch.full((len(rows), max(len(r) for r in rows)), self.cfg.pad_token_id, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        return out.to(self.device)

    def padding_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """`tokens != pad_token_id` (a source mask; a target's first token, BOS, always counts)."""
        return torch.as_tensor(tokens) != self.cfg.pad_token_id

    def to_string_src(self, tokens):
        return self._strings(tokens, "src")

    def to_string_tgt(self, tokens):
        """Target ids (`[pos]` or `[batch, pos]`) to text (or a list of texts), specials written as `<bos>` etc."""
        return self._strings(tokens, "tgt")

    def _strings(self, tokens, which: str):
        t = torch.as_tensor(tokens)
        vocab = self._vocab(which)
        return [vocab.decode(row.tolist()) for row in t] if t.ndim == 2 else vocab.decode(t.reshape(-1).tolist())

    # --- generation, persistence ----------------------------------------------------------------------------------
    def generate(self, src, max_new_tokens: int = 20, method: str = "greedy", **kw):
        """Decode target sequences for `src` (`models.generation.seq2seq.generate_seq2seq`)."""
        return generate_seq2seq(self, src, max_new_tokens, method, **kw)

    def save(self, path) -> None:
        """`models.save(self, path)` (`models.arch.persist.save`)."""
        save_folder(self, path)

    @property
    def device(self) -> torch.device:
        return self.embed_tgt.W_E.device

    # --- weights, stacked over layers (TransformerLens shapes) ---------------------------------------------------
    @property
    def W_E_src(self) -> torch.Tensor:  # [d_vocab_src, d_model]
        return (self.embed_src if hasattr(self, "embed_src") else self.embed_tgt).W_E

    @property
    def W_E_tgt(self) -> torch.Tensor:  # [d_vocab_tgt, d_model]
        return self.embed_tgt.W_E

    def _table(self, which: str) -> torch.Tensor:
        if not hasattr(self, f"pos_embed_{which}"):
            raise AttributeError(f"positional_embedding_type={self.cfg.positional_embedding_type!r} has no table")
        return getattr(self, f"pos_embed_{which}").W_pos

    W_pos_src = property(lambda self: self._table("src"))  # [n_ctx_src, d_model]
    W_pos_tgt = property(lambda self: self._table("tgt"))  # [n_ctx_tgt, d_model]
    W_U = property(lambda self: self.unembed.W_U)  # [d_model, d_vocab_tgt]
    b_U = property(lambda self: self.unembed.b_U)


def _stacked(blocks: str, module: str, name: str) -> property:
    """A property stacking `getattr(block.<module>, name)` over the blocks of `blocks` ("encoder" or "decoder")."""
    return property(lambda self: torch.stack([getattr(getattr(b, module), name) for b in getattr(self, blocks)]),
                    doc=f"`{blocks}[l].{module}.{name}` stacked over layers")


for _prefix, _blocks, _module in (("enc", "encoder", "attn"), ("dec", "decoder", "attn"),
                                  ("cross", "decoder", "cross_attn")):
    for _w in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        setattr(HookedEncoderDecoder, f"{_prefix}_{_w}", _stacked(_blocks, _module, _w))
    setattr(HookedEncoderDecoder, f"{_prefix}_QK", property(  # [layer, head, d_model, d_model] = W_Q W_Kᵀ
        lambda self, p=_prefix: FactoredMatrix(getattr(self, f"{p}_W_Q"), getattr(self, f"{p}_W_K").transpose(-2, -1))))
    setattr(HookedEncoderDecoder, f"{_prefix}_OV", property(  # [layer, head, d_model, d_model] = W_V W_O
        lambda self, p=_prefix: FactoredMatrix(getattr(self, f"{p}_W_V"), getattr(self, f"{p}_W_O"))))
for _prefix, _blocks in (("enc", "encoder"), ("dec", "decoder")):
    for _w in ("W_in", "b_in", "W_out", "b_out"):
        setattr(HookedEncoderDecoder, f"{_prefix}_{_w}", _stacked(_blocks, "mlp", _w))
