"""The SAEs shipped with the zoo (models/zoo/<model>/saes/<hook>/): small, loadable by SAELens' own
`SAE.load_from_disk`, trained on the data their training.json names, with a card whose numbers are measured.json's,
and measured.json the output of the command the card shows (re-run here, ecosystem tier). The feature page of a real
SAE against a direct computation (SAELens' encode, `W_dec · W_U` written out)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import needs_sae_lens

import models
from models.io.checkpoint import ZOO_DIR
from models.io.sae import zoo_sae, zoo_saes

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [("attn-only-2l", "blocks.1.attn.hook_z"), ("gelu-2l", "blocks.1.hook_mlp_out")]


def _measured(model, hook) -> dict:
    return json.loads((zoo_sae(model, hook) / "measured.json").read_text())


def _training(model, hook) -> dict:
    return json.loads((zoo_sae(model, hook) / "training.json").read_text())


def test_the_zoo_ships_these_saes_small():
    assert zoo_saes() == SHIPPED
    for model, hook in SHIPPED:
        folder = zoo_sae(model, hook)
        assert folder == ZOO_DIR / model / "saes" / hook
        size = sum(f.stat().st_size for f in folder.iterdir())
        assert size < 3 * 2**20, f"{folder}: {size / 2**20:.1f} MB"
        assert {"cfg.json", "sae_weights.safetensors", "training.json", "card.md", "measured.json"} <= \
            {f.name for f in folder.iterdir()}
    with pytest.raises(models.ToyCircuitsError, match="shipped: attn-only-2l blocks.1.attn.hook_z"):
        zoo_sae("gelu-2l", "blocks.0.hook_mlp_out")


@pytest.mark.parametrize("model,hook", SHIPPED)
def test_training_json_records_the_data_and_the_card_shows_the_command(model, hook):
    """The SAE was trained by `circuits sae train` on the zoo model's own corpus (data "stdlib"); the card's
    training command is the one training.json's settings give."""
    tr = _training(model, hook)
    zoo_cfg = json.loads((ZOO_DIR / model / "train_config.json").read_text())
    assert tr["data"] == zoo_cfg["data"] == "stdlib" and tr["corpus"] == "python3.11-stdlib"
    assert tr["hook_name"] == hook and tr["model"] == model and tr["train_tokens_read"] == 2_000_000
    card = (zoo_sae(model, hook) / "card.md").read_text()
    command = (f"circuits sae train {model} --hook {hook} --steps {tr['steps']} --out "
               f"models/zoo/{model}/saes/{hook}")
    assert f"`{command}`" in card
    assert (tr["expansion"], tr["l1"], tr["batch_size"], tr["lr"], tr["seed"]) == (8, 2.0, 4096, 0.003, 0)  # defaults
    assert f"{tr['steps']} steps × {tr['batch_size']} token activations" in card
    assert f"corpus key `{tr['corpus_key']}`" in card and f"{tr['seconds']:.0f} s wall" in card


@pytest.mark.parametrize("model,hook", SHIPPED)
def test_card_numbers_are_measured_json(model, hook):
    m, card = _measured(model, hook), (zoo_sae(model, hook) / "card.md").read_text()
    lo = m["losses"]
    assert m["model"] == model and m["hook_name"] == hook
    assert f"`{m['command']}`" in card and m["command"].startswith(f"circuits sae report {model} models/zoo/")
    assert f"on {m['windows']} validation windows" in card and f"({m['tokens']:,} token positions)" in card
    assert f"FVU **{m['fvu']:.3f}**, L0 **{m['l0']:.1f}**, dead features **{m['dead']} of {m['d_sae']}**" in card
    assert (f"clean **{lo['clean']:.3f}**, SAE spliced in **{lo['spliced']:.3f}**, zero-ablated "
            f"**{lo['zero_ablated']:.3f}** nats/token; loss recovered **{100 * lo['recovered']:.1f} %**") in card


# --- SAELens ----------------------------------------------------------------------------------------------------
def _circuits(*args, timeout=900):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "analyses.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.ecosystem
@needs_sae_lens
@pytest.mark.parametrize("model,hook", SHIPPED)
def test_sae_lens_loads_the_shipped_sae_as_itself(model, hook):
    from sae_lens import SAE
    from safetensors.torch import load_file

    from models.sae import hook_width, load_sae

    folder = zoo_sae(model, hook)
    sae = SAE.load_from_disk(folder)  # SAELens' own loader, no converter of ours
    ours = load_sae(folder, models.load(model))
    raw = load_file(str(folder / "sae_weights.safetensors"))
    assert sae.cfg.metadata.hook_name == hook and sae.cfg.d_in == hook_width(models.load(model), hook)
    for k, v in raw.items():
        assert torch.equal(sae.state_dict()[k], v) and torch.equal(ours.state_dict()[k], v), k


