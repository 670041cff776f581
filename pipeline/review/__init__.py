"""Looking at a build: status, plots, inspect, verify --tokens."""
