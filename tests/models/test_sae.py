"""SAEs on the zoo through SAELens (`models.sae`, `circuits sae`). The `ecosystem` tests need sae_lens (CI's second job
installs SAELens 6.54.12 first, then the project); without it they skip, saying so. The missing-dependency message
is tested everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import needs_sae_lens

import models
from models.errors import FolderError, MissingDependencyError, SAEError

ROOT = Path(__file__).resolve().parents[2]


def _sae(d_in: int, hook: str, d_sae: int = 64, seed: int = 0):
    """A standard SAELens SAE with random weights (positive encoder bias: many features fire)."""
    from sae_lens import StandardSAE, StandardSAEConfig

    cfg = StandardSAEConfig(d_in=d_in, d_sae=d_sae, reshape_activations="hook_z" if hook.endswith("hook_z") else "none")
    cfg.metadata.hook_name = hook
    torch.manual_seed(seed)
    sae = StandardSAE(cfg)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        sae.b_enc.add_(0.1)
    return sae.eval()


def _tokens(model, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, model.cfg.d_vocab, (n, 24), generator=g)
    t[:, 0] = model.tokenizer.bos_token_id
    return t


def test_missing_sae_lens_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sae_lens", None)  # `import sae_lens` raises ImportError
    from models.sae import with_saes

    with pytest.raises(MissingDependencyError, match=r"pip install sae-lens==6\.54\.12 .*not installed") as e:
        with_saes(models.load("gelu-2l"))
    assert "pip install -e '.[sae]'" in str(e.value) and "toy-circuits[sae]" not in str(e.value)  # a source checkout


def test_missing_sae_lens_is_one_line_exit_2_on_the_command_line(tmp_path):
    code = ("import sys; sys.modules['sae_lens'] = None; from analyses.cli import main; "
            f"sys.exit(main(['sae', 'train', 'gelu-2l', '--hook', 'blocks.1.hook_mlp_out', '--out', "
            f"{str(tmp_path / 'sae')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install sae-lens" in lines[0], r.stderr
    assert not (tmp_path / "sae").exists()


@pytest.mark.parametrize("sub,needs", [("train", "--hook"), ("report", "SAE_DIR")])
def test_sae_help_pages(sub, needs, capsys):
    from analyses.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["sae", sub, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and f"usage: circuits sae {sub}" in out
    for opt in ("--json", "--device", "--seed", "--out", needs):
        assert opt in out, opt


def test_train_refuses_a_folder_of_the_users_before_any_work(tmp_path, capsys):
    from analyses.cli import main

    (tmp_path / "notes.txt").write_text("keep me")
    assert main(["sae", "train", "gelu-2l", "--hook", "blocks.1.hook_mlp_out", "--out", str(tmp_path)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "not an empty folder" in err[0]
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    with pytest.raises(SystemExit) as exit_:  # argparse: one line, exit 2
        main(["sae", "train", "gelu-2l", "--hook", "h", "--out", str(tmp_path / "n"), "--steps", "0"])
    assert exit_.value.code == 2 and "expected a positive integer" in capsys.readouterr().err


@pytest.mark.ecosystem
@needs_sae_lens
@pytest.mark.parametrize("name,hook,width", [("gelu-2l", "blocks.1.hook_mlp_out", 128),
                                              ("attn-only-2l", "blocks.1.attn.hook_z", None)])
def test_run_with_saes_equals_a_hand_written_hook_splice(name, hook, width):
    from models.sae import hook_width, with_saes

    model = models.load(name).eval()
    d_in = hook_width(model, hook)
    assert d_in == (width or model.cfg.n_heads * model.cfg.d_head)
    sae = _sae(d_in, hook)
    tokens = _tokens(model)

    def splice(act, hook):  # the SAE's reconstruction in place of the activation, written out by hand
        flat = act.reshape(*act.shape[:2], -1)
        recon = torch.relu((flat - sae.b_dec) @ sae.W_enc + sae.b_enc) @ sae.W_dec + sae.b_dec
        return recon.reshape(act.shape)

    with torch.no_grad():
        by_hand = model.run_with_hooks(tokens, fwd_hooks=[(hook, splice)])
        clean = model(tokens)
        cls = type(model)
        m = with_saes(model)
        assert m is model and type(m) is cls  # the model itself, its class untouched
        spliced = m.run_with_saes(tokens, saes=[sae])
        after = m(tokens)
    torch.testing.assert_close(spliced, by_hand, atol=2e-5, rtol=0)
    from analyses.sae_metrics import feature_stats
    from models.sae import activations

    x = activations(model, hook, tokens, skip=0)  # [n, d_in], heads concatenated for hook_z
    with torch.no_grad():
        _, cache = m.run_with_cache_with_saes(tokens, saes=[sae])
    st = feature_stats(sae, x)
    torch.testing.assert_close(st.acts, cache[f"{hook}.hook_sae_acts_post"].reshape(x.shape[0], -1), atol=1e-6, rtol=0)
    assert 0 < st.l0 < sae.cfg.d_sae
    assert (spliced - clean).abs().max() > 1e-2  # the splice changes the output
    assert torch.equal(after, clean)  # run_with_saes removed it again
    assert not m.acts_to_saes


@pytest.mark.ecosystem
@needs_sae_lens
def test_add_sae_caches_under_sae_lens_names_and_reset_restores():
    from models.sae import activations, with_saes

    model = with_saes(models.load("gelu-2l").eval())
    hook = "blocks.1.hook_mlp_out"
    sae = _sae(128, hook)
    tokens = _tokens(model)
    with torch.no_grad():
        clean = model(tokens)
        x = activations(model, hook, tokens, skip=0)
        model.add_sae(sae)
        assert list(model.acts_to_saes) == [hook]
        logits, cache = model.run_with_cache(tokens)
        _, cache2 = model.run_with_cache_with_saes(tokens, saes=[sae])
        model.reset_saes()
        back = model(tokens)
    names = [n for n in cache.keys() if n.startswith(hook + ".")]
    assert {f"{hook}.hook_sae_input", f"{hook}.hook_sae_acts_post", f"{hook}.hook_sae_recons",
            f"{hook}.hook_sae_output"} <= set(names)
    acts = cache[f"{hook}.hook_sae_acts_post"].reshape(-1, sae.cfg.d_sae)
    torch.testing.assert_close(acts, sae.encode(x), atol=1e-6, rtol=0)
    torch.testing.assert_close(cache2[f"{hook}.hook_sae_output"], cache[f"{hook}.hook_sae_output"])
    assert torch.equal(back, clean) and not model.acts_to_saes
    assert "hook_sae_input" not in " ".join(model.hook_dict)


@pytest.mark.ecosystem
@needs_sae_lens
def test_activation_source_batches_are_the_models_activations_and_deterministic():
    from models.sae import ActivationSource, activations

    model = models.load("attn-only-2l").eval()
    stream = torch.randint(3, model.cfg.d_vocab, (5000,), generator=torch.Generator().manual_seed(0))
    bos = model.tokenizer.bos_token_id
    kw = dict(batch_size=64, seed=3, bos=bos, buffer_windows=4, windows_per_pass=2)
    a, b = ActivationSource(model, "blocks.1.attn.hook_z", stream, **kw), \
        ActivationSource(model, "blocks.1.attn.hook_z", stream, **kw)
    first = next(a)
    assert first.shape == (64, model.cfg.n_heads * model.cfg.d_head) and torch.equal(first, next(b))
    # every row is the activation of some non-BOS position of the windows read
    g = torch.Generator().manual_seed(3)
    from models.sae import text_windows

    wins = torch.cat([text_windows(stream, model.cfg.n_ctx, 2, g, bos) for _ in range(2)])
    pool = activations(model, "blocks.1.attn.hook_z", wins, skip=1)
    d = torch.cdist(first.double(), pool.double())
    assert float(d.min(1).values.max()) < 1e-5
    with pytest.raises(SAEError, match="not a hook point"):
        ActivationSource(model, "blocks.9.hook_mlp_out", stream)
    with pytest.raises(SAEError, match="shape"):
        ActivationSource(model, "blocks.0.attn.hook_pattern", stream)


@pytest.mark.ecosystem
@needs_sae_lens
def test_train_save_load_round_trip_and_no_overwrite(tmp_path):
    from sae_lens import SAE

    from models.sae import save_sae, train_sae

    model = models.load("gelu-2l").eval()
    stream = torch.randint(3, 250, (20_000,), generator=torch.Generator().manual_seed(0))
    tr = train_sae(model, "blocks.0.hook_resid_post", stream, steps=20, expansion=2, batch_size=256,
                   bos=model.tokenizer.bos_token_id, progress=False)
    assert tr.settings["d_sae"] == 256 and tr.settings["tokens_seen"] == 20 * 256
    out = save_sae(tr, tmp_path / "sae")
    loaded = SAE.load_from_disk(out)
    assert loaded.cfg.metadata.hook_name == "blocks.0.hook_resid_post"
    for k, v in tr.sae.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert json.loads((out / "training.json").read_text())["steps"] == 20
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FolderError, match="non-empty folder that is not a sparse-autoencoder folder"):
        save_sae(tr, tmp_path / "mine")  # through models.io.run_folder: a user's folder is never written into
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.mark.ecosystem
@needs_sae_lens
def test_sae_with_nan_weights_is_refused_not_reported(tmp_path, capsys):
    """An SAE SAELens saved with a NaN weight was reported as "dead 256/256, L0 0, FVU nan" with exit 0; its
    reader refuses non-finite weights: one line naming the file, exit 2, nothing written."""
    from analyses.cli import main

    sae = _sae(128, "blocks.1.hook_mlp_out")
    with torch.no_grad():
        sae.W_enc[0, 0] = float("nan")
    sae.save_model(tmp_path / "sae")
    assert main(["sae", "report", "gelu-2l", str(tmp_path / "sae"), "--out", str(tmp_path / "rep")]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "sae_weights.safetensors" in lines[0] and "non-finite" in lines[0]
    assert not (tmp_path / "rep").exists()


@pytest.mark.ecosystem
@needs_sae_lens
def test_save_sae_on_a_full_disk_through_sae_lens(tmp_path, monkeypatch):
    """SAELens' `save_model` writes through safetensors, whose own error type carries a full disk: `DiskFullError`
    (exit 1 on the command line), nothing left behind."""
    import sae_lens.saes.sae as sae_module
    from safetensors import SafetensorError

    from models.errors import DiskFullError
    from models.sae import Trained, save_sae

    def full(*a, **k):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
                              'left on device" })')

    monkeypatch.setattr(sae_module, "save_file", full)
    with pytest.raises(DiskFullError, match="disk is full"):
        save_sae(Trained(_sae(16, "blocks.0.hook_resid_post"), {"steps": 1}, 0.0), tmp_path / "sae")
    assert sorted(os.listdir(tmp_path)) == []


def _circuits(*args, timeout=900):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "analyses.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.ecosystem
@needs_sae_lens
def test_cli_train_then_report_on_gelu_2l(tmp_path):
    """The issue's acceptance: `circuits sae train gelu-2l --hook blocks.1.hook_mlp_out --steps 300 --out DIR`, then
    SAELens loads DIR and the SAE reconstructs validation text with FVU < 0.3; `circuits sae report` measures it."""
    from sae_lens import SAE

    from analyses.report import training_corpus
    from analyses.sae_metrics import feature_stats
    from analyses.util import windows
    from models.io.checkpoint import resolve
    from models.sae import activations, zoo_sae

    out = tmp_path / "sae"
    r = _circuits("sae", "train", "gelu-2l", "--hook", "blocks.1.hook_mlp_out", "--steps", 300, "--out", out,
                  "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["steps"] == 300 and summary["hook_name"] == "blocks.1.hook_mlp_out"
    assert summary["data"] == "stdlib" and summary["train_tokens_read"] == 2_000_000  # the text it read, recorded
    sae = SAE.load_from_disk(out)
    # the same command made the SAE the zoo ships (its card): on the same text (corpus key) it is that SAE again
    # (bitwise on the machine that made it; the tolerance leaves room for another CPU's rounding, not another text)
    shipped = zoo_sae("gelu-2l", "blocks.1.hook_mlp_out")
    if json.loads((shipped / "training.json").read_text())["corpus_key"] == summary["corpus_key"]:
        ref = SAE.load_from_disk(shipped)
        for k, v in ref.state_dict().items():
            torch.testing.assert_close(sae.state_dict()[k], v, rtol=0, atol=1e-3)
    model = models.load("gelu-2l").eval()
    corpus = training_corpus(model, resolve("gelu-2l"))
    bos = model.tokenizer.bos_token_id
    win = windows(torch.from_numpy(corpus.val[:200_000].astype("int64")), model.cfg.n_ctx, 16, 0, bos=bos)
    st = feature_stats(sae, activations(model, "blocks.1.hook_mlp_out", win))
    assert st.fvu < 0.3 and 0 < st.l0 < sae.cfg.d_sae / 2

    rep = tmp_path / "report"
    r = _circuits("sae", "report", "gelu-2l", out, "--out", rep, "--windows", 8, "--top", 3, "--json", "--html",
                  "--no-progress")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["fvu"] < 0.3 and obj["losses"]["clean"] < obj["losses"]["spliced"] < obj["losses"]["zero_ablated"]
    assert len(obj["features"]) == 3 and all(f["contexts"] and f["promoted"] for f in obj["features"])
    md = (rep / "sae_report.md").read_text()
    assert "FVU" in md and "### Feature" in md and (rep / "sae_report.png").stat().st_size > 10_000
    page = (rep / "sae_report.html").read_text()
    assert obj["html"] == str(rep / "sae_report.html") and "data:image/png;base64," in page
    assert "### Feature" not in page and page.count("<h3>") >= 3 and "<script" not in page  # rendered; loads nothing
    # bad input: one line, exit 2, nothing overwritten
    for args, match in [(("sae", "train", "gelu-2l", "--hook", "blocks.1.hook_mlp_out", "--out", out), "not an empty"),
                        (("sae", "train", "gelu-2l", "--hook", "blocks.7.hook_mlp_out", "--out", tmp_path / "x"),
                         "not a hook point"),
                        (("sae", "report", "attn-only-2l", out, "--out", rep), "hook_mlp_out"),
                        (("sae", "report", "gelu-2l", tmp_path, "--out", rep), "holds no SAE")]:
        r = _circuits(*args)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and match in lines[0], r.stderr


@pytest.mark.ecosystem
@needs_sae_lens
def test_sae_lens_imports_after_models_in_one_program():
    """SAELens imported after `import models` and a model run imports, and finds TransformerLens' one set of modules."""
    code = ("import models; m = models.load('attn-only-1l'); m(m.to_tokens('ab')); import sae_lens; "
            "from sae_lens import HookedSAETransformer; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_sae_report_markdown_escapes_token_text_once():
    """A context's token text lands in report.md as itself: escaped once (by `markdown_table`), in its own columns,
    whatever Markdown it holds."""
    from analyses.sae_report import Feature, SAEReport, markdown

    stats = {"hook_name": "blocks.0.hook_mlp_out", "tokens": 10, "fvu": 0.1, "l0": 2.0, "dead": 0, "d_sae": 4}
    losses = {"clean": 1.0, "spliced": 1.1, "zero_ablated": 2.0, "recovered": 0.9}
    feat = Feature(0, 0.5, 1.25, [("a_b", "*[x*]", "<c>", 1.25)], [("`t`", 0.5)])
    md = markdown(SAEReport(stats, losses, torch.zeros(4), [feat]), "m*", {"steps": "3_0"}, "te|xt")
    assert "| a\\_b | \\*\\[x\\*\\] | \\<c\\> | 1.250 |" in md
    assert "\\\\" not in md  # nothing escaped twice
    assert "Promotes: \\`t\\` (+0.50)" in md and "steps 3\\_0" in md and "on m\\*" in md


def test_sae_train_refuses_an_encoder_decoder_by_name(tmp_path, capsys):
    from analyses.cli import main

    out = tmp_path / "sae"
    assert main(["sae", "train", "enc-dec-reverse", "--hook", "blocks.0.hook_mlp_out", "--steps", "1", "--out",
                 str(out)]) == 2
    assert "decoder-only" in capsys.readouterr().err and not out.exists()