@pytest.mark.ecosystem
@needs_sae_lens
@pytest.mark.parametrize("model,hook", SHIPPED)
def test_measured_json_is_the_output_of_the_cards_command(model, hook, tmp_path):
    """The card's command, re-run: every number in measured.json at the precision the card prints it, and the
    README's quotes (tests/models/test_quoted_numbers.py holds those to measured.json)."""
    m = _measured(model, hook)
    argv = m["command"].split()[1:]
    assert argv[argv.index("--out") + 1] == "DIR"
    argv[argv.index("--out") + 1] = str(tmp_path / "report")
    r = _circuits(*argv, "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    for key in ("hook_name", "windows", "tokens", "dead", "d_sae", "text"):
        assert got[key] == m[key], key
    assert f"{got['fvu']:.4f}" == f"{m['fvu']:.4f}" and f"{got['l0']:.2f}" == f"{m['l0']:.2f}"
    for key in ("clean", "spliced", "zero_ablated", "recovered"):
        assert f"{got['losses'][key]:.4f}" == f"{m['losses'][key]:.4f}", key


def _direct_logits(model, hook, W_dec_row: torch.Tensor) -> torch.Tensor:
    """`W_dec[f] · W_U` written out in float64 (through each head's `W_O` for a hook_z feature)."""
    row = W_dec_row.double()
    if hook.endswith("hook_z"):
        layer = int(hook.split(".")[1])
        W_O = model.W_O[layer].detach().double()  # [head, d_head, d_model]
        row = sum(row.reshape(W_O.shape[0], W_O.shape[1])[h] @ W_O[h] for h in range(W_O.shape[0]))
    return row @ model.W_U.detach().double()


@pytest.mark.ecosystem
@needs_sae_lens
@pytest.mark.parametrize("model_name,hook", SHIPPED)
def test_feature_page_numbers_against_a_direct_computation(model_name, hook):
    """The report's histogram is numpy's over SAELens' own encoding of the activations (read from the model's cache
    by hand), its promoted / suppressed tokens the top / bottom of `W_dec[f] · W_U` in float64, and each context's
    activations SAELens' at those positions."""
    from sae_lens import SAE

    from analyses.labels import token_labels
    from analyses.sae_report import analyse
    from analyses.util import windows

    model = models.load(model_name).eval()
    sae = SAE.load_from_disk(zoo_sae(model_name, hook))
    bos = model.tokenizer.bos_token_id
    text = model.to_tokens("import os\nfor name in sorted(os.listdir(path)):\n    print(name, len(name))\n" * 8,
                           prepend_bos=False)[0]
    win = windows(text, model.cfg.n_ctx, 3, 0, bos=bos)
    with torch.no_grad():
        report = analyse(model, sae, win, bos, top=4, contexts=3, promoted=5, before=6, after=2, bins=10)
        _, cache = model.run_with_cache(win, names_filter=hook)
        if hook.endswith("hook_z"):  # the heads concatenated by hand below
            sae.turn_off_forward_pass_hook_z_reshaping()
        act = cache[hook][:, 1:]
        x = act.reshape(*act.shape[:2], -1)  # [window, pos, d_in], heads concatenated for hook_z
        acts = sae.encode(x.reshape(-1, x.shape[-1]))  # [n, d_sae]
    assert len(report.features) == 4
    for f in report.features:
        col = acts[:, f.index].double().numpy()
        pos = col[col > 0]
        counts, edges = np.histogram(pos, bins=10, range=(0.0, pos.max()))
        assert f.histogram.counts == counts.tolist() and f.histogram.zeros == int((col <= 0).sum())
        np.testing.assert_allclose(f.histogram.edges, edges, rtol=1e-5)
        assert f.max_act == pytest.approx(float(pos.max()), rel=1e-6)
        logits = _direct_logits(model, hook, sae.W_dec[f.index].detach())
        top, bottom = torch.topk(logits, 5), torch.topk(logits, 5, largest=False)
        assert [t for t, _ in f.promoted] == token_labels(model, top.indices.tolist())
        assert [t for t, _ in f.demoted] == token_labels(model, bottom.indices.tolist())
        np.testing.assert_allclose([v for _, v in f.promoted], top.values.numpy(), atol=1e-5)
        np.testing.assert_allclose([v for _, v in f.demoted], bottom.values.numpy(), atol=1e-5)
        span = win.shape[1] - 1
        best = np.argsort(-col, kind="stable")[: len(f.windows)]
        for ctx, k in zip(f.windows, best):
            w, p = divmod(int(k), span)
            lo = max(0, p - 6)
            assert ctx.at == p - lo
            np.testing.assert_allclose(ctx.acts, acts.reshape(win.shape[0], span, -1)[w, lo:p + 3, f.index].numpy(),
                                       atol=1e-6)


@pytest.mark.ecosystem
@pytest.mark.e2e
@needs_sae_lens
def test_hostile_model_sae_page_in_headless_chromium(tmp_path):
    """An SAE on a model whose tokens are HTML, comments and control characters: `sae report --html` writes a page
    that makes no request, opens no dialog, renders every feature page, and shows the tokens as text."""
    import shutil

    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    chromium = os.environ.get("TOY_CIRCUITS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    from sae_lens import StandardSAE, StandardSAEConfig

    sys.path.insert(0, str(ROOT / "tests" / "reliability"))
    from test_round3_token_text import HOSTILE, PLAIN, SEP, _hostile_tokenizer

    from models import HookedTransformer, HookedTransformerConfig, save

    tok = _hostile_tokenizer()
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=24, d_vocab=tok.vocab_size, n_heads=2,
                                  attn_only=True, normalization_type=None, seed=0)
    folder = tmp_path / "model"
    save(HookedTransformer(cfg, tokenizer=tok), folder)
    rng = np.random.default_rng(0)
    (folder / "text.txt").write_text(SEP.join(rng.choice(PLAIN + HOSTILE, 3000).tolist()))
    (folder / "train_config.json").write_text(json.dumps({"data": "text.txt"}))
    scfg = StandardSAEConfig(d_in=16, d_sae=32)
    scfg.metadata.hook_name = "blocks.0.hook_resid_post"
    torch.manual_seed(0)
    sae = StandardSAE(scfg)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    sae.save_model(tmp_path / "sae")
    r = _circuits("sae", "report", folder, tmp_path / "sae", "--out", tmp_path / "rep", "--html", "--windows", 6,
                  "--top", 5, "--json", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    n = len(json.loads(r.stdout)["features"])
    assert n == 5
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
    from helpers import offline_page

    with offline_page(chromium, flags, (tmp_path / "rep" / "sae_report.html").as_uri()) as (page, requests, errors,
                                                                                           dialogs):
        page.wait_for_timeout(300)
        sections = page.locator("section.sae-feature").count()
        bars = page.locator("section.sae-feature svg rect").count()
        injected = page.locator("b", has_text="PWN").count() + page.locator("img[src=x]").count()
        shown = page.locator("section.sae-feature").all_inner_texts()
    assert requests == [] and dialogs == [] and errors == [], (requests, dialogs, errors)
    assert sections == n and bars > 0 and injected == 0
    assert re.search(r"<b>PWN</b>|<script>|<img src=x", "".join(shown))  # the tokens shown as text


@pytest.mark.ecosystem
@needs_sae_lens
def test_report_summary_line_gives_the_loss_recovered(tmp_path, capsys):
    """`circuits sae report`'s one-line summary names the loss recovered (the number README quotes), the JSON's."""
    from analyses.cli import main
    from models.io.examples import model_example

    model_example(tmp_path)
    argv = ["sae", "report", str(tmp_path / "model"), str(tmp_path / "sae"), "--no-progress", "--windows", "4"]
    assert main(argv + ["--out", str(tmp_path / "a"), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert main(argv + ["--out", str(tmp_path / "b")]) == 0
    line = capsys.readouterr().out.strip()
    assert f"loss recovered {obj['losses']['recovered']:.1%}" in line and line.count("\n") == 0


@pytest.mark.ecosystem
@needs_sae_lens
def test_hook_z_features_of_a_repeated_sequence_sit_in_the_induction_heads():
    """Notebook 07's finding, on the shipped hook_z SAE: the 5 features whose mean activation rises most from the
    first to the second copy of a repeated random sequence each have ≥ 0.8 of their decoder norm in one head, and
    that head is one of attn-only-2l's induction heads (its card's measured.json: induction score ≥ 0.4)."""
    from analyses.sequences import repeated_tokens
    from models.sae import load_sae, with_saes

    hook = "blocks.1.attn.hook_z"
    model = models.load("attn-only-2l").eval()
    sae = load_sae(zoo_sae("attn-only-2l", hook), model)
    H, d_head = model.cfg.n_heads, model.cfg.d_head
    induction = {h for h, v in enumerate(json.loads((ZOO_DIR / "attn-only-2l" / "measured.json").read_text())
                                         ["induction_scores_50"][1]) if v >= 0.4}
    assert induction == {1, 2}
    rep = repeated_tokens(model, 20, 2, batch=8, seed=0)
    with torch.no_grad():
        _, cache = with_saes(model).run_with_cache_with_saes(rep, saes=[sae])
    acts = cache[f"{hook}.hook_sae_acts_post"]
    rise = acts[:, 21:].mean((0, 1)) - acts[:, 1:21].mean((0, 1))
    W = sae.W_dec.detach().reshape(-1, H, d_head)
    share = (W ** 2).sum(-1) / (W ** 2).sum((-2, -1))[:, None]
    for f in torch.argsort(rise, descending=True)[:5].tolist():
        assert rise[f] > 0.1 and int(share[f].argmax()) in induction and float(share[f].max()) >= 0.8, \
            (f, float(rise[f]), share[f].tolist())
