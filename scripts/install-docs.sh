#!/usr/bin/env bash
# Install dmkit's man pages and shell completions, generated from the command line's own
# definition (`dmkit generate`), under PREFIX (default /usr/local):
#   PREFIX/share/man/man1/dmkit*.1                       man dmkit, man dmkit-luks, ...
#   PREFIX/share/bash-completion/completions/dmkit       bash (with the bash-completion package)
#   PREFIX/share/zsh/site-functions/_dmkit               zsh
#   PREFIX/share/fish/vendor_completions.d/dmkit.fish    fish
# Usage: scripts/install-docs.sh [PREFIX]    (as root for /usr/local)
# The dmkit binary used is $DMKIT, else target/release/dmkit (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-/usr/local}"
dmkit="${DMKIT:-target/release/dmkit}"
if [ ! -x "$dmkit" ]; then
  cargo build --release --quiet
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$dmkit" generate man "$tmp/man1"
install -d "$prefix/share/man/man1" "$prefix/share/bash-completion/completions" \
  "$prefix/share/zsh/site-functions" "$prefix/share/fish/vendor_completions.d"
install -m 0644 "$tmp"/man1/*.1 "$prefix/share/man/man1/"
"$dmkit" generate completions bash >"$tmp/dmkit.bash"
"$dmkit" generate completions zsh >"$tmp/_dmkit"
"$dmkit" generate completions fish >"$tmp/dmkit.fish"
install -m 0644 "$tmp/dmkit.bash" "$prefix/share/bash-completion/completions/dmkit"
install -m 0644 "$tmp/_dmkit" "$prefix/share/zsh/site-functions/_dmkit"
install -m 0644 "$tmp/dmkit.fish" "$prefix/share/fish/vendor_completions.d/dmkit.fish"
# Refresh man's index (apropos, man -k) when installing system-wide; `man NAME` works without.
if [ "$prefix" = /usr/local ] && command -v mandb >/dev/null 2>&1; then
  mandb -q 2>/dev/null || true
fi
echo "installed $(ls "$tmp"/man1 | wc -l) man pages and bash, zsh, fish completions under $prefix/share"
