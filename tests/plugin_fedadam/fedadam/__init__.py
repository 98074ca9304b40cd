"""FedAdam (Reddi et al., 2021, "Adaptive Federated Optimization", Algorithm 2) as a fedsynth plugin with its own
settings and its own server state: `algorithm = "fedadam:FEDADAM"` with this folder's parent on the path.

- its settings group (fedadam/settings.py) gives the run-config keys `fedadam.eta`, `fedadam.beta-1`,
  `fedadam.beta-2`, `fedadam.tau` (the server's) and `fedadam.local-lr-scale` (the nodes', in the train message);
- its server state, Adam's moments m and v, is declared (`server_state`), so fedsynth's checkpoint keeps it;
- its paper's rule (`PaperRule`), as a built-in row declares one: fedsynth checks it when the run config is parsed
  and `python -m common.run.config_docs --algorithm fedadam:FEDADAM` shows it.

fedsynth ships no FedAdam; tests/test_plugin_own_settings_and_state.py copies this package outside the tree and
runs it in the in-process engine, on a loopback deployment and across a resume.
"""

from fedsynth.algorithm import Algorithm, PaperRule

FEDADAM = Algorithm(
    strategy="fedadam.server:FedAdam", client="fedadam.client:fedadam_update",
    rule=PaperRule("m <- beta-1 m + (1 - beta-1) mean update, v <- beta-2 v + (1 - beta-2) its square; "
                   "w + eta m / (sqrt(v) + tau)", "FedAvg's sample-weighted mean, the paper's Delta_t",
                   "Reddi et al., 2021, Algorithm 2 (no bias correction)"))
