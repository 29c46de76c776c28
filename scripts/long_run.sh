#!/usr/bin/env bash
# A sweep longer than a session, whose next session may get another machine: while a session runs its stores
# live on this machine, between sessions in the repository as a checkpoint (checkpoints/NAME/, committed).
# Every session runs the same command first:
#
#   bash scripts/long_run.sh start NAME        # restore the checkpoint where the stores are missing, start the workers
#   bash scripts/long_run.sh checkpoint NAME   # refresh checkpoints/NAME from the stores, the workers paused a moment
#   bash scripts/long_run.sh stop NAME         # SIGTERM the workers (each gives its running unit back), then wait
#   bash scripts/long_run.sh status NAME       # the workers running, and the trials by state
#   bash scripts/long_run.sh finish NAME       # once the run (and its CHECK) is whole: its results into results/
#
# At a session's end: stop, checkpoint, commit; the stores here then equal the checkpoint, and the next session,
# here or elsewhere, goes on from the same place.
#
# checkpoints/NAME/run.env fixes the run for all its parts: PROTOCOL (the protocol file), COMMIT (the code every
# part runs, so no part trains with other code), TREE (a worktree at COMMIT with its own .venv, made by `start`
# when missing; "." is this checkout, which must then be at COMMIT), STORES (the stores' folder: optuna.db,
# mlflow.db, the artifacts, results/), WORKERS and THREADS (`dmlbench run --threads`); CHECK, optional: once the
# sweep has finished, each worker goes on with its shard of `dmlbench budget-check --multiple CHECK` (worker i of
# N: --shard i/N) on the same stores, so a session in which the sweep ends does not leave its cores idle; a
# later `start` resumes the check the same way (`run` on a finished sweep only rewrites its tables). A checkpoint is what a
# kill -9 of every worker would leave (`scripts/stores_pack.py checkpoint`); the runner resumes it, and records
# each part's hardware in the manifest.
# `finish` refuses (exit 2, one line) while workers run, the sweep is unfinished or, with CHECK, the budget check
# lacks a final seed, so only a finished run is ever committed; then it copies STORES/results/<protocol> into
# RESULTS/<protocol> (default results/; the saved training states and lock files left out), writes its leaderboard
# and, when protocols/claims/<protocol>.yaml exists, its verdicts, with this checkout's dmlbench (exit: the
# leaderboard's, 1 for a planned cell without a result). The checkpoint folder is then to be removed.
# CHECKPOINTS names another folder than checkpoints/ (the tests'); STAGGER_S (default 60) is the wait between
# two workers' starts, so the first reads the data into the cache alone; NICE (default 19) their niceness.
# Exit: 0 done; 2 bad input (no run.env, a tree at another commit, workers already running for `start`).
set -u
cd "$(dirname "$0")/.."
if [ $# -ne 2 ]; then
    echo "usage: bash scripts/long_run.sh start|checkpoint|stop|status|finish NAME" >&2
    exit 2
fi
action=$1 name=$2
here=$PWD
dir=${CHECKPOINTS:-checkpoints}/$name
[ -f "$dir/run.env" ] || { echo "long_run: $dir/run.env: no such file" >&2; exit 2; }
# shellcheck source=/dev/null
. "$dir/run.env"
for key in PROTOCOL COMMIT TREE STORES WORKERS THREADS; do
    [ -n "${!key:-}" ] || { echo "long_run: $dir/run.env sets no $key" >&2; exit 2; }
done
[ "$TREE" = . ] && TREE=$here
# the data as this checkout finds it, wherever the tree lies (its own ../shared/data may not exist)
if [ -z "${DMLBENCH_DATA:-}" ] && [ -d ../shared/data ]; then
    DMLBENCH_DATA=$(cd ../shared/data && pwd)
    export DMLBENCH_DATA
fi

workers() {  # the pids of this run's workers: their command lines name its Optuna storage (a worker's shell
    # passes its commands as arguments, so it is found too, between the sweep and the check as well)
    pgrep -f -- "dmlbench (run|budget-check) .*--storage sqlite:///$STORES/optuna.db" || true
}

case $action in
start)
    [ -z "$(workers)" ] || { echo "long_run: $name's workers are running already: $(workers | xargs)" >&2; exit 2; }
    if [ ! -d "$TREE" ]; then
        git worktree prune  # a worktree of that path removed by hand is still registered
        git worktree add --detach "$TREE" "$COMMIT" || exit 2
    fi
    at=$(git -C "$TREE" rev-parse HEAD 2>/dev/null)
    case $at in
    "$COMMIT"*) ;;
    *) echo "long_run: $TREE is at ${at:-no commit}, the run's parts all run $COMMIT" >&2; exit 2 ;;
    esac
    if [ ! -x "$TREE/.venv/bin/dmlbench" ]; then
        make -C "$TREE" .venv/.installed || exit 2
    fi
    mkdir -p "$STORES"
    if [ ! -f "$STORES/optuna.db" ] && [ -f "$dir/stores.sha256" ]; then
        python3 scripts/stores_pack.py unpack "$dir" "$STORES" || exit 2
    elif [ -f "$dir/checkpoint.json" ]; then
        # stores left here by an earlier session, while a later one on another machine went on: resuming them
        # and checkpointing would throw that work away
        behind=$(python3 scripts/stores_pack.py behind "$STORES" "$dir") || exit 2
        if [ -n "$behind" ]; then
            echo "long_run: $STORES is behind the checkpoint ($behind): move it away to restore" >&2
            exit 2
        fi
    fi
    stores=(--threads "$THREADS" --quiet --storage "sqlite:///$STORES/optuna.db" --tracking-uri "$STORES/mlflow.db"
        --results-dir "$STORES/results")
    for i in $(seq 1 "$WORKERS"); do
        [ "$i" -eq 1 ] || sleep "${STAGGER_S:-60}"
        run=(.venv/bin/dmlbench run "$PROTOCOL" "${stores[@]}")
        check=()
        [ -z "${CHECK:-}" ] || check=(.venv/bin/dmlbench budget-check "$PROTOCOL" --multiple "$CHECK" --shard "$i/$WORKERS" "${stores[@]}")
        # in a session of its own, so the workers outlive this shell; niced, and so is the session's scheduling
        # group (Linux's autogroup: a process's nice weighs only within its group), so they leave the cores to
        # interactive work and tests; every descriptor away from this shell's, so a caller reading its output is
        # not held till they end. The sweep, then the check: only after a sweep that ended (0, or 1: a cell
        # without a result), never after an interrupted one (130) or an error; the check itself refuses, one
        # line, a sweep another worker has not finished yet.
        (cd "$TREE" && exec setsid bash -c '
            echo "$0" >/proc/self/autogroup 2>/dev/null
            n=$1; shift
            nohup nice -n "$0" "${@:1:n}"; rc=$?
            [ $# -gt "$n" ] && { [ $rc -eq 0 ] || [ $rc -eq 1 ]; } || exit $rc
            exec nohup nice -n "$0" "${@:n+1}"' \
            "${NICE:-19}" "${#run[@]}" "${run[@]}" "${check[@]}") >>"$STORES/w$i.log" 2>&1 </dev/null &
    done
    sleep 2
    echo "long_run: $name: $WORKERS worker(s) started in $TREE ($COMMIT), stores $STORES, logs $STORES/w*.log"
    ;;
checkpoint)
    pause=()
    for pid in $(workers); do pause+=(--pause "$pid"); done
    python3 scripts/stores_pack.py checkpoint "$STORES" "$dir" "${pause[@]}" || exit $?
    echo "long_run: now commit $dir"
    ;;
stop)
    pids=$(workers)
    [ -z "$pids" ] || kill -TERM $pids
    for pid in $pids; do
        while kill -0 "$pid" 2>/dev/null; do sleep 1; done
    done
    echo "long_run: $name: $(echo $pids | wc -w) worker(s) stopped"
    ;;
