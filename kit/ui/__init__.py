"""`kit ui`: a read-only page of the jobs, served on loopback by kit (:mod:`kit.ui.server`), its HTML from
:mod:`kit.ui.page` — no script, nothing from anywhere else."""
