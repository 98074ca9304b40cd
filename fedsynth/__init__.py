"""What drives the apps: the `fedsynth` command, the in-process federation, the loopback deployment and studies.

It also holds the library surface for a Flower developer's own apps: `fedsynth.strategies` (the server
algorithms as Flower strategies) and `fedsynth.client` (the local update rules as plain functions).

`common/` is what the ServerApp and ClientApp share and imports neither app;
this package sits above both and imports them.
"""
