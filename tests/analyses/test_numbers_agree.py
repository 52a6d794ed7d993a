"""Numbers that say what they measure: the loss-bump rule (which can answer 'none'), the ICL score 'before' the
onset and its standard error, the ablation's standard error, both induction-score probes, OV copying for one-layer
models in `circuits heads`, diagonal accuracy over trained and all ids, direct logit attribution, token labels."""

import json
import math

import pytest
import torch

import circuits
from analyses.dynamics import loss_bump, training_dynamics
from analyses.labels import token_label, token_labels
from circuits.testing import build_induction_model
from models import HookedTransformer, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer


# --- the loss bump -----------------------------------------------------------------------------------------
def _curve(kink: float | None = None, drop: float = 0.6, n: int = 40, plateau: bool = True):
    """Validation loss over tokens 1000·1.25^i: ln(512) at the start, then a power law; `kink`: from there the
    loss falls `drop` nats more, spread over one doubling of tokens."""
    out = []
    for i in range(n):
        t = 0 if i == 0 else int(1000 * 1.25**i)
        v = 6.24 if (plateau and t < 4000) else 2.0 + 4.0 * (max(t, 1) / 4000) ** -0.15
        if kink is not None and t > kink:
            v -= drop * min(1.0, math.log(t / kink) / math.log(2))
        out.append((t, v))
    return out


def test_smooth_power_law_has_no_bump():
    assert loss_bump(_curve()) == (None, None)
    assert loss_bump(_curve(plateau=False)) == (None, None)


def test_leaving_the_initial_plateau_is_not_a_bump():
    # the fall from ln(d_vocab) at 4000 tokens accelerates the curve more than any later kink could
    assert loss_bump(_curve())[0] is None


def test_kink_is_found_where_it_is():
    t, (before, after) = loss_bump(_curve(kink=200_000))
    assert 200_000 / 1.3 <= t <= 200_000 * 1.3
    assert after < 2 * before < 0  # falls more than twice as fast after


def test_small_speed_up_is_not_a_bump():
    assert loss_bump(_curve(kink=200_000, drop=0.01))[0] is None


def test_zoo_runs():
    from models.io.checkpoint import ZOO_DIR

    for name in ("attn-only-0l", "attn-only-1l", "gelu-2l"):  # no induction heads: no bump
        assert training_dynamics(ZOO_DIR / name).bump is None, name
    d = training_dynamics(ZOO_DIR / "attn-only-2l")
    lo, hi = d.formation_window
    assert lo <= d.bump <= hi  # the bump sits where the induction heads form
    assert "none" not in d.markdown().split("loss bump")[1].split("\n")[0]


def test_icl_before_the_onset_and_its_standard_error(tmp_path):
    recs = []
    for i in range(12):
        t = 1000 * 2**i
        formed = i >= 8
        recs.append({"step": i, "tokens": t, "val_loss": 5 - 0.1 * i, "icl_score": -0.5 if formed else -0.1 - i / 100,
                     "icl_score_se": 0.01 * (i + 1), "induction_scores_50": [[0.0], [0.9 if formed else
                                                                                     (0.2 if i == 7 else 0.01)]]})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    d = training_dynamics(tmp_path)
    assert d.formation_window == (1000 * 2**6, 1000 * 2**8)  # step 7 (0.2) is already forming: not 'before'
    assert d.icl_before == pytest.approx(-0.16)
    md = d.markdown()
    assert "-0.160 ± 0.070" in md and "64,000 tokens" in md and "-0.500 ± 0.120" in md


def test_checkpoint_scores_carry_standard_errors(tmp_path):
    from analyses.dynamics import checkpoint_scores
    from circuits.testing import induction_tokens

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "tokens": 0, "val_loss": 3.0}))
    m, _ = build_induction_model(d_vocab=24, n_ctx=48, dtype="float32")
    m.save(tmp_path / "checkpoints" / "step-000000")
    w = induction_tokens(24, 23, batch=6)[:, :48]
    cs = checkpoint_scores(tmp_path, w, early=3, late=40)
    from analyses.scores import in_context_learning_differences

    diff = in_context_learning_differences(m, w, 3, 40)
    assert cs.icl_se[0] == pytest.approx(float(diff.std() / 6**0.5), rel=1e-6) and cs.n_windows == 6
    assert cs.before_onset() == 0 and "± " in cs.markdown()


# --- ablation ------------------------------------------------------------------------------------------
def test_ablation_standard_error_is_over_sequences():
    from analyses.one_layer import head_ablation_losses

    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=24, d_vocab=30, n_heads=2, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=2)
    m = HookedTransformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    tokens = torch.randint(1, 30, (5, 20), generator=torch.Generator().manual_seed(0))
    r = head_ablation_losses(m, tokens, chunk=2)
    per = torch.stack([head_ablation_losses(m, tokens[i:i + 1]).delta for i in range(5)])  # one at a time
    assert torch.allclose(r.delta, per.mean(0), atol=1e-5)
    assert torch.allclose(r.se, per.std(0) / 5**0.5, atol=1e-5)
    assert r.n_sequences == 5 and "± s.e." in r.markdown()


