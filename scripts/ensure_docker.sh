#!/usr/bin/env bash
# Make sure a Docker engine answers; install and start one when we are root and it does not.
#
# Idempotent and fast (< 1 s) when the engine already runs. What it does goes to stderr.
# Exit status: 0 when `docker info` answers at the end, 1 otherwise (with the reason).
#
#   bash scripts/ensure_docker.sh          # then: docker info
#   DOCKERD_LOG=/var/log/dockerd.log bash scripts/ensure_docker.sh
set -u

log() { echo "ensure_docker: $*" >&2; }
engine_up() { timeout 10 docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_up; then
  exit 0
fi

if [ "$(id -u)" != "0" ]; then
  log "no Docker engine answers and we are not root, so we cannot start one."
  log "start it yourself (e.g. 'sudo systemctl start docker') or set DOCKER_HOST."
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
  log "dockerd is absent: installing docker.io with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  # apt-get update only when the package is unknown to the local index (it takes seconds).
  if ! apt-cache show docker.io >/dev/null 2>&1; then
    log "apt-get update"
    apt-get update -qq >&2 || { log "apt-get update failed"; exit 1; }
  fi
  if ! apt-get install -y -qq docker.io >&2; then
    log "apt-get update and retry"
    apt-get update -qq >&2 && apt-get install -y -qq docker.io >&2 || {
      log "could not install docker.io"; exit 1; }
  fi
fi

LOG="${DOCKERD_LOG:-/var/log/rlcycle-dockerd.log}"
# A dockerd that is shutting down (or a zombie nobody reaped) must not count as running.
dockerd_alive() {
  local p
  for p in $(pgrep -x dockerd 2>/dev/null); do
    case "$(ps -o stat= -p "$p" 2>/dev/null)" in Z*|"") ;; *) return 0 ;; esac
  done
  return 1
}
start_dockerd() {
  log "starting dockerd in the background (log: $LOG)"
  # setsid: the daemon must outlive this script and the shell that called it.
  setsid dockerd >>"$LOG" 2>&1 < /dev/null &
}

if dockerd_alive; then
  log "dockerd is running but does not answer yet; waiting"
else
  start_dockerd
fi
starts=1
for i in $(seq 1 120); do
  if engine_up; then
    log "Docker engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
  fi
  # The daemon we waited for went away (it was stopping, or crashed at start): start one more.
  if [ $((i % 10)) = 0 ] && ! dockerd_alive && [ "$starts" -lt 3 ]; then
    starts=$((starts + 1))
    start_dockerd
  fi
  sleep 0.5
done
log "dockerd did not answer within 60 s; last lines of $LOG:"
tail -n 20 "$LOG" >&2 2>/dev/null
exit 1
