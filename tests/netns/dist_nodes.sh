# dist_nodes.sh - sourced by the scripts that run umbp-dist-node processes
# in network namespaces (tests/netns/test_distributed_netns.sh,
# tests/netns/test_failover_netns.sh, scripts/two_hosts.sh): one node per
# host, driven over fifos, every answer read with a bound.
#
# The caller sets: N (scripts/netns.sh), name (the namespace set), work (a
# private directory), NODE (the umbp-dist-node binary), MASTER_ADDRESS
# (host:port or redis://...), secret (its file), ANSWER_S (the bound on one
# answer), NODE_JSON (extra members for every node, ",\"k\":v..." or ""),
# the array pids, and fail() (prints why and exits); QUIET=1 silences cmd's
# echo.  start_node's optional second argument adds members for that node.
declare -A IN OUT
ans=""
QUIET=${QUIET:-0}

start_node() { # host [extra json members]
  local h=$1 extra=${2:-}
  start_driver "$h" "$h" "{\"mode\":\"distributed\",\"master_address\":\"$MASTER_ADDRESS\",\"secret_file\":\"$secret\",\"node_host\":\"h$h\",\"capacity_bytes\":\"256MiB\",\"gpu_backend\":\"host\"${NODE_JSON:-}$extra}"
}

# An umbp-dist-node named `id` (the key of IN, OUT and cmd) in host h's
# namespace with the whole config `json` (start_node's, or an engine of a
# host's umbp-server: mode standalone).
start_driver() { # id host json
  local id=$1 h=$2 json=$3 line
  mkfifo "$work/in$id" "$work/out$id"
  [[ -n ${NODE_SAY:-} ]] && "$NODE_SAY" "starting a node on host $h: UCX_TLS=tcp UCX_NET_DEVICES=eth0 umbp-dist-node '$json'"
  "$N" exec "$name" "$h" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no \
    "$NODE" "$json" < "$work/in$id" > "$work/out$id" 2> "$work/node$id.log" &
  pids+=($!)
  exec {IN[$id]}> "$work/in$id"
  exec {OUT[$id]}< "$work/out$id"
  read -r -t "$ANSWER_S" -u "${OUT[$id]}" line || fail "node $id (h$h) printed nothing"
  [[ $line == ready ]] || fail "node $id (h$h): $line"
  ((QUIET)) || echo "node $id (h$h) ready"
}

cmd() { # host command... -> ans
  local h=$1
  shift
  echo "$*" >&"${IN[$h]}" || fail "node h$h: cannot write '$*'"
  read -r -t "$ANSWER_S" -u "${OUT[$h]}" ans || fail "node h$h: no answer to '$*' within $ANSWER_S s"
  ((QUIET)) || echo "h$h: $* -> $ans"
}
