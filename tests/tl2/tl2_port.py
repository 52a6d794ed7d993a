"""Shared pieces of the ports of TransformerLens 2.18's own tests (tests/tl2/test_tl2_*.py) to OUR model.

Upstream tests build models with `HookedTransformerConfig(...)` keyword arguments; the ports pass the same ones to
ours (the API issue 14 promises). Where upstream loads a hub model only to have *a* trained model with a tokenizer
(`solu-1l`, `gpt2`), the port loads a shipped zoo model instead (`TEXT_MODEL`: LayerNorm, GELU MLPs, learned
positions, a byte tokenizer): those tests' assertions do not depend on the weights. Each port names its upstream
test (file::name) in its docstring; tests/tl2/README.md lists them all.
"""

from __future__ import annotations

import copy
import functools

import torch

from models import HookedTransformer, HookedTransformerConfig

TEXT_MODEL = "gelu-2l"  # the stand-in for upstream's hub models


@functools.cache
def _text_model():
    import models

    return models.load(TEXT_MODEL)


def text_model() -> HookedTransformer:
    """A fresh copy of the zoo model (a test may break it: an in-place hook edit can overwrite a weight today)."""
    return copy.deepcopy(_text_model()).eval()


# tests/acceptance/test_activation_cache.py's IOI prompts
PROMPT_FORMATS = ["When John and Mary went to the shops,{} gave the bag to",
                  "When Tom and James went to the park,{} gave the ball to",
                  "When Dan and Sid went to the shops,{} gave an apple to",
                  "After Martin and Amy went to the park,{} gave a drink to"]
NAMES = [(" Mary", " John"), (" Tom", " James"), (" Dan", " Sid"), (" Martin", " Amy")]


def ioi_tokens_and_answer_tokens(model):
    """Upstream's get_ioi_tokens_and_answer_tokens; an answer is the name's first letter (one byte token)."""
    prompts, answer_tokens = [], []
    for fmt, names in zip(PROMPT_FORMATS, NAMES):
        for j in range(2):
            correct, incorrect = names[j], names[1 - j]
            answer_tokens.append((model.to_single_token(correct.strip()[0]),
                                  model.to_single_token(incorrect.strip()[0])))
            prompts.append(fmt.format(incorrect))
    return model.to_tokens(prompts, prepend_bos=True), torch.tensor(answer_tokens)


def ioi_cache_run(name=TEXT_MODEL, batch=None):
    """(model, its cache of the IOI prompts (rows `batch`), tokens, answer tokens), as upstream's tests start."""
    import models

    model = text_model() if name == TEXT_MODEL else models.load(name).eval()
    tokens, answer_tokens = ioi_tokens_and_answer_tokens(model)
    _, cache = model.run_with_cache(tokens if batch is None else tokens[batch])
    return model, cache, tokens, answer_tokens


def tl_model(**cfg) -> HookedTransformer:
    """`HookedTransformer(HookedTransformerConfig(**cfg))` seeded, as upstream builds its small models."""
    torch.manual_seed(0)
    return HookedTransformer(HookedTransformerConfig(**cfg))


def kv_cache_class():
    """Our `HookedTransformerKeyValueCache` (issue 14: 'a HookedTransformerKeyValueCache-like object also usable in
    forward'), expected at `models.HookedTransformerKeyValueCache`."""
    import models

    return models.HookedTransformerKeyValueCache
