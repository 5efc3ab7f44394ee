#!/bin/sh
# The installed package is importable: `meson install` (tag python-runtime)
# into a temporary root, then /usr/bin/python3 imports mercury and
# mercury.torch from there alone (the build tree is not on the path) and
# gets the library's error for a missing job file.
#   install_test.sh BUILD_DIR
set -eu
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --destdir "$tmp" --no-rebuild --tags python-runtime --quiet
site=$(dirname "$(find "$tmp" -name __init__.py -path '*/mercury/*')")
site=$(dirname "$site")
[ -f "$site/mercury/torch.py" ] || { echo "mercury was not installed under $tmp"; exit 1; }
case "$site" in
  "$tmp"/usr/local/lib/python3.*/dist-packages | "$tmp"/usr/lib/python3/dist-packages) ;;
  *) echo "installed in $site, which /usr/bin/python3 does not search"; exit 1 ;;
esac
cd "$tmp"
PYTHONPATH="$site" /usr/bin/python3 - "$site" <<'PY'
import sys
import mercury, mercury.torch, mercury.launch, mercury.timeline
assert mercury.__file__.startswith(sys.argv[1]), mercury.__file__
try:
    mercury.Worker("/nonexistent/job.yaml", "w0")
except mercury.WorkerError as e:
    assert "/nonexistent/job.yaml" in str(e), e
else:
    raise SystemExit("a missing job file was not refused")
print("imported from", mercury.__file__)
PY
