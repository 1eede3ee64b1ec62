#!/usr/bin/env bash
# The browser test drives Debian's Chromium; install it when it is missing (needs root + apt).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian chromium for the browser test..."
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "chromium is missing and cannot be installed here (needs root and apt-get);" >&2
  echo "install it, or set TEV_SKIP_BROWSER=1 to skip the browser test explicitly." >&2
fi