# --- induction scores two ways, and OV copying of one-layer models -----------------------------------------
def test_arena_recipe_beside_the_seen_ids_probe():
    from analyses import arena_induction_scores, detect_induction_heads, induction_scores

    m, info = build_induction_model(d_vocab=40, n_ctx=64)
    pool = torch.arange(1, 20)
    res = detect_induction_heads(m, tokens_from=pool)
    arena = arena_induction_scores(m, 31, 10, 0, None)
    seen = induction_scores(m, 31, 10, 0, pool)
    for r in res.table:
        assert r.induction == pytest.approx(float(seen[r.layer, r.head]))
        assert r.induction_arena == pytest.approx(float(arena[r.layer, r.head]))
    assert "ARENA stripe (all ids)" in res.markdown()


def test_heads_command_on_a_one_layer_model(tmp_path):
    from analyses.cli import main

    cfg = HookedTransformerConfig(n_layers=1, d_model=32, n_ctx=64, d_vocab=259, n_heads=4, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=0)
    m = HookedTransformer(cfg, tokenizer=ByteTokenizer())
    with torch.no_grad():  # head 0 copies: W_E W_OV W_U = W_E P W_Eᵀ with P a projection, positive semi-definite
        m.blocks[0].attn.W_V[0] = torch.eye(32)[:, :8]
        m.blocks[0].attn.W_O[0] = torch.eye(32)[:8]
        m.unembed.W_U.copy_(m.embed.W_E.T)
    m.save(tmp_path / "one")
    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x\n" * 20)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["heads", str(tmp_path / "one"), "--text-file", str(text), "--json", "--no-progress"]) == 0
    out = json.loads(buf.getvalue())
    ov = circuits.copying_scores(m)[0]
    from analyses.sequences import token_pool

    with torch.no_grad():
        S = token_pool(m, torch.tensor(m.tokenizer.encode(text.read_text())))
    for h, rec in enumerate(out["heads"]):
        assert rec["ov_copying"] == pytest.approx(float(ov[h]), abs=1e-5)
        M = (m.W_E @ m.W_V[0, h] @ m.W_O[0, h] @ m.W_U).double()[S][:, S]  # dense full OV over the text's ids
        assert rec["ov_top1"] == pytest.approx(float((M.diagonal() >= M.max(-1).values).double().mean()), abs=1e-6)
        assert ("copying" in rec["verdict"]) == (float(ov[h]) >= 0.5 and rec["ov_top1"] >= 0.5)
        assert ("OV-positive" in rec["verdict"]) == (float(ov[h]) >= 0.5 and rec["ov_top1"] < 0.5)
        assert rec["induction_arena"] is not None
    assert out["heads"][0]["ov_copying"] > 0.9 and "copying" in out["heads"][0]["verdict"]
    assert "ARENA" in out["induction_arena_probe"]


# --- diagonal accuracy over trained and all ids ------------------------------------------------------------
def test_diagonal_accuracy_over_trained_and_all_ids():
    from analyses.one_layer import copying_heads_table

    m, info = build_induction_model(d_vocab=24, n_ctx=32, noise=0.05)
    seen = torch.arange(1, 12)
    t = copying_heads_table(m, vocab=seen, behavioural=False)
    assert t.n_ids == 11 and t.n_ids_all == 23
    for l in range(2):
        for h in range(2):
            full = circuits.full_ov_circuit(m, l, h)
            M = (full.A @ full.B).double()
            for ids, acc in ((seen, t.top1[l, h]), (torch.arange(1, 24), t.top1_all[l, h])):
                sub = M[ids][:, ids]
                expect = float((sub.argmax(-1) == torch.arange(len(ids))).double().mean())
                assert float(acc) == pytest.approx(expect, abs=1e-6)
    assert "top-1 (all 23 ids)" in t.markdown()


# --- direct logit attribution, labels ------------------------------------------------------------------------
def test_direct_logit_attribution_sums_to_the_logits():
    from analyses.interactive import next_token_attribution

    m, _ = build_induction_model(d_vocab=16, n_ctx=32, noise=0.1)
    t = torch.tensor([0, 3, 5, 7, 9, 3, 5, 7, 9])
    dla, names = next_token_attribution(m, t)
    logits = m(t[None])[0, :-1].double()
    direct = (m.W_E[t[:-1]] @ m.W_U).double()  # attention-only, no norm, no biases: the rest is the direct path
    target = torch.arange(len(t) - 1), t[1:]
    assert names == ["L0H0", "L0H1", "L1H0", "L1H1"] and dla.shape == (8, 4)
    assert torch.allclose(dla.double().sum(1) + direct[target], logits[target], atol=1e-4)


def test_token_labels():
    assert token_label("\n        ") == "⏎␣×8"
    assert token_label(" self") == "␣self" and token_label("  x") == "␣␣x"
    assert token_label("\t") == "\\t" and token_label("\x01") == "\\x01"
    assert token_label("abcdefghijklmnop", max_len=5) == "abcd…"
    m = HookedTransformer(HookedTransformerConfig(n_layers=0, d_model=8, n_ctx=8, d_vocab=259, n_heads=1),
                          tokenizer=ByteTokenizer())
    assert token_labels(m, [10, 32, 65, 0xE2]) == ["⏎", "␣", "A", "<0xE2>"]
