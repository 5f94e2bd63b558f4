# shellcheck shell=bash
# A private RabbitMQ node for the example and the broker test suite: Debian's
# rabbitmq-server, started as the `rabbitmq` user (when run as root) with its
# own node name, ports, data, logs, configuration and Erlang cookie, all in
# one directory; the Debian package's own service is never used and is
# stopped if the installation started it. Sourced, not run:
#
#   source examples/rabbitmq/broker.sh
#   broker_install                    # apt-get install rabbitmq-server (once)
#   broker_start /tmp/dir 56710       # AMQP on 56710, distribution 56711, epmd 56712
#   broker_ctl list_queues            # rabbitmqctl against that node
#   broker_restart                    # stop and start the same node, data kept
#   broker_stop                       # stop the node (and its epmd)
#
# Run as a command, it restarts a node started that way (the fault storm
# does so from another process):
#
#   bash examples/rabbitmq/broker.sh restart /tmp/dir 56710
#
# Needs bash with `set -e` tolerated; uses only its own variables BROKER_*.

BROKER_SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server
BROKER_CTL=/usr/lib/rabbitmq/bin/rabbitmqctl

broker_as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs rabbitmq-server from Debian when missing. Debian's postinst may
# start the default service (node rabbit@<host> on 5672 with the shared epmd
# on 4369); it is stopped again so that nothing holds the default ports.
broker_install() {
  if [ ! -x "$BROKER_SERVER" ]; then
    echo "installing: rabbitmq-server"
    broker_as_root apt-get update -qq
    broker_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  fi
  broker_stop_default_service
}

broker_stop_default_service() {
  # Asked of the default epmd in its client mode, which starts no daemon
  # (rabbitmqctl would start one on 4369 when none runs).
  if timeout 10 /usr/bin/epmd -names 2>/dev/null | grep -q '^name rabbit at port'; then
    echo "stopping the rabbitmq-server service that the installation started (rabbit@$(hostname -s))"
    broker_as_root timeout 60 /usr/sbin/rabbitmqctl -q -n "rabbit@$(hostname -s)" stop >/dev/null 2>&1 || true
    # and the epmd it started on the default port, now without nodes
    timeout 20 /usr/bin/epmd -kill >/dev/null 2>&1 || true
  fi
}

# Runs a command as the broker's user with the node's environment.
broker_env() {
  local env=(env HOME="$BROKER_DIR" LANG=C.UTF-8 LC_ALL=C.UTF-8
    RABBITMQ_NODENAME="$BROKER_NODE" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$BROKER_PORT"
    RABBITMQ_DIST_PORT="$BROKER_DIST_PORT" ERL_EPMD_PORT="$BROKER_EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1
    RABBITMQ_MNESIA_BASE="$BROKER_DIR/mnesia" RABBITMQ_LOG_BASE="$BROKER_DIR/log"
    RABBITMQ_CONFIG_FILE="$BROKER_DIR/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$BROKER_DIR/enabled_plugins"
    RABBITMQ_PID_FILE="$BROKER_DIR/rabbit.pid" RABBITMQ_ADVANCED_CONFIG_FILE="$BROKER_DIR/advanced.config"
    RABBITMQ_CONF_ENV_FILE="$BROKER_DIR/rabbitmq-env.conf")
  if [ "$(id -u)" -eq 0 ]; then
    (cd "$BROKER_DIR" && runuser -u rabbitmq -- "${env[@]}" "$@")
  else
    (cd "$BROKER_DIR" && "${env[@]}" "$@")
  fi
}

broker_ctl() {
  broker_env "$BROKER_CTL" -q -n "$BROKER_NODE" "$@"
}

# broker_start directory port: AMQP on port, distribution on port+1, the
# node's own epmd on port+2. The URL is in BROKER_URL.
broker_configure() { # directory port
  BROKER_DIR=$1
  BROKER_PORT=$2
  BROKER_DIST_PORT=$(($2 + 1))
  BROKER_EPMD_PORT=$(($2 + 2))
  BROKER_NODE=idem$2@localhost
  # shellcheck disable=SC2034 # for the scripts that source this file
  BROKER_URL=amqp://guest:guest@127.0.0.1:$BROKER_PORT
}

broker_start() { # directory port
  broker_configure "$1" "$2"
  mkdir -p "$BROKER_DIR/mnesia" "$BROKER_DIR/log"
  cat >"$BROKER_DIR/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$BROKER_PORT
loopback_users = none
# the test machines are small and shared
disk_free_limit.absolute = 50MB
vm_memory_high_watermark.relative = 0.6
log.console = false
log.file.level = info
CONF
  echo '[].' >"$BROKER_DIR/enabled_plugins" # no management plugin, no other port
  echo '[].' >"$BROKER_DIR/advanced.config"
  : >"$BROKER_DIR/rabbitmq-env.conf"
  head -c 30 /dev/urandom | base64 | tr -dc 'A-Za-z' >"$BROKER_DIR/.erlang.cookie"
  chmod 400 "$BROKER_DIR/.erlang.cookie"
  if [ "$(id -u)" -eq 0 ]; then chown -R rabbitmq:rabbitmq "$BROKER_DIR"; fi
  broker_launch
}

broker_launch() {
  broker_env "$BROKER_SERVER" >>"$BROKER_DIR/log/startup.log" 2>&1 &
  BROKER_LAUNCHER=$!
  # `await_startup` waits for the node's boot to finish (or fails when it
  # cannot reach the node within the timeout).
  local tries=0
  until broker_ctl await_startup --timeout 60 >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -ge 30 ] || ! kill -0 "$BROKER_LAUNCHER" 2>/dev/null; then
      echo "the RabbitMQ node $BROKER_NODE did not start; its logs:" >&2
      tail -n 40 "$BROKER_DIR"/log/*.log >&2 || true
      return 1
    fi
    sleep 1
  done
}

broker_restart() {
  broker_ctl stop >/dev/null
  wait "${BROKER_LAUNCHER:-}" 2>/dev/null || true
  broker_launch
}

# Stops the node and the epmd it started (found by its port, never by name).
broker_stop() {
  [ -n "${BROKER_NODE:-}" ] || return 0
  broker_ctl stop >/dev/null 2>&1 || true
  wait "${BROKER_LAUNCHER:-}" 2>/dev/null || true
  broker_env /usr/bin/epmd -port "$BROKER_EPMD_PORT" -kill >/dev/null 2>&1 || true
  BROKER_NODE=
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case ${1:-} in
  restart) broker_configure "$2" "$3"; broker_restart ;;
  *) echo "usage: $0 restart DIRECTORY PORT" >&2; exit 2 ;;
  esac
fi
