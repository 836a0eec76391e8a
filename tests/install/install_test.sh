#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then the installed strata serves the web UI with no
# --web-dir (it finds PREFIX/share/strata/web beside PREFIX/bin), and the systemd units name the
# installed binary. Fails (never skips) when something is missing.
set -euo pipefail
BUILD=${1:?usage: install_test.sh BUILD_DIR}
tmp=$(mktemp -d /tmp/strata-install-XXXXXX)
server=
cleanup() {
  [[ -n $server ]] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$tmp/prefix" >"$tmp/install.log" || fail "cmake --install: $(tail -3 "$tmp/install.log")"
p=$tmp/prefix
[[ -x $p/bin/strata ]] || fail "no $p/bin/strata"
[[ -f $p/share/strata/web/index.html ]] || fail "no web UI at $p/share/strata/web (is the web UI built? npm)"
leftovers=$(cd "$p/share/strata/web" && ls -d CMakeFiles Makefile ./*.cmake 2>/dev/null || true)
[[ -z $leftovers ]] && [[ ! -e $p/share/strata/web/CTestTestfile.cmake ]] || fail "build files installed with the web UI: $leftovers"
for unit in strata-agent strata-serve; do
  f=$p/lib/systemd/system/$unit.service
  [[ -f $f ]] || fail "no $f"
  grep -q "^ExecStart=$p/bin/strata " "$f" || fail "$f does not start $p/bin/strata: $(grep ExecStart "$f")"
done

# A port of the kernel's choosing, free now.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cd "$tmp"
"$p/bin/strata" serve --store "sqlite:$tmp/s.db" --listen "127.0.0.1:$port" --diagnose-every 0 >"$tmp/serve.log" 2>&1 &
server=$!
for _ in $(seq 600); do
  grep -q "serving on" "$tmp/serve.log" && break
  kill -0 "$server" 2>/dev/null || fail "serve exited: $(cat "$tmp/serve.log")"
  sleep 0.1
done
grep -q "serving on" "$tmp/serve.log" || fail "serve did not start: $(cat "$tmp/serve.log")"
# The page at / must be the installed UI's index.html, byte for byte (not serve's placeholder).
python3 - "http://127.0.0.1:$port/" "$p/share/strata/web/index.html" <<'PY' || fail "/ is not the installed web UI"
import sys, urllib.request
page = urllib.request.urlopen(sys.argv[1], timeout=30).read()
want = open(sys.argv[2], "rb").read()
if page != want:
    print("install_test: / answered %d bytes: %r" % (len(page), page[:200]), file=sys.stderr)
    sys.exit(1)
PY
echo "install_test: ok: $p/bin/strata serves $p/share/strata/web at / with no --web-dir"
