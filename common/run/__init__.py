"""What a run is: its configuration, the task it trains, the client rule's settings (the uplink codec's among them), the results folder, tracking and interrupts."""
