"""What drives the apps: the `fedsynth` command, the in-process federation, the loopback deployment and studies.

`common/` is what the ServerApp and ClientApp share and imports neither app;
this package sits above both and imports them.
"""
