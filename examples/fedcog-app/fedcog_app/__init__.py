"""fedcog-app: a Flower app that trains with fedsynth's FedCOG strategy and client function."""
