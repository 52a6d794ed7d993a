import torch


def test_forward_and_cache_agree(tiny_model):
    tokens = torch.randint(0, 50, (2, 12))
    logits = tiny_model(tokens)
    cached_logits, cache = tiny_model.run_with_cache(tokens)
    assert logits.shape == (2, 12, 50)
    torch.testing.assert_close(logits, cached_logits)
    assert cache["pattern", 0].shape == (2, 4, 12, 12)
