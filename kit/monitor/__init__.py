"""kit's Prometheus exporter: GPU (NVML), node (psutil) and training metrics.

One collector per source (:mod:`kit.monitor.gpu`, :mod:`kit.monitor.node`,
:mod:`kit.monitor.training`); a background poller reads the sources at an
interval and scrapes serve the cached values, so a slow driver call never
stalls a scrape. Every source reports its own success and duration. Nothing
registers itself at import time; :mod:`kit.monitor.exporter` wires it up.
"""
