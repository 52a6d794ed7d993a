"""`models.patching`: TransformerLens' `transformer_lens.patching` (activation patching over every position, head or
layer: `get_act_patch_resid_pre`, `get_act_patch_attn_head_out_by_pos`, …), which takes our models as they are, under
the path TransformerLens 2.x code imports it by. Importing it imports TransformerLens' module (it needs pandas)."""

from models.arch.tl_compat import patching as _patching

globals().update({name: value for name, value in vars(_patching()).items() if not name.startswith("_")})
