"""What a run is: its configuration, the task it trains, the uplink as both apps see it, the results folder, tracking and interrupts."""
