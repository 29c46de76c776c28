#!/usr/bin/env bash
# System packages the tests need, installed only where missing:
#   dataset-fashion-mnist  the Fashion-MNIST files (/usr/share/datasets/fashion-mnist)
#   chromium               renders the leaderboard page in a real headless browser
#   postgresql             a real server for the shared-storage (many workers) test
#   procps                 pgrep, with which scripts/long_run.sh finds a run's workers
# Needs root (CI runs as root); without it, says what to install and exits 1.
set -euo pipefail

need=()
[ -d /usr/share/datasets/fashion-mnist ] || need+=(dataset-fashion-mnist)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v pgrep >/dev/null 2>&1 || need+=(procps)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "system-deps: missing ${need[*]}: run 'apt-get install ${need[*]}' as root" >&2; exit 1
  fi
else SUDO=; fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
