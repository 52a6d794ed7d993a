"""`models.evals`: TransformerLens' `transformer_lens.evals` (`induction_loss`, `evaluate`, the data loaders), under
the path TransformerLens 2.x code imports it by. `induction_loss` runs on our models as on TransformerLens' (its
default `subseq_len=384` needs a context of 769 tokens: pass a shorter one for the zoo). Importing it imports
TransformerLens' module, which needs `datasets`; the loaders download data, which the toolkit itself never does."""

from transformer_lens.evals import *  # noqa: F403
from transformer_lens.evals import evaluate, induction_loss  # noqa: F401
