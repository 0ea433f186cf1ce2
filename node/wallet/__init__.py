"""The command-line wallet: ``node wallet`` against a local node's HTTP API."""