status)
    echo "long_run: $name: workers $(workers | xargs)"
    python3 scripts/stores_pack.py progress "$STORES"
    ;;
finish)
    [ -z "$(workers)" ] || { echo "long_run: $name's workers are running: stop them, or let them end" >&2; exit 2; }
    from=$(python3 scripts/stores_pack.py finished "$STORES" ${CHECK:+--check "$CHECK"}) || exit 2
    to=${RESULTS:-results}/$(basename "$from")
    rm -rf "$to.new"
    mkdir -p "$to.new"
    # the tables, manifest and per-cell artifacts; not the saved training states (resume/) nor the locks
    tar -C "$from" --exclude=./resume --exclude='*.lock' -cf - . | tar -C "$to.new" -xf - || exit 2
    rm -rf "$to" && mv "$to.new" "$to"
    if [ ! -x .venv/bin/dmlbench ]; then
        make .venv/.installed || exit 2
    fi
    .venv/bin/dmlbench leaderboard "$to" --quiet; rc=$?
    [ "$rc" -le 1 ] || exit "$rc"
    claims=protocols/claims/$(basename "$to").yaml
    if [ -f "$claims" ]; then
        .venv/bin/dmlbench claims "$claims" --results "$to" --quiet || exit $?
    fi
    echo "long_run: $name: the finished run's results are in $to; remove $dir and commit both"
    exit "$rc"
    ;;
*)
    echo "long_run: unknown action $action (start, checkpoint, stop, status, finish)" >&2
    exit 2
    ;;
esac
