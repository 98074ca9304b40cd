"""FedAdam (Reddi et al., 2021, "Adaptive Federated Optimization", Algorithm 2) as a fedsynth plugin with its own
settings and its own server state: `algorithm = "fedadam:FEDADAM"` with this folder's parent on the path.

- its settings group (fedadam/settings.py) gives the run-config keys `fedadam.eta`, `fedadam.beta-1`,
  `fedadam.beta-2`, `fedadam.tau` (the server's) and `fedadam.local-lr-scale` (the nodes', in the train message);
- its server state, Adam's moments m and v, is declared (`server_state`), so fedsynth's checkpoint keeps it.

fedsynth ships no FedAdam; tests/test_plugin_own_settings_and_state.py copies this package outside the tree and
runs it in the in-process engine, on a loopback deployment and across a resume.
"""

from fedsynth.algorithm import Algorithm

FEDADAM = Algorithm(strategy="fedadam.server:FedAdam", client="fedadam.client:fedadam_update")
