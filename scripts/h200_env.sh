# Sourced by scripts/h200_session.sh on the lent H200 (python 3.12, torch 2.11+cu130, triton 3.6, no
# network). Installs what scripts/h200_payload.sh packed into /tmp/site and puts it on PYTHONPATH.
# .whl/p1 (first call): pydantic and fa3-fwd, installed at once; the FA4 wheels and the first half of the
# cu13 CuTe DSL libs wait in /tmp. .whl/p2 (a call that follows while the machine is warm: its /tmp is
# kept): the second half; FA4 is installed only then, complete. Without p2, FA4 is not installed at all.
site=/tmp/site
mkdir -p "$site"
if [ -d .whl/p1 ] && [ ! -f "$site/.p1" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/p1/base/*.whl \
    && tar -C "$site" -xJf .whl/p1/fa3.tar.xz && rm -rf /tmp/fa4stash && cp -r .whl/p1/fa4 /tmp/fa4stash \
    && touch "$site/.p1"
fi
if [ -d .whl/p2 ] && [ -d /tmp/fa4stash ] && [ ! -f "$site/.p2" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" /tmp/fa4stash/*.whl \
    && cat /tmp/fa4stash/cu13.part.aa .whl/p2/cu13.part.ab | tar -C "$site" -xJf - && touch "$site/.p2"
fi
# The CuTe DSL adds its packages through a .pth file, which PYTHONPATH entries do not process.
export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
