#!/usr/bin/env bash
# AutoCircuit's own virtual environment for benchmarks/discovery_vs_autocircuit.py (outside the repository).
#
#   bash benchmarks/make_autocircuit_venv.sh [VENV]        # default .venv-autocircuit; 7-19 minutes (measured)
#
# auto-circuit 1.0.1 asks for transformer-lens >= 1.13 with no upper bound, so pip picks TransformerLens 4.x, which
# no longer has the `HookedTransformer` AutoCircuit imports: the third step pins TransformerLens 2.18 (the project's
# reference version), which brings numpy 1.26 and so needs pyarrow 21 (pyarrow 26 refuses numpy < 2). pip then
# reports that jax / jaxlib / ml-dtypes (pulled in by tracr-pypi, AutoCircuit's dependency for its tracr models)
# want numpy >= 2: harmless here, nothing the benchmark imports loads jax.
set -euo pipefail
VENV="${1:-.venv-autocircuit}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0            # the CPU build (the one on PyPI / the local wheel cache)
"$VENV/bin/pip" install -q auto-circuit==1.0.1
"$VENV/bin/pip" install -q transformer-lens==2.18.0 pyarrow==21.0.0
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
from auto_circuit.utils.graph_utils import patchable_model  # noqa: F401  (fails under TransformerLens 4.x)
from transformer_lens import HookedTransformer  # noqa: F401
print({p: md.version(p) for p in ("auto-circuit", "transformer-lens", "torch", "numpy", "pyarrow")})
PY
