"""Warm ClientApp processes: a SuperNode's `flwr-clientapp` tasks forked from a process that has already imported torch and Flower.

Why: Flower 1.42's SuperExec (`flwr/supercore/superexec/executor/subprocess_executor.py`, used by
`flower-supernode --isolation subprocess` and by a separately started `flower-superexec`) starts every
ClientApp task as a new `flwr-clientapp --runtime-api-address ... --token ...` process, found by name on
`PATH`. Such a process spends ~2.6 s importing torch and Flower before it does any work
(docs/performance.md). Flower offers no flag for another command (it keeps warm executors only for its
Kubernetes executor), so the launcher works through `PATH`:

- `deploy/warm-clientapp/flwr-clientapp` (first on the SuperNode's `PATH`) runs `shim.main`: it hands its
  argv, environment, working directory and its stdin/stdout/stderr file descriptors (SCM_RIGHTS) over a unix
  socket to the warm server, forwards the signals it receives to the task, and ends with the task's exit
  status (a task killed by a signal kills the shim with the same signal). Without a warm server it runs the
  real `flwr-clientapp` itself (exec, one log line) and starts a new warm server for the next task; while
  one is starting (it holds its lock but does not listen yet) the task waits for it.
- `deploy/warm-clientapp/flower-superexec` (the SuperNode starts its SuperExec by that name) starts the warm
  server with the node and then execs Flower's `flower-superexec`, so the first round's tasks are warm too.
- `server.py` is the warm server: it imports torch and Flower's `flwr-clientapp` entry point once (never
  initialising CUDA, and none of the app's modules), then forks one child per task. The child takes the
  shim's file descriptors, environment, working directory and argv, and runs what the `flwr-clientapp`
  console script runs (`flwr.supernode.cli:flwr_clientapp`, through `task.py`, which skips Flower's
  re-extraction of a FAB that is installed already), then exits like an interpreter would (non-daemon threads
  joined, atexit handlers run) with that status.

Why fork per task rather than a long-lived worker: each task is still its own process (a crash, a leak, a
`sys.exit` or a SIGKILL in one cannot touch the next), and the app is imported fresh in each child, from the
FAB that Flower installs for the run: a changed app (new FAB) is picked up by the next task with nothing to
detect. Only modules that do not change per FAB (torch, Flower, numpy) are preloaded.

Lifetimes: one warm server per owner (the SuperExec: the process that started the shim, or that the
`flower-superexec` launcher became; its pid is part of the socket name), in the owner's process group. It
exits when the owner exits (a SuperNode restart gets a new one), on SIGTERM/SIGINT, or when killed; its
children carry PR_SET_PDEATHSIG, so a killed server takes its running tasks with it, and their shims then
kill themselves with SIGKILL, as the task was.

Switch: `FEDSYNTH_WARM_CLIENTAPP=0` in the environment of the SuperNode (or SuperExec) runs every task cold.
Stdlib only at import time: the shim starts in ~20 ms, and both files run by path, without the project
installed (the Docker image ships the repository in /app but installs only its dependencies).
"""
