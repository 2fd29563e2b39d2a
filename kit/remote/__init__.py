"""kit from a laptop: every kit command and the Python API run on a login node through the system's OpenSSH.

The room's parts, bottom up: :mod:`~kit.remote.wire` (the protocol both sides speak), :mod:`~kit.remote.ssh`
(the transport and its masters), :mod:`~kit.remote.client` (the laptop's calls), :mod:`~kit.remote.transfer`
(code and image sent as content-addressed objects), :mod:`~kit.remote.hosted` (jobs there, from Python) and
:mod:`~kit.remote.server` (kit there: the same library calls a local command makes). Each is imported by name:
a local command pays for none of them (``kit launch`` reads only the protocol's command list).
"""
