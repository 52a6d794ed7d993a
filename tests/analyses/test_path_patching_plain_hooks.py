"""Path patching written again with plain PyTorch `register_forward_hook` hooks and no project analysis code (the
audit's independent implementation), against `analyses.patching.path_patching_matrix` on the zoo's attn-only-2l.

Each `HookPoint` is an `nn.Module` whose forward is the identity, so a forward hook that returns a tensor replaces
the activation there. Noising (Wang et al. 2022, §3.1), every sender (the token embedding, every head of layer 0)
to every receiver head of layer 1 through its query, key or value input: (1) the clean run with the sender's
`hook_z` slot (the embedding: `hook_embed`) from the corrupted run and every head's other `hook_z` frozen to the
clean run, recording the receivers' `hook_q/k/v`; (2) the clean
run with only the receiver's slot of that input replaced by the recording. Metric: the mean next-token loss over
the second copy of `[BOS] + R + R`, per prompt, computed here from the logits.
"""

from __future__ import annotations

import pytest
import torch

import models
from analyses import patching as P
from analyses.sequences import random_tokens, repeated_tokens


def _run(model, tokens, hooks):
    """Logits of one forward with `hooks` = {module: fn(output) -> replacement or None}, removed afterwards."""
    handles = [mod.register_forward_hook(lambda _m, _inp, out, fn=fn: fn(out)) for mod, fn in hooks.items()]
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        for h in handles:
            h.remove()


def _loss(logits, tokens, positions):
    lp = torch.log_softmax(logits.double(), -1)
    pos = torch.tensor(positions)
    return -lp[:, pos].gather(-1, tokens[:, pos + 1][..., None])[..., 0].mean(-1)  # [batch]


def _plain_path_patching(model, clean, corrupt, positions):
    attn = [b.attn for b in model.blocks]
    L, H = model.cfg.n_layers, model.cfg.n_heads
    z_clean, z_corrupt = {}, {}
    for tokens, store in ((clean, z_clean), (corrupt, z_corrupt)):
        hooks = {attn[l].hook_z: (lambda out, l=l, s=store: s.__setitem__(l, out.clone())) for l in range(L)}
        hooks[model.hook_embed] = lambda out, s=store: s.__setitem__("embed", out.clone())
        _run(model, tokens, hooks)
    out = torch.full((3, H + 1, H, clean.shape[0]), float("nan"), dtype=torch.float64)
    for s in range(H + 1):  # senders: the token embedding (s = 0), then L0H(s - 1)
        def frozen(out_, l, s=s):
            z = z_clean[l].clone()
            if l == 0 and s > 0:
                z[:, :, s - 1] = z_corrupt[0][:, :, s - 1]
            return z

        recorded = {}
        hooks = {attn[l].hook_z: (lambda o, l=l: frozen(o, l)) for l in range(L)}
        if s == 0:
            hooks[model.hook_embed] = lambda o: z_corrupt["embed"]
        for c in "qkv":
            hooks[getattr(attn[1], f"hook_{c}")] = lambda o, c=c, rec=recorded: rec.__setitem__(c, o.clone())
        _run(model, clean, hooks)
        for i, c in enumerate("qkv"):
            for r in range(H):  # receiver L1Hr
                def patch(o, c=c, r=r, rec=recorded):
                    o = o.clone()
                    o[:, :, r] = rec[c][:, :, r]
                    return o

                logits = _run(model, clean, {getattr(attn[1], f"hook_{c}"): patch})
                out[i, s, r] = _loss(logits, clean, positions)
    return out


def test_plain_hooks_path_patching_agrees_with_analyses_patching_on_attn_only_2l():
    m = models.load("attn-only-2l")
    m.eval()
    n = 20
    clean = repeated_tokens(m, n, 2, batch=4, seed=0)
    corrupt = clean.clone()
    corrupt[:, 1:n + 1] = random_tokens(m, n, 4, seed=1)
    positions = list(range(n + 1, 2 * n))
    ours = _plain_path_patching(m, clean, corrupt, positions)
    r = P.path_patching_matrix(m, clean, corrupt, P.metric("loss", P.next_token_answers(clean, positions)),
                               senders=["embed"] + [(0, h) for h in range(4)], receivers=[(1, h) for h in range(4)],
                               progress=False)
    assert r.axes == ("component", "sender", "receiver") and r.per_prompt.shape == ours.shape
    torch.testing.assert_close(r.per_prompt, ours, atol=1e-6, rtol=0)
    base = _loss(_run(m, clean, {}), clean, positions)
    torch.testing.assert_close(r.clean, base, atol=1e-6, rtol=0)
    assert float((ours - base[None, None, None]).abs().max()) > 0.1  # the hooks did act: some path moves the loss
    assert float(ours[1, 2, 1].mean() - base.mean()) == pytest.approx(float(r.values[1, 2, 1] - r.clean_value),
                                                                       abs=1e-6)
    assert r.labels[1][0] == "embed" and float(ours[2, 0].mean(-1).max() - base.mean()) > 1  # the values' route
