#!/usr/bin/env bash
# Set up Flywheel on this machine: system packages, .venv, torch (CPU, pinned), the project.
# Idempotent: a second run only checks and returns. Usage: scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1
PY=${PYTHON:-python3}
TORCH_PIN="torch==2.13.0"   # a CPU build; a looser pin pulls a multi-GB CUDA build

say() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

# 1. System packages: ripgrep (grep tool) and bubblewrap (sandbox).
missing=()
command -v rg >/dev/null 2>&1 || missing+=(ripgrep)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${missing[*]} with apt-get"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    say "installing ${missing[*]} with sudo apt-get"
    sudo apt-get update -qq >/dev/null && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "ERROR: please install these system packages first: ${missing[*]} (Debian/Ubuntu: apt-get install ${missing[*]})"
    exit 1
  fi
fi

# 2. Python >= 3.11 and the virtual environment.
"$PY" - <<'PYCHECK' || { say "ERROR: Python >= 3.11 is required (set PYTHON=/path/to/python3.11)"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYCHECK
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)

# 3. torch first, pinned, so nothing later pulls a CUDA build.
if ! .venv/bin/python -W ignore -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  say "installing $TORCH_PIN (CPU build)"
  "${PIP[@]}" install "$TORCH_PIN" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -W ignore -c "import torch" || { say "ERROR: torch failed to install"; exit 1; }
fi

# 4. The project (editable), with test extras when asked. Skipped when nothing changed.
extras=""
[ $want_test = 1 ] && extras="[test]"
stamp=".venv/.flywheel-installed${extras:+-test}"
digest=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
  say "installing the project${extras:+ with test extras}"
  "${PIP[@]}" install -e ".${extras}" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import agent, tools, backend" || { say "ERROR: project install failed"; exit 1; }
  echo "$digest" > "$stamp"
fi

# 5. (--test) MCP test client: the MCP Inspector's CLI, pinned in tests/clients/mcp/package-lock.json.
if [ $want_test = 1 ]; then
  mcp_dir=tests/clients/mcp
  mcp_stamp="$mcp_dir/node_modules/.flywheel-installed"
  mcp_digest=$(sha256sum "$mcp_dir/package-lock.json" | cut -c1-16)
  if [ ! -f "$mcp_stamp" ] || [ "$(cat "$mcp_stamp")" != "$mcp_digest" ]; then
    if command -v npm >/dev/null 2>&1; then
      say "installing the MCP Inspector (npm ci in $mcp_dir)"
      (cd "$mcp_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) \
        && echo "$mcp_digest" > "$mcp_stamp" \
        || say "WARNING: npm ci failed in $mcp_dir; the MCP Inspector tests will be skipped"
    else
      say "WARNING: npm is missing (apt-get install nodejs npm, Node >= 20); the MCP Inspector tests will be skipped"
    fi
  fi
fi
say "ready"
