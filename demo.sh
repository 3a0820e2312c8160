#!/usr/bin/env bash
# Set up .venv (first run only takes a minute or two) and run the embedded end-to-end demo.
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh
exec .venv/bin/retrylib demo "$@"
