"""Exit codes of `fedsynth run`, `fedsynth compare` and `fedsynth status` (docs/reliability.md)."""

EXIT_OK = 0             # every round aggregated, final model finite, results written
EXIT_FAILED = 1         # the run failed: no usable model (never aggregated, non-finite), or an error mid-run
EXIT_BAD_INPUT = 2      # refused before the run: config, data, results folder (in use, would be overwritten), checkpoint
EXIT_FAILED_ROUNDS = 3  # completed and results written, but some rounds had fewer than min-nodes usable replies
