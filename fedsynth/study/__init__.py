"""`fedsynth study`: the study tool, which tests a paper's claims with paired confidence intervals.

A study file (studyfile) names arms, variants, seeds and claims; the runner (runner) tunes each
arm on tuning seeds and runs the report seeds, each run in a worker process (worker), recorded
in the ledger (ledger) and scored (scores); plan reads what is left and what tuning chose,
reuse takes another study's finished runs, claims lets several processes share one folder,
sharpness measures final models, statistics, report and figure turn the ledger into verdicts
and claim figures, and cli is the subcommand.
"""
