"""`models.evals`: TransformerLens' `transformer_lens.evals` (`induction_loss`, `evaluate`, the data loaders), under
the path TransformerLens 2.x code imports it by. `induction_loss` runs on our models as on TransformerLens' (its
default `subseq_len=384` needs a context of 769 tokens and its ids run to 20,000: GPT-2's sizes). Importing it imports
TransformerLens' module, which needs `datasets`; the loaders download data, which the toolkit itself never does."""

from models.arch.tl_compat import evals as _evals

globals().update({name: value for name, value in vars(_evals()).items() if not name.startswith("_")})
