"""The model zoo: SPEC 3.3's classifiers, a user's own factory, and the diffusion task's U-Nets, schedule and samplers."""
