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
# Versions come from constraints.txt (scripts/lock.sh writes it from a working .venv): a fresh install
# gets what the tests last passed with, and the RL pretraining corpus (the installed packages' sources)
# is the same on every checkout.
digest=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
  say "installing the project${extras:+ with test extras} (versions pinned by constraints.txt)"
  "${PIP[@]}" install -c constraints.txt -e ".${extras}" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import agent, tools, backend" || { say "ERROR: project install failed"; exit 1; }
  echo "$digest" > "$stamp"
fi
# --- ACP test client (issue 14): the official ACP TypeScript SDK, for tests/backend/acp/test_ts_client.py ---
if [ $want_test = 1 ]; then
  acp_client=tests/clients/acp
  if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "installing nodejs and npm with apt-get (for the ACP test client)"
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    else
      say "WARNING: npm is missing: the ACP TypeScript client test will be skipped (apt-get install nodejs npm)"
    fi
  fi
  if command -v npm >/dev/null 2>&1; then
    acp_stamp="$acp_client/node_modules/.flywheel-$(sha256sum "$acp_client/package-lock.json" | cut -c1-16)"
    if [ ! -f "$acp_stamp" ]; then
      say "installing the ACP test client's packages (npm ci in $acp_client)"
      (cd "$acp_client" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) \
        || { say "ERROR: npm ci failed in $acp_client"; exit 1; }
      touch "$acp_stamp"
    fi
  fi
fi
# --- end ACP test client ---
# --- strace (issue 12): tests/tools/test_spawn.py checks each pipe descriptor is closed once ---
if [ $want_test = 1 ] && ! command -v strace >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing strace with apt-get (for the spawn test)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null
  else
    say "WARNING: strace is missing: one spawn test will be skipped (apt-get install strace)"
  fi
fi
# --- end strace ---
# --- web app (web/): Node.js >= 18 and npm, `npm ci`, `npm run build` into web/dist -------------------
# Skipped when nothing under web/ changed since the last build (a stamp in web/dist). Without Node the
# server still runs (its / page then says how to build the app); with root and apt, Node is installed.
web_digest() {
  (cd web && find src public index.html vite.config.ts tsconfig.json package.json package-lock.json -type f -print0 \
    | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}
node_ok() { command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
  && node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; }
if ! node_ok && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    say "installing nodejs and npm with apt-get (to build the web app)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null || true
  elif command -v sudo >/dev/null 2>&1; then
    say "installing nodejs and npm with sudo apt-get (to build the web app)"
    sudo apt-get update -qq >/dev/null && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null || true
  fi
fi
if ! node_ok; then
  say "WARNING: the web app is not built: it needs Node.js >= 18 and npm (Debian/Ubuntu: apt-get install nodejs npm);"
  say "         install them and run scripts/setup.sh again. The API and the terminal client work without it."
elif [ ! -f web/dist/index.html ] || [ "$(cat web/dist/.flywheel-build 2>/dev/null)" != "$(web_digest)" ]; then
  lock=$(sha256sum web/package-lock.json | cut -c1-16)
  if [ ! -d web/node_modules ] || [ "$(cat web/node_modules/.flywheel-npm-ci 2>/dev/null)" != "$lock" ]; then
    say "installing the web app's packages (npm ci)"
    (cd web && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || { say "ERROR: npm ci failed in web/"; exit 1; }
    echo "$lock" > web/node_modules/.flywheel-npm-ci
  fi
  say "building the web app (web/dist)"
  (cd web && npm run build --silent >/dev/null) || { say "ERROR: the web app failed to build (cd web && npm run build)"; exit 1; }
  web_digest > web/dist/.flywheel-build
fi
# --- end web app ----------------------------------------------------------------------------------------

# --- browser tests (--test): Debian's Chromium for tests/web (Playwright drives it; no browser download) ---
if [ $want_test = 1 ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing chromium with apt-get (for the browser tests, tests/web)"
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
      || say "WARNING: chromium did not install; tests/web will skip"
  else
    say "NOTE: tests/web need Chromium at /usr/bin/chromium (apt-get install chromium); they skip without it"
  fi
fi
# --- end browser tests ----------------------------------------------------------------------------------

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
