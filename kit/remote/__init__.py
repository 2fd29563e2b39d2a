"""kit from a laptop: every kit command and the Python API run on a login node through the system's OpenSSH.

The room's parts, bottom up: :mod:`~kit.remote.wire` (the protocol both sides speak), :mod:`~kit.remote.ssh`
(the transport and its masters), :mod:`~kit.remote.client` (the laptop's calls), :mod:`~kit.remote.transfer`
(code and image sent as content-addressed objects), :mod:`~kit.remote.there` (the transport a job there
carries, from Python: one call by name) and :mod:`~kit.remote.server` (kit there: the call looked up in the one
registry, :mod:`kit.job.hosting`, and made through the library as a local call is). Each is imported by name:
a local command pays for none of them (``kit launch`` reads only the protocol's command list).
"""
