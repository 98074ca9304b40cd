"""`fedsynth monitor RESULTS_DIR`: a read-only live page and Prometheus `/metrics` for runs and studies.

The monitor reads only what a run already writes into its results folder (`config.json`, `metrics.jsonl`,
`nodes.json`, `summary.json`; a study's `ledger.jsonl`, `claims/` and `report.md`) and writes nothing, so it can
run beside a run on the SuperLink host. `files` reads those files safely (no symlink followed, sizes bounded, a
half-written line skipped), `views` turns them into what the page shows, `prometheus` into Prometheus' metrics,
and `server` serves both on fixed routes (docs/deployment.md, "Watching a federation").
"""
