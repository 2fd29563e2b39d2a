"""``--notify``: a job's events sent where its user looks, each exactly once across requeues and restarts.

:mod:`kit.core.notify` parses and shows the targets (the job model checks them); :mod:`kit.notify.send` says one
event to one target; :mod:`kit.notify.deliver` keeps the job's ledger of what was sent and sends what is not yet
(prelaunch's watcher and its last word, and the first kit command that sees a job end its batch script never told).
"""
