"""The command-line wallet: ``node wallet`` against a local node's HTTP API.

* :mod:`~node.wallet.cli` -- the commands (balance, history, transfer, bond, unbond, validator join/leave);
* :mod:`~node.wallet.client` -- the node's API address (from ``node.json``) and token, and the calls.
"""
