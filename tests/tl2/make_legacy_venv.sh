#!/usr/bin/env bash
# Build the legacy reference environment: transformer-lens 2.18.0 (with its numpy < 2) beside torch 2.13.0 (CPU),
# in its own virtual environment at .venv-tl2/ in the repository root (gitignored), every version pinned in
# tests/tl2/legacy-requirements.txt.
#
# Idempotent and offline once built: a stamp holding the hash of the pins (and of this script) marks a finished
# build; with a matching stamp and an importable transformer_lens the script exits at once without the network.
# Anything else (no venv, a half-finished or outdated one) is rebuilt from scratch. Concurrent calls serialise on a
# lock. Prints the venv's python on stdout; progress goes to stderr. Exit 0 built or present, non-zero on failure.
#
# Usage: bash tests/tl2/make_legacy_venv.sh [VENV_DIR]      (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${1:-$root/.venv-tl2}"
pins="$here/legacy-requirements.txt"
python="${PYTHON:-python3}"
stamp="$venv/.tl2-stamp"
want="$(cat "$pins" "$0" | sha256sum | cut -c1-16)"

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

ready() {
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
        "$venv/bin/python" -c "import importlib.metadata as m
assert m.version('transformer-lens') == '2.18.0'" >/dev/null 2>&1
}

if ready; then
    echo "$venv/bin/python"
    exit 0
fi

"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || {
    echo "make_legacy_venv: the pins in $pins are for Python 3.11; $python is $("$python" -V 2>&1)" \
         "(set PYTHON=python3.11)" >&2
    exit 2
}
start=$(date +%s)
echo "make_legacy_venv: building $venv (transformer-lens 2.18.0, torch 2.13.0 CPU)" >&2
if [ -e "$venv" ]; then  # only a folder this script made (it carries the marker) is replaced
    [ -f "$venv/.tl2-made" ] || {
        echo "make_legacy_venv: $venv exists and was not made by this script; refusing to replace it" >&2
        exit 2
    }
    rm -rf "$venv"
fi
"$python" -m venv "$venv"
touch "$venv/.tl2-made"
pip_install() {  # pip's notes about this machine's empty local indexes are dropped from the log
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
        { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
    return "${PIPESTATUS[0]}"
}
pip_install torch==2.13.0
pip_install -r "$pins"
"$venv/bin/python" -c "import importlib.metadata as m, transformer_lens, torch, numpy
assert m.version('transformer-lens') == '2.18.0', m.version('transformer-lens')
assert torch.__version__.startswith('2.13.0'), torch.__version__
assert numpy.__version__.startswith('1.'), numpy.__version__" >&2
echo "$want" >"$stamp"
echo "make_legacy_venv: built in $(( $(date +%s) - start )) s" >&2
echo "$venv/bin/python"
