# Shared steps of scripts/vllm-env.sh and scripts/vidur-env.sh (sourced, not run): a
# throwaway venv for one peer engine plus lpserve (editable), reused while a stamp keyed
# by the calling script, this file and pyproject.toml is present.
#
#   peer_venv_begin NAME VENV   # exits 0 printing the python path if the venv is current;
#                               # else creates it, sets $venv, $pip (array) and $start
#   peer_venv_end NAME          # stamps the venv and prints its python path

peer_venv_begin() {
  local name="$1"
  venv="$2"
  local py="${PYTHON:-python3}"
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "$name-env: needs Python >= 3.11 (found: $("$py" --version 2>&1)); set PYTHON=python3.11" >&2
    exit 1
  fi
  local key
  key="$(cat "scripts/$name-env.sh" scripts/peer-venv.sh pyproject.toml | sha256sum | cut -c1-16)"
  stamp="$venv/.lpserve-$name-$key"
  if [ -f "$stamp" ] && [ -x "$venv/bin/python" ]; then
    echo "$venv/bin/python"
    exit 0
  fi
  start=$(date +%s)
  if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
  fi
  pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  "${pip[@]}" install --quiet --upgrade pip >&2
}

peer_venv_end() {
  local name="$1"
  rm -f "$venv"/.lpserve-"$name"-*
  touch "$stamp"
  echo "$name-env: ready in $(( $(date +%s) - start )) s" >&2
  echo "$venv/bin/python"
}
